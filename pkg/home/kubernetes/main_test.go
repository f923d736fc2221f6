//go:build !integration

package kubernetes_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind. The integration
// build has its own TestMain (main_integration_test.go), without the check,
// since client-go keeps connection goroutines that outlive a test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

//go:build !integration

package pool

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: no watch, no
// attempt, no connection of a closed Pool. The integration build has its
// own TestMain (main_integration_test.go), without the check, since
// client-go keeps connection goroutines that outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

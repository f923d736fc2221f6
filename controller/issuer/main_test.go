//go:build !integration

package issuer

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the unit tests leave no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

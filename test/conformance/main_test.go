//go:build !integration

package conformance

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain removes the C counter's build and checks that no test left a
// goroutine behind. The integration build has its own TestMain, without
// the check (client-go keeps connection goroutines).
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

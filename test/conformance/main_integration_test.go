//go:build integration

package conformance

import (
	"os"
	"testing"

	"fiberd.io/fiberd/test/kubeapi"
)

// TestMain runs the suite with a shared control plane (started by the
// first test that needs one, stopped after the last) and removes the C
// counter's build. goleak is not run here: client-go keeps connection
// goroutines that outlive each test.
func TestMain(m *testing.M) {
	code := kubeapi.Main(m)
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

//go:build integration

package main

import (
	"os"
	"testing"

	"fiberd.io/fiberd/test/kubeapi"
)

// TestMain turns the test binary into the controller process when the smoke test starts it so
// (FIBERD_SCALE_CONTROLLER set), and otherwise runs the tests. goleak is not run under the
// integration tag, since client-go keeps connection goroutines; the unit tests keep it.
func TestMain(m *testing.M) {
	runChildIfAsked()
	os.Exit(kubeapi.Main(m))
}

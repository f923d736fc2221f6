//go:build integration

package kubernetes

import (
	"os"
	"testing"

	"fiberd.io/fiberd/test/kubeapi"
)

// TestMain starts no control plane itself: the first test that needs one does (kubeapi.Shared),
// and kubeapi.Main stops it after the last. Under the integration tag goleak is not run, since
// client-go keeps connection goroutines that outlive each test; the unit tests (built without the
// tag) keep their leak check.
func TestMain(m *testing.M) { os.Exit(kubeapi.Main(m)) }

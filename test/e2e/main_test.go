//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"fiberd.io/fiberd/test/kubeapi"
)

func TestMain(m *testing.M) {
	code := kubeapi.Main(m)
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

var lastIP atomic.Int32

// nextPodIP is a fresh 127.0.0.x for a grant Pod, so fibers of different tests never share an
// address.
func nextPodIP() string {
	return fmt.Sprintf("127.0.0.%d", 10+lastIP.Add(1))
}

package backendtest

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"fiberd.io/fiberd/pkg/backend"
)

// CRIU returns the CRIU a test of the real CHECKPOINT tier runs:
// $FIBERD_CRIU, else backend.DefaultCRIUPath (where hack/criu.sh, `make
// criu`, installs it). It skips the test, naming what is missing, when
// there is no executable there, the host is not Linux, or the test is not
// root (CRIU dumps and restores processes); with FIBERD_CRIU_REQUIRED set
// (CI) it fails the test instead.
func CRIU(tb testing.TB) string {
	tb.Helper()
	miss := func(format string, a ...any) {
		tb.Helper()
		msg := fmt.Sprintf(format, a...)
		if os.Getenv("FIBERD_CRIU_REQUIRED") != "" {
			tb.Fatal(msg + " (FIBERD_CRIU_REQUIRED is set)")
		}
		tb.Skip(msg)
	}
	if runtime.GOOS != "linux" {
		miss("parking runs on Linux only")
	}
	path := os.Getenv("FIBERD_CRIU")
	if path == "" {
		path = backend.DefaultCRIUPath()
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		miss("criu not found at %q (%v): build it with hack/criu.sh (make criu), or set FIBERD_CRIU", path, err)
	}
	if os.Geteuid() != 0 {
		miss("parking needs root (CRIU dumps and restores processes)")
	}
	return path
}

package backend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// TestExecFibersLog: what exec fibers write goes to RunDir/fibers.log, cut
// at Config.LogMaxBytes with one marker line; warming the grant again keeps
// the previous log as fibers.log.1.
func TestExecFibersLog(t *testing.T) {
	cfg := testConfig()
	cfg.LogMaxBytes = 64
	b, err := NewExec(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	uid := uidFor(t)
	runDir := t.TempDir()
	req := WarmRequest{
		Grant:  core.Grant{UID: uid},
		Spec:   template.Spec{Command: "/bin/sh", Args: []string{"-c", `echo "out $FIBERD_FENCE"; printf '%0200d\n' 0 >&2`}},
		RunDir: runDir,
	}
	logPath := filepath.Join(runDir, "fibers.log")
	for round := range 2 {
		if err := b.Warm(ctxT(t), req); err != nil {
			t.Fatal(err)
		}
		f := fence(uid, uint64(round))
		if _, err := b.Clone(ctxT(t), CloneRequest{Fence: f, Listener: listen(t, false).file}); err != nil {
			t.Fatal(err)
		}
		if x := nextExit(t, b); x.Fence != f || x.Reason != (ExitReason{}) {
			t.Fatalf("exit %+v, want %s with exit:0", x, f)
		}
		if err := b.Stop(ctxT(t), uid); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		kept, marker, ok := strings.Cut(string(got), "\n[fiberd: log reached 64 bytes; further output dropped]\n")
		if !ok || marker != "" || len(kept) != 64 || !strings.HasPrefix(kept, "out "+f.String()+"\n") {
			t.Fatalf("round %d: fibers.log = %q, want the fiber's first 64 bytes, starting with its stdout, then the marker", round, got)
		}
		if round == 1 {
			prev, err := os.ReadFile(logPath + ".1")
			if err != nil || !strings.HasPrefix(string(prev), "out "+fence(uid, 0).String()+"\n") {
				t.Fatalf("fibers.log.1 = %q, %v: want the first round's log", prev, err)
			}
		}
	}
	noStrays(t, uid)
}

package backend

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
)

// TestFiberOrphansReaped runs as a child subreaper, as fiberd does (PID 1
// of a grant Pod, or marked one at start-up on a host). A fiber that starts
// a process of its own and ends before it leaves an orphan; the SDKs make
// the zygote a child subreaper, so the orphan is reparented to the zygote,
// which reaps it, rather than to fiberd, which reaps only the pids it knows
// and would keep it as a zombie. Both counters answer GET /orphan by
// forking a sleeping child and exiting 0: with the child in the fiber's
// process group, which the backend kills once the fiber has ended, and
// (/orphan/pgrp) in a group of its own, which lives on until it is killed
// here. Either way the orphan must end up gone, not a zombie.
func TestFiberOrphansReaped(t *testing.T) {
	if !inSubreaper(t) {
		return
	}
	self := os.Getpid()
	for _, k := range []kind{kindC, kindPython} {
		for _, tt := range []struct {
			name string
			path string
		}{
			{"in the fiber's group", "/orphan"},
			{"own group", "/orphan/pgrp"},
		} {
			t.Run(k.name+"/"+tt.name, func(t *testing.T) {
				b := newBackend(t, core.TierWarm)
				uid := uidFor(t)
				warm(t, b, uid, k.spec(t), "")
				zpid := zygotePID(t, uid)
				ctx := ctxT(t)
				ep := listen(t, false)
				f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
				if err != nil {
					t.Fatalf("Clone: %v", err)
				}
				body, err := get(ep, tt.path)
				if err != nil {
					t.Fatalf("GET %s: %v", tt.path, err)
				}
				opid, err := strconv.Atoi(fields(body)["orphan"])
				if err != nil || opid <= 0 {
					t.Fatalf("GET %s answered %q, want orphan=<pid>", tt.path, body)
				}
				// A pidfd names the orphan for good, so the clean-up
				// below never signals a reused pid.
				if pfd, err := unix.PidfdOpen(opid, 0); err == nil {
					t.Cleanup(func() {
						_ = unix.PidfdSendSignal(pfd, unix.SIGKILL, nil, 0)
						_ = unix.Close(pfd)
					})
				}

				// Until the fiber ends the orphan is the fiber's child;
				// then its parent must be the zygote, never this process.
				sawZygote := false
				checkParent := func() (gone bool) {
					st, ppid, ok := procStat(opid)
					switch {
					case !ok:
						return true
					case ppid == zpid:
						sawZygote = true
					case ppid != f.PID:
						t.Fatalf("orphan %d (state %c) has parent %d, want the zygote %d (this process is %d)", opid, st, ppid, zpid, self)
					}
					return false
				}
				if tt.path == "/orphan" {
					// The backend kills the fiber's group right after
					// the fiber ends, so the orphan may be gone before
					// its new parent can be seen: watch it closely.
					deadline := time.Now().Add(10 * time.Second)
					for !checkParent() && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
					}
				}
				e := nextExit(t, b)
				if e.Fence != f.Fence || e.Reason != (ExitReason{}) {
					t.Fatalf("exit = %+v, want fiber %s with exit:0", e, f.Fence)
				}
				if tt.path == "/orphan/pgrp" {
					// The fiber has been reaped, so the orphan has been
					// reparented, and nothing has killed it.
					if checkParent() {
						t.Fatalf("orphan %d is gone before it was killed", opid)
					}
					if !sawZygote {
						t.Fatalf("orphan %d is still the child of the ended fiber %d", opid, f.PID)
					}
					if err := unix.Kill(opid, unix.SIGKILL); err != nil {
						t.Fatal(err)
					}
				}
				t.Logf("orphan %d seen as the zygote's child: %v", opid, sawZygote)
				orphanGone(t, opid, 10*time.Second)

				if err := b.Stop(ctx, uid); err != nil {
					t.Fatalf("Stop: %v", err)
				}
				orphanGone(t, opid, 10*time.Second)
				if zs := zombieChildren(); len(zs) > 0 {
					t.Errorf("zombie children of this process remain: %v", zs)
				}
				noStrays(t, uid)
			})
		}
	}
}

// orphanGone fails t unless pid, neither running nor a zombie, has left
// /proc within d.
func orphanGone(t *testing.T, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, _, ok := procStat(pid); !ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, ppid, _ := procStat(pid)
	t.Fatalf("orphan %d still exists after %v: state %c, parent %d (%s)", pid, d, st, ppid, whose(ppid))
}

// whose names a parent pid for failure messages.
func whose(ppid int) string {
	if ppid == os.Getpid() {
		return "this process, the subreaper fiberd stands for"
	}
	return fmt.Sprintf("process %d", ppid)
}

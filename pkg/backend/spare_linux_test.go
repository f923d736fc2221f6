package backend

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"
)

// spareKinds are the templates whose SDK hands spares over.
var spareKinds = []kind{kindC, kindPython}

// eventually polls cond for up to 30s.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("not within 30s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newProc(tb testing.TB) *Proc {
	tb.Helper()
	return newBackend(tb, core.TierWarm).(*Proc)
}

// readySpares waits until uid has n spares waiting and returns their pids.
func readySpares(tb testing.TB, p *Proc, uid string, n int) []int {
	tb.Helper()
	eventually(tb, strconv.Itoa(n)+" spares ready", func() bool {
		st := p.Spares(uid)
		return st.Ready == n && len(p.SparePIDs(uid)) == n
	})
	return p.SparePIDs(uid)
}

// cloneServes clones f on b to a new unix listener and fails t unless the
// fiber answers a GET with its fence; what names the fiber in the failure.
func cloneServes(t *testing.T, b Backend, f core.Fence, what string) Fiber {
	t.Helper()
	ep := listen(t, true)
	fb, err := b.Clone(ctxT(t), CloneRequest{Fence: f, Listener: ep.file})
	if err != nil {
		t.Fatalf("%s: Clone: %v", what, err)
	}
	if body, err := get(ep, "/"); err != nil || fields(body)["fence"] != fb.Fence.String() {
		t.Fatalf("%s answers %q, %v", what, body, err)
	}
	return fb
}

// TestSpareTakeAndReplace checks that with spares a Clone hands a spare
// the fiber (its pid is a spare's, it serves its own fence, payload and
// cgroup leaf), that the spare is replaced, that spares are not fibers
// (no Exit for them, Kill does not know them) and that they end with Stop.
func TestSpareTakeAndReplace(t *testing.T) {
	for _, k := range spareKinds {
		t.Run(k.name, func(t *testing.T) {
			p := newProc(t)
			uid := uidFor(t)
			tree, _ := cgroupRoot(t)
			g, err := tree.Grant(uid)
			if err != nil {
				t.Fatal(err)
			}
			warm(t, p, uid, k.spec(t), g.Dir.Path())
			if st := p.Spares(uid); !st.Supported || st.Ready != 0 {
				t.Fatalf("Spares after Warm = %+v, want supported and none (W is 0 until SetSpares)", st)
			}
			p.SetSpares(uid, 2, 10)
			before := readySpares(t, p, uid, 2)
			ctx := ctxT(t)
			ep := listen(t, false)
			l, err := g.Fiber(1, 1)
			if err != nil {
				t.Fatal(err)
			}
			leaf := l.Path()
			f, err := p.Clone(ctx, CloneRequest{Fence: fence(uid, 1), Listener: ep.file, Leaf: leaf, Payload: []byte("hi")})
			if err != nil {
				t.Fatalf("Clone: %v", err)
			}
			if !slices.Contains(before, f.PID) {
				t.Fatalf("Clone's pid %d is not one of the spares %v: it forked", f.PID, before)
			}
			body, err := get(ep, "/")
			if err != nil {
				t.Fatal(err)
			}
			m := fields(body)
			// count 1: what a spare rehearsed before (the Python counter's
			// on_spare) is not the fiber's.
			if m["fence"] != fence(uid, 1).String() || m["payload"] != hex.EncodeToString([]byte("hi")) || m["pid"] != strconv.Itoa(f.PID) || m["count"] != "1" {
				t.Fatalf("the taken spare serves %q", body)
			}
			if filepath.Base(m["cgroup"]) != filepath.Base(leaf) {
				t.Fatalf("the taken spare runs in cgroup %q, want its leaf %s", m["cgroup"], leaf)
			}
			// A second take, with no payload: what the spare rehearsed
			// (the SDK sets the fiber's environment on placeholders) is
			// not the fiber's either.
			before2 := readySpares(t, p, uid, 2)
			ep2 := listen(t, true)
			f2, err := p.Clone(ctx, CloneRequest{Fence: fence(uid, 2), Listener: ep2.file})
			if err != nil {
				t.Fatalf("Clone: %v", err)
			}
			if !slices.Contains(before2, f2.PID) {
				t.Fatalf("the second Clone's pid %d is not one of the spares %v: it forked", f2.PID, before2)
			}
			body, err = get(ep2, "/")
			if err != nil {
				t.Fatal(err)
			}
			if m := fields(body); m["fence"] != fence(uid, 2).String() || m["payload"] != "-" || m["pid"] != strconv.Itoa(f2.PID) || m["count"] != "1" {
				t.Fatalf("the second taken spare serves %q", body)
			}
			if err := p.Kill(ctx, f2.Fence); err != nil {
				t.Fatal(err)
			}
			if e := nextExit(t, p); e.Fence != f2.Fence {
				t.Fatalf("exit = %+v, want the second taken fiber's", e)
			}
			after := readySpares(t, p, uid, 2)
			if slices.Contains(after, f.PID) || slices.Contains(after, f2.PID) {
				t.Fatalf("spares %v still list the taken one %d", after, f.PID)
			}
			if st := p.Spares(uid); st.Taken != 2 {
				t.Fatalf("Spares = %+v, want Taken 2", st)
			}
			if err := p.Kill(ctx, core.Fence{GrantUID: uid, Epoch: 1, Seq: 99}); err == nil {
				t.Fatal("Kill of a fence never cloned succeeded")
			}
			if err := p.Kill(ctx, f.Fence); err != nil {
				t.Fatal(err)
			}
			if e := nextExit(t, p); e.Fence != f.Fence || !e.Reason.Killed {
				t.Fatalf("exit = %+v, want the taken fiber's, killed", e)
			}
			if err := p.Stop(ctx, uid); err != nil {
				t.Fatal(err)
			}
			for _, pid := range after {
				waitGone(t, pid)
			}
			select {
			case e := <-p.Exits():
				t.Fatalf("an Exit after Stop with spares only: %+v", e)
			case <-time.After(200 * time.Millisecond):
			}
			noStrays(t, uid)
		})
	}
}

// TestSpareDies checks that a spare killed while waiting is replaced and
// is not reported as a fiber's exit.
func TestSpareDies(t *testing.T) {
	for _, k := range spareKinds {
		t.Run(k.name, func(t *testing.T) {
			p := newProc(t)
			uid := uidFor(t)
			warm(t, p, uid, k.spec(t), "")
			p.SetSpares(uid, 1, 4)
			pids := readySpares(t, p, uid, 1)
			if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitGone(t, pids[0])
			eventually(t, "a new spare", func() bool {
				now := p.SparePIDs(uid)
				return len(now) == 1 && now[0] != pids[0]
			})
			select {
			case e := <-p.Exits():
				t.Fatalf("an Exit for a spare: %+v", e)
			default:
			}
			cloneServes(t, p, fence(uid, 1), "fiber after a spare's death")
		})
	}
}

// TestSpareBounds checks min(W, max - running): spares shrink as fibers
// run, SetSpares with W 0 ends them all, and a renewal's larger W forks
// more.
func TestSpareBounds(t *testing.T) {
	p := newProc(t)
	uid := uidFor(t)
	warm(t, p, uid, kindC.spec(t), "")
	p.SetSpares(uid, 3, 4)
	first := readySpares(t, p, uid, 3)
	ctx := ctxT(t)
	for i := 1; i <= 2; i++ {
		ep := listen(t, true)
		f, err := p.Clone(ctx, CloneRequest{Fence: fence(uid, uint64(i)), Listener: ep.file})
		if err != nil {
			t.Fatal(err)
		}
		first = slices.DeleteFunc(first, func(pid int) bool { return pid == f.PID })
	}
	readySpares(t, p, uid, 2) // max 4 - 2 running
	if st := p.Spares(uid); st.Want != 2 {
		t.Fatalf("Spares = %+v, want Want 2", st)
	}
	p.SetSpares(uid, 0, 4)
	readySpares(t, p, uid, 0)
	for _, pid := range first {
		waitGone(t, pid)
	}
	p.SetSpares(uid, 8, 10)
	readySpares(t, p, uid, 8)
}

// TestSpareRenew checks that RenewSpares (an epoch bump) ends every
// waiting spare and forks new ones.
func TestSpareRenew(t *testing.T) {
	p := newProc(t)
	uid := uidFor(t)
	warm(t, p, uid, kindC.spec(t), "")
	p.SetSpares(uid, 2, 4)
	old := readySpares(t, p, uid, 2)
	p.RenewSpares(uid)
	for _, pid := range old {
		waitGone(t, pid)
	}
	now := readySpares(t, p, uid, 2)
	for _, pid := range now {
		if slices.Contains(old, pid) {
			t.Fatalf("spare %d outlived RenewSpares", pid)
		}
	}
}

// TestSparesDieWithZygote checks that a zygote's death takes its spares,
// and that the zygote warmed again forks new ones.
func TestSparesDieWithZygote(t *testing.T) {
	p := newProc(t)
	uid := uidFor(t)
	warm(t, p, uid, kindC.spec(t), "")
	p.SetSpares(uid, 2, 4)
	old := readySpares(t, p, uid, 2)
	if err := syscall.Kill(zygotePIDOf(t, uid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if e := nextExit(t, p); !e.Template {
		t.Fatalf("exit = %+v, want the template's", e)
	}
	for _, pid := range old {
		waitGone(t, pid)
	}
	if st := p.Spares(uid); st.Ready != 0 {
		t.Fatalf("Spares of a cold grant = %+v", st)
	}
	warm(t, p, uid, kindC.spec(t), "")
	p.SetSpares(uid, 2, 4)
	readySpares(t, p, uid, 2)
}

// TestNoHandOver checks that a zygote written from the protocol without
// spares (it says a bare READY) is served by fork as before, whatever W.
func TestNoHandOver(t *testing.T) {
	py := python(t)
	p := newProc(t)
	uid := uidFor(t)
	warm(t, p, uid, template.Spec{Command: py, Args: []string{"-u", abs(t, "testdata/plainzygote.py")}, Zygote: true}, "")
	p.SetSpares(uid, 4, 8)
	if st := p.Spares(uid); st.Supported || st.Want != 0 {
		t.Fatalf("Spares = %+v, want unsupported", st)
	}
	ctx := ctxT(t)
	for i := 1; i <= 3; i++ {
		ep := listen(t, i%2 == 0)
		f, err := p.Clone(ctx, CloneRequest{Fence: fence(uid, uint64(i)), Listener: ep.file, Payload: []byte{byte(i)}})
		if err != nil {
			t.Fatalf("Clone %d: %v", i, err)
		}
		body, err := get(ep, "/")
		if err != nil || fields(body)["fence"] != f.Fence.String() || fields(body)["payload"] != hex.EncodeToString([]byte{byte(i)}) {
			t.Fatalf("fiber %d answers %q, %v", i, body, err)
		}
	}
	if st := p.Spares(uid); st.Ready != 0 || st.Taken != 0 {
		t.Fatalf("Spares = %+v, want none", st)
	}
}

// TestDocSpares checks that a zygote written from docs/templates.md
// without the SDK (testdata/plainzygote.py --spares: no pidfd, no
// isolation) hands spares over: the Clone's fiber is a spare, serves its
// own fence and payload, and is replaced.
func TestDocSpares(t *testing.T) {
	py := python(t)
	p := newProc(t)
	uid := uidFor(t)
	warm(t, p, uid, template.Spec{Command: py, Args: []string{"-u", abs(t, "testdata/plainzygote.py"), "--spares"}, Zygote: true}, "")
	p.SetSpares(uid, 2, 8)
	before := readySpares(t, p, uid, 2)
	ctx := ctxT(t)
	for i := 1; i <= 3; i++ {
		ep := listen(t, i%2 == 0)
		f, err := p.Clone(ctx, CloneRequest{Fence: fence(uid, uint64(i)), Listener: ep.file, Payload: []byte{byte(i)}})
		if err != nil {
			t.Fatalf("Clone %d: %v", i, err)
		}
		if i == 1 && !slices.Contains(before, f.PID) {
			t.Fatalf("Clone's pid %d is none of the spares %v", f.PID, before)
		}
		body, err := get(ep, "/")
		m := fields(body)
		if err != nil || m["fence"] != f.Fence.String() || m["payload"] != hex.EncodeToString([]byte{byte(i)}) || m["pid"] != strconv.Itoa(f.PID) {
			t.Fatalf("fiber %d answers %q, %v", i, body, err)
		}
		readySpares(t, p, uid, 2)
	}
	if st := p.Spares(uid); st.Taken != 3 {
		t.Fatalf("Spares = %+v, want 3 taken", st)
	}
	if err := p.Kill(ctx, fence(uid, 2)); err != nil {
		t.Fatal(err)
	}
	if e := nextExit(t, p); e.Fence != fence(uid, 2) || !e.Reason.Killed {
		t.Fatalf("exit = %+v", e)
	}
}

// TestSparesRunOut checks that Clones coming faster than spares are forked
// all get a fiber of their own, whether a spare (waited for or ready) or a
// fork, and that the spares are back afterwards.
func TestSparesRunOut(t *testing.T) {
	for _, k := range spareKinds {
		t.Run(k.name, func(t *testing.T) {
			p := newProc(t)
			uid := uidFor(t)
			warm(t, p, uid, k.spec(t), "")
			p.SetSpares(uid, 2, 64)
			readySpares(t, p, uid, 2)
			ctx := ctxT(t)
			const n = 16
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := 1; i <= n; i++ {
				ep := listen(t, i%2 == 0)
				wg.Add(1)
				go func() {
					defer wg.Done()
					f, err := p.Clone(ctx, CloneRequest{Fence: fence(uid, uint64(i)), Listener: ep.file, Payload: []byte{byte(i)}})
					if err != nil {
						errs <- err
						return
					}
					body, err := get(ep, "/")
					m := fields(body)
					if err != nil || m["fence"] != f.Fence.String() || m["pid"] != strconv.Itoa(f.PID) || m["payload"] != hex.EncodeToString([]byte{byte(i)}) {
						errs <- fmt.Errorf("fiber %d answers %q, %v", i, body, err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			readySpares(t, p, uid, 2)
			if st := p.Spares(uid); st.Taken < 2 {
				t.Fatalf("Spares = %+v, want at least the 2 ready ones taken", st)
			}
		})
	}
}

// TestSparesGiveUp checks that spares that keep dying (here: their
// rehearsal fails, in each SDK) are replaced only maxSpareFailures times in
// a row, that the grant then reports Failed and Clones fork, and that
// SetSpares tries again.
func TestSparesGiveUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec func(t *testing.T) template.Spec
	}{
		{"c", func(t *testing.T) template.Spec {
			return template.Spec{Command: failingSpareC(t), Zygote: true}
		}},
		{"python", func(t *testing.T) template.Spec {
			return template.Spec{Command: python(t), Args: []string{"-u", abs(t, "testdata/failingspare.py")},
				Env: map[string]string{"PYTHONPATH": abs(t, "../../sdk/zygote/python")}, Zygote: true}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProc(t)
			uid := uidFor(t)
			warm(t, p, uid, tc.spec(t), "")
			p.SetSpares(uid, 2, 8)
			eventually(t, "spares given up", func() bool { st := p.Spares(uid); return st.Failed && st.Want == 0 && st.Ready == 0 })
			if st := p.Spares(uid); !st.Supported || st.Taken != 0 {
				t.Fatalf("Spares = %+v", st)
			}
			cloneServes(t, p, fence(uid, 1), "forked fiber")
			p.SetSpares(uid, 2, 8)
			if st := p.Spares(uid); st.Failed {
				t.Fatalf("Spares after SetSpares = %+v, want the failures forgotten", st)
			}
			eventually(t, "spares given up again", func() bool { return p.Spares(uid).Failed })
		})
	}
}

// TestSparesRecorded checks that every waiting spare has a process record
// (so the sweep after a crash of fiberd finds it), that the spare a Clone
// takes keeps its record as the fiber's until the fiber ends, and that
// Stop leaves no record of a spare.
func TestSparesRecorded(t *testing.T) {
	p := newProc(t)
	recs, err := procrec.Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	uid := uidFor(t)
	if err := p.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid, Template: testTemplate}, Spec: kindC.spec(t), RunDir: t.TempDir(), Records: recs}); err != nil {
		t.Fatal(err)
	}
	recorded := func() map[int]bool {
		out := map[int]bool{}
		ents, _ := os.ReadDir(recs.Path())
		for _, e := range ents {
			var pid int
			var start uint64
			if n, _ := fmt.Sscanf(e.Name(), "p-%d-%d", &pid, &start); n == 2 {
				out[pid] = true
			}
		}
		return out
	}
	p.SetSpares(uid, 2, 10)
	spares := readySpares(t, p, uid, 2)
	for _, pid := range spares {
		if !recorded()[pid] {
			t.Fatalf("spare %d has no record (records: %v)", pid, recorded())
		}
	}
	ep := listen(t, true)
	f, err := p.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spares, f.PID) {
		t.Fatalf("Clone's pid %d is not one of the spares %v", f.PID, spares)
	}
	if _, err := get(ep, "/"); err != nil {
		t.Fatal(err)
	}
	if !recorded()[f.PID] {
		t.Fatalf("the taken spare %d lost its record", f.PID)
	}
	if err := p.Kill(ctxT(t), f.Fence); err != nil {
		t.Fatal(err)
	}
	if e := nextExit(t, p); e.Fence != f.Fence {
		t.Fatalf("exit = %+v, want the taken fiber's", e)
	}
	if recorded()[f.PID] {
		t.Fatalf("the ended fiber %d is still recorded", f.PID)
	}
	after := readySpares(t, p, uid, 2)
	if err := p.Stop(ctxT(t), uid); err != nil {
		t.Fatal(err)
	}
	for _, pid := range after {
		waitGone(t, pid)
	}
	eventually(t, "no spare recorded after Stop", func() bool {
		r := recorded()
		for _, pid := range append(after, spares...) {
			if r[pid] {
				return false
			}
		}
		return true
	})
}

package backend

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
)

// cgroupRoot makes a cgroup v2 directory for the test under the cgroup2
// mount, named after the test, and removes it afterwards. It skips, saying
// why, where cgroup v2 is absent or not writable.
func cgroupRoot(t *testing.T) (tree *cgroup.Tree, mount string) {
	t.Helper()
	mount, err := cgroup.Mount()
	if err != nil {
		t.Skipf("cgroup v2 is not mounted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mount, "cgroup.procs")); err != nil {
		t.Skipf("cgroup v2 mount %s is not usable: %v", mount, err)
	}
	dir := filepath.Join(mount, "fiberd-test-"+uidFor(t))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		t.Skipf("cgroup v2 at %s is not writable (need root and a delegated cgroup): %v", mount, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		os.Remove(dir)
		t.Skipf("cgroup.kill is missing at %s (kernel older than 5.14)", dir)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cgroup.At(dir).Destroy(ctx); err != nil {
			t.Errorf("removing test cgroup %s: %v", dir, err)
		}
	})
	tree, err = cgroup.NewTree(cgroup.Config{Root: dir, Logger: quiet})
	if err != nil {
		t.Fatalf("NewTree(%s): %v", dir, err)
	}
	return tree, mount
}

// ownCgroup is the cgroup v2 path of pid relative to the mount.
func ownCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p
		}
	}
	t.Fatalf("pid %d has no cgroup v2 line in %q", pid, b)
	return ""
}

func gone(path string) bool {
	_, err := os.Stat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// TestCgroupLeaves checks that the zygote runs in <grant>/zygote, that each
// fiber is in its leaf before its user code runs (the counter reads its
// cgroup first thing and reports it), and that release, a crash and Stop
// kill and remove the leaves.
func TestCgroupLeaves(t *testing.T) {
	for _, im := range impls[:3] {
		t.Run(im.name, func(t *testing.T) {
			tree, mount := cgroupRoot(t)
			rel := func(p string) string { return strings.TrimPrefix(p, mount) }
			b := newBackend(t, im.tier)
			uid := uidFor(t)
			g, err := tree.Grant(uid)
			if err != nil {
				t.Fatal(err)
			}
			warm(t, b, uid, im.kind.spec(t), g.Dir.Path())
			if im.tier == core.TierWarm {
				if got := ownCgroup(t, zygotePID(t, uid)); got != rel(g.Zygote.Path()) {
					t.Fatalf("zygote runs in %q, want %q", got, rel(g.Zygote.Path()))
				}
			}
			ctx := ctxT(t)
			var (
				fibers []Fiber
				eps    []endpoint
				leaves []cgroup.Leaf
			)
			for i := uint64(1); i <= 3; i++ {
				leaf, err := g.Fiber(1, i)
				if err != nil {
					t.Fatal(err)
				}
				ep := listen(t, i != 2)
				f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, i), Listener: ep.file, Leaf: leaf.Path()})
				if err != nil {
					t.Fatalf("Clone %d: %v", i, err)
				}
				procs, err := leaf.Procs()
				if err != nil || !slices.Contains(procs, f.PID) {
					t.Fatalf("leaf %s holds %v (%v), want fiber pid %d", leaf, procs, err, f.PID)
				}
				body, err := get(ep, "/")
				if err != nil {
					t.Fatal(err)
				}
				if got := fields(body)["cgroup"]; got != rel(leaf.Path()) {
					t.Fatalf("fiber %d started its user code in cgroup %q, want its leaf %q", i, got, rel(leaf.Path()))
				}
				fibers, eps, leaves = append(fibers, f), append(eps, ep), append(leaves, leaf)
			}

			if err := b.Kill(ctx, fibers[0].Fence); err != nil {
				t.Fatal(err)
			}
			if e := nextExit(t, b); e.Fence != fibers[0].Fence || !e.Reason.Killed {
				t.Fatalf("exit = %+v", e)
			}
			if !gone(leaves[0].Path()) {
				t.Fatalf("leaf %s of a released fiber still exists", leaves[0])
			}
			waitGone(t, fibers[0].PID)

			_, _ = get(eps[1], "/crash")
			if e := nextExit(t, b); e.Fence != fibers[1].Fence || e.Reason.Signal != "SIGABRT" {
				t.Fatalf("exit = %+v", e)
			}
			if !gone(leaves[1].Path()) {
				t.Fatalf("leaf %s of a crashed fiber still exists", leaves[1])
			}

			if err := b.Stop(ctx, uid); err != nil {
				t.Fatal(err)
			}
			if e := nextExit(t, b); e.Fence != fibers[2].Fence || !e.Reason.Killed {
				t.Fatalf("exit = %+v", e)
			}
			if !gone(leaves[2].Path()) {
				t.Fatalf("leaf %s still exists after Stop", leaves[2])
			}
			if im.tier == core.TierWarm && !gone(g.Zygote.Path()) {
				t.Fatalf("zygote leaf %s still exists after Stop", g.Zygote)
			}
			if err := g.Remove(ctx); err != nil {
				t.Fatalf("grant cgroup not removable after Stop: %v", err)
			}
			noStrays(t, uid)
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestCgroupZygoteDies checks that when the zygote dies its fibers' leaves
// are killed and removed, and so is the zygote's leaf.
func TestCgroupZygoteDies(t *testing.T) {
	tree, _ := cgroupRoot(t)
	b := newBackend(t, core.TierWarm)
	uid := uidFor(t)
	g, err := tree.Grant(uid)
	if err != nil {
		t.Fatal(err)
	}
	warm(t, b, uid, kindC.spec(t), g.Dir.Path())
	ctx := ctxT(t)
	var leaves []cgroup.Leaf
	for i := uint64(1); i <= 2; i++ {
		leaf, err := g.Fiber(1, i)
		if err != nil {
			t.Fatal(err)
		}
		ep := listen(t, true)
		if _, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, i), Listener: ep.file, Leaf: leaf.Path()}); err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, leaf)
	}
	if err := syscall.Kill(zygotePID(t, uid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range leaves {
		if e := nextExit(t, b); !e.Reason.TemplateDied {
			t.Fatalf("exit = %+v, want TemplateDied", e)
		}
	}
	if e := nextExit(t, b); !e.Template {
		t.Fatalf("exit = %+v, want the template's", e)
	}
	for _, l := range leaves {
		if !gone(l.Path()) {
			t.Errorf("leaf %s of a dead zygote's fiber still exists", l)
		}
	}
	if !gone(g.Zygote.Path()) {
		t.Errorf("zygote leaf %s still exists", g.Zygote)
	}
	noStrays(t, uid)
}

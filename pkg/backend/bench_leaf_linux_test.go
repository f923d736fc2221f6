package backend

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
)

// BenchmarkCloneToFirstByteInLeaf is BenchmarkCloneToFirstByte with a cgroup
// leaf per fiber, as fiberd carves one where it has cgroups: the leaf is
// made outside the timer, the child's entry into it (and, isolated, the
// grant's user given its cgroup.procs) inside. It skips without a writable
// cgroup v2. Compare commits on one host in alternation.
func BenchmarkCloneToFirstByteInLeaf(b *testing.B) {
	for _, bc := range []struct {
		name string
		iso  bool
	}{{"warm-c", false}, {"warm-c-isolated", true}} {
		b.Run(bc.name, func(b *testing.B) {
			var be Backend
			if bc.iso {
				be = isoBackend(b, core.TierWarm)
			} else {
				be = newBackend(b, core.TierWarm)
			}
			mount, err := cgroup.Mount()
			if err != nil {
				b.Skipf("cgroup v2 is not mounted: %v", err)
			}
			dir := filepath.Join(mount, "fiberd-bench-"+uidFor(b))
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				b.Skipf("cgroup v2 at %s is not writable: %v", mount, err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = cgroup.At(dir).Destroy(ctx)
			})
			tree, err := cgroup.NewTree(cgroup.Config{Root: dir, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			uid := uidFor(b)
			g, err := tree.Grant(uid)
			if err != nil {
				b.Fatal(err)
			}
			warm(b, be, uid, kindC.spec(b, "--init-ms", "200"), g.Dir.Path())
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				f := fence(uid, uint64(i+1))
				leaf, err := g.Fiber(1, uint64(i+1))
				if err != nil {
					b.Fatal(err)
				}
				ep := listen(b, false)
				b.StartTimer()
				start := time.Now()
				if _, err := be.Clone(ctx, CloneRequest{Fence: f, Listener: ep.file, Leaf: leaf.Path()}); err != nil {
					b.Fatal(err)
				}
				if err := firstByte(ep); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				if err := be.Kill(ctx, f); err != nil {
					b.Fatal(err)
				}
				<-be.Exits()
				ep.file.Close()
				b.StartTimer()
			}
			b.StopTimer()
			reportLatency(b, lat, "")
		})
	}
}

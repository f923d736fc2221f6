package backend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/core"
)

// BenchmarkGuardCost measures what the endpoint guard adds to a Clone of an
// isolated grant on a TCP listener (one SO_MARK, and the nftables rules on
// the first byte's connection): two isolated backends, one with
// NoEndpointGuard, cloned in alternation as in BenchmarkIsolationCost.
// Reported: each side's p50 and the p50 of the paired differences.
func BenchmarkGuardCost(b *testing.B) {
	for _, bc := range []struct {
		tier core.Tier
		w    int
	}{{core.TierWarm, 0}, {core.TierWarm, 8}, {core.TierBasic, 0}} {
		name := fmt.Sprintf("warm-c/W=%d", bc.w)
		if bc.tier == core.TierBasic {
			name = "exec-c"
		}
		b.Run(name, func(b *testing.B) {
			plain := isoBackend(b, bc.tier, func(c *Config) { c.NoEndpointGuard = true })
			guarded := isoBackend(b, bc.tier)
			if !guarded.Isolation().EndpointsApart {
				b.Skipf("no endpoint guard here: %s", guarded.Isolation().Missing)
			}
			uid := uidFor(b)
			for _, be := range []Backend{plain, guarded} {
				warm(b, be, uid, kindC.spec(b, "--init-ms", "200"), "")
				if s, ok := be.(Sparer); ok && bc.w > 0 {
					s.SetSpares(uid, bc.w, 64)
				}
			}
			var lat [2][]time.Duration
			deltas := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for bc.w > 0 && (plain.(Sparer).Spares(uid).Ready < bc.w || guarded.(Sparer).Spares(uid).Ready < bc.w) {
					time.Sleep(time.Millisecond)
				}
				b.StartTimer()
				var pair [2]time.Duration
				for j := range 2 {
					if i%2 == 1 {
						j = 1 - j // alternate which goes first
					}
					pair[j] = timedClone(b, []Backend{plain, guarded}[j], fence(uid, uint64(i+1)), false)
				}
				lat[0], lat[1] = append(lat[0], pair[0]), append(lat[1], pair[1])
				deltas = append(deltas, pair[1]-pair[0])
			}
			b.StopTimer()
			ms := func(x time.Duration) float64 { return float64(x) / float64(time.Millisecond) }
			b.ReportMetric(ms(percentile(lat[0], 0.5)), "plain-p50-ms")
			b.ReportMetric(ms(percentile(lat[1], 0.5)), "guarded-p50-ms")
			b.ReportMetric(ms(percentile(deltas, 0.5)), "delta-p50-ms")
		})
	}
}

// BenchmarkGuardElements measures the nft runs a Warm and a Stop of an
// isolated grant add: adding the grant's elements to the backend's table,
// and deleting them.
func BenchmarkGuardElements(b *testing.B) {
	be := isoBackend(b, core.TierBasic).(*Exec)
	g := be.iso.guard
	if g == nil {
		b.Skipf("no endpoint guard here: %s", be.Isolation().Missing)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var add, del []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := DefaultIDFirst + 2*uint32(i%1000)
		start := time.Now()
		if err := g.add(ctx, id); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		g.remove(id)
		add, del = append(add, mid.Sub(start)), append(del, time.Since(mid))
	}
	b.StopTimer()
	ms := func(x time.Duration) float64 { return float64(x) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(add, 0.5)), "add-p50-ms")
	b.ReportMetric(ms(percentile(del, 0.5)), "delete-p50-ms")
	b.ReportMetric(ms(percentile(add, 0.9)), "add-p90-ms")
}

// BenchmarkMarkListener measures the one setsockopt (SO_MARK) a Clone of
// a guarded grant adds.
func BenchmarkMarkListener(b *testing.B) {
	ep := listen(b, false)
	defer ep.file.Close()
	for b.Loop() {
		if err := markListener(ep.file, DefaultIDFirst); err != nil {
			b.Fatal(err)
		}
	}
}

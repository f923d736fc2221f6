package fiberd

import (
	"bytes"
	"net/http"
	"testing"

	"fiberd.io/fiberd/pkg/api"
)

// BenchmarkCloneOverSocket is the API's own cost of a Clone on the unix
// socket (a create on the fake backend, then its release): HTTP, decoding,
// the listener's limits and guard, the ledger. The fork is not in it; the
// bench program (go run ./bench) measures the whole path.
func BenchmarkCloneOverSocket(b *testing.B) {
	e := newEnv(b, withConfig(func(c *Config) { c.ThrashRate, c.ThrashBurst = 1e9, 1e9 }))
	uid := e.deliver(e.mint("g1", maxFibers(64)))
	body := []byte(`{"grantUID":"` + uid + `"}`)
	b.ResetTimer()
	for b.Loop() {
		r := e.do(e.unix, http.MethodPost, "/v1/clone", bytes.NewReader(body))
		if r.status != 200 {
			b.Fatalf("clone: %d %s", r.status, r.body)
		}
		if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: r.clone(e.t).FiberID}); r.status != 200 {
			b.Fatalf("release: %d %s", r.status, r.body)
		}
	}
}

package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
)

// The pool's cost over a direct Clone: go test -run '^$' -bench . ./pkg/client/pool
//
// BenchmarkCloneDirect is pkg/client's Clone to one agent; BenchmarkClonePool
// the same agents behind a Pool (pick, attempt bookkeeping, the session map);
// BenchmarkPick the pick alone over a pool of n Pods. The agents answer a
// canned fiber at once, so the difference is the client's.

// cannedAgent answers every Clone with the same fiber of its grant.
func cannedAgent(b *testing.B, uid string) *httptest.Server {
	f := core.Fence{GrantUID: uid, Epoch: 1, Seq: 1}
	body, _ := json.Marshal(api.CloneResponse{FiberID: f.String(), Endpoint: "tcp://127.0.0.1:1", Fence: f, Kind: api.KindCreate})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req api.CloneRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func BenchmarkCloneDirect(b *testing.B) {
	srv := cannedAgent(b, "uid-0")
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	b.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(client.Config{Addr: srv.Listener.Addr().String(), Transport: tr})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for b.Loop() {
		if _, err := c.Clone(ctx, api.CloneRequest{GrantUID: "uid-0"}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkClonePool(b *testing.B) {
	for _, session := range []bool{false, true} {
		b.Run(fmt.Sprintf("pods=4/session=%v", session), func(b *testing.B) {
			var eps []Endpoint
			for i := range 4 {
				uid := fmt.Sprintf("uid-%d", i)
				eps = append(eps, Endpoint{PodName: fmt.Sprintf("p-%d", i), PodUID: uid, Addr: cannedAgent(b, uid).Listener.Addr().String()})
			}
			p, err := New(Config{Namespace: "ns", Name: "p", Source: NewStaticSource(eps...)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { p.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			i := 0
			for b.Loop() {
				req := api.CloneRequest{}
				if session {
					req.Session = fmt.Sprintf("s%d", i%1000)
				}
				i++
				if _, err := p.Clone(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{4, 64, 1000} {
		for _, session := range []bool{false, true} {
			b.Run(fmt.Sprintf("pods=%d/session=%v", n, session), func(b *testing.B) {
				eps := make([]Endpoint, n)
				for i := range eps {
					eps[i] = Endpoint{PodName: fmt.Sprintf("p-%d", i), PodUID: fmt.Sprintf("uid-%d", i), Addr: fmt.Sprintf("10.0.%d.%d:8484", i/256, i%256)}
				}
				p, err := New(Config{Namespace: "ns", Name: "p", Source: NewStaticSource(eps...)})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { p.Close() })
				s := ""
				if session {
					s = "a-session"
				}
				for b.Loop() {
					if pk, _, err := p.pick(s); err != nil || pk.left != n || p.next(pk) == nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

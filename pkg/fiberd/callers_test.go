package fiberd

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBudgetsForgetTheLeastRecent: the table of thrash budgets holds at
// most its max callers; a new one forgets the caller that cloned least
// recently, whose budget is full again when it comes back, and a flood of
// distinct callers leaves the table at its max.
func TestBudgetsForgetTheLeastRecent(t *testing.T) {
	b := newBudgets(0.001, 1, 3)
	now := testStart
	c := func(id string) caller { return caller{kind: callerIP, id: id} }
	for _, id := range []string{"a", "b", "c"} {
		if !b.allow(c(id), now) {
			t.Fatalf("%s's first Clone refused", id)
		}
	}
	if b.allow(c("a"), now) {
		t.Fatalf("a's second Clone allowed past a burst of 1")
	}
	// a was charged last: b is the least recent, and goes.
	if !b.allow(c("d"), now) {
		t.Fatalf("d's first Clone refused")
	}
	if b.allow(c("a"), now) {
		t.Errorf("a forgotten: its spent budget is full again")
	}
	if !b.allow(c("b"), now) {
		t.Errorf("b remembered, want forgotten for d")
	}
	for i := range 10000 {
		b.allow(c(fmt.Sprint("flood-", i)), now)
	}
	if n := b.len(); n != 3 {
		t.Errorf("after 10,000 callers the table holds %d, want its max 3", n)
	}
	// The budget refills at its rate, on the clock it is given.
	if !b.allow(c("flood-9999"), now.Add(1000*time.Second)) {
		t.Errorf("a budget not refilled after 1/rate")
	}
}

// TestIPCaller: a remote address is its IP; an IPv6 one its /64, but for
// loopback; an IPv4-mapped one its IPv4.
func TestIPCaller(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1":                 "127.0.0.1",
		"::ffff:10.1.2.3":           "10.1.2.3",
		"::1":                       "::1",
		"2001:db8:1:2:3:4:5:6":      "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1":      "2001:db8:1:2::/64",
		"fe80::1%eth0":              "fe80::/64",
		"2001:db8:1:3:3:4:5:6":      "2001:db8:1:3::/64",
		"2001:0db8:0001:0002:0::99": "2001:db8:1:2::/64",
	} {
		ip, zone, _ := strings.Cut(in, "%")
		got := ipCaller(&net.TCPAddr{IP: net.ParseIP(ip), Zone: zone})
		if got.kind != callerIP || got.id != want {
			t.Errorf("ipCaller(%s) = %v, want %s", in, got, want)
		}
	}
}

// TestWatchersCap: a caller opens at most max streams, others theirs; a
// stream closed (once, however often its release runs) makes room.
func TestWatchersCap(t *testing.T) {
	var w watchers
	a, b := caller{kind: callerUID, id: "0"}, caller{kind: callerIP, id: "127.0.0.1"}
	var dones []func()
	for i := range 2 {
		done, ok := w.add(a, 2)
		if !ok {
			t.Fatalf("stream %d refused", i)
		}
		dones = append(dones, done)
	}
	if _, ok := w.add(a, 2); ok {
		t.Fatalf("a third stream allowed past 2")
	}
	if _, ok := w.add(b, 2); !ok {
		t.Fatalf("another caller refused")
	}
	dones[0]()
	dones[0]()
	if _, ok := w.add(a, 2); !ok {
		t.Fatalf("a stream refused after one closed")
	}
	if _, ok := w.add(a, 2); ok {
		t.Fatalf("a release run twice made room twice")
	}
}

// TestLimitsDefaultsShares: the new caps default and refuse negatives by
// name.
func TestLimitsDefaultsShares(t *testing.T) {
	l := Limits{}.withDefaults()
	if l.MaxHandshakes != DefaultMaxHandshakes || l.MaxWatches != DefaultMaxWatches || l.MaxConnsPerIP != DefaultMaxConns/4 {
		t.Errorf("defaults %+v", l)
	}
	if l := (Limits{MaxConns: 2}).withDefaults(); l.MaxConnsPerIP != 1 {
		t.Errorf("MaxConnsPerIP of MaxConns 2: %d, want 1", l.MaxConnsPerIP)
	}
	for name, l := range map[string]Limits{"MaxHandshakes": {MaxHandshakes: -1}, "MaxConnsPerIP": {MaxConnsPerIP: -1}, "MaxWatches": {MaxWatches: -1}} {
		if err := l.validate(); err == nil || !strings.Contains(err.Error(), "Limits."+name) {
			t.Errorf("negative %s: %v, want an error naming it", name, err)
		}
	}
}

// TestTLSGateKeepsHandshakenConnections: a connection that finished its
// handshake and waits for a slot of MaxConns is never closed for a newer
// one; it is served when a slot frees, and the newer connection waits
// meanwhile.
func TestTLSGateKeepsHandshakenConnections(t *testing.T) {
	opt, client := tlsSetup(t)
	e := newEnv(t, opt, withLimits(Limits{MaxConns: 1, MaxHandshakes: 1, HeaderTimeout: time.Second}))
	gate := e.agent.apiTCP.(*tlsGate)
	url := "https://" + e.agent.Addr().String() + "/healthz"
	first, second := client(true), client(true)
	first.Timeout, second.Timeout = patience, patience
	get := func(c *http.Client) error {
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body) // read whole: the connection stays open
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	must(t, get(first)) // its connection, kept alive, holds the one slot

	served := make(chan error, 1)
	go func() { served <- get(second) }()
	e.eventually("the second client handshaken and waiting for a slot", func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return gate.pool == 1 && gate.handshaking.Len() == 0
	})
	newer, err := net.DialTimeout("tcp", e.agent.Addr().String(), patience)
	must(t, err)
	defer newer.Close()
	first.Transport.(*http.Transport).CloseIdleConnections()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("the second client, once the slot freed: %v", err)
		}
	case <-time.After(patience):
		t.Fatalf("the second client not served within %v of the slot freeing", patience)
	}
}

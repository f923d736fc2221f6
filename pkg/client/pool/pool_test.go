package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
)

// newPool builds a Pool over src, closed when t ends.
func newPool(t *testing.T, src Source, mod func(*Config)) *Pool {
	t.Helper()
	cfg := Config{Namespace: "ns", Name: "p", Source: src}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// agents starts n serving agents named p-0... with UIDs uid-0...
func agents(t *testing.T, n int) []*agent {
	as := make([]*agent, n)
	for i := range as {
		as[i] = newAgent(t, fmt.Sprintf("p-%d", i), fmt.Sprintf("uid-%d", i), serve)
	}
	return as
}

func endpoints(as ...*agent) []Endpoint {
	out := make([]Endpoint, len(as))
	for i, a := range as {
		out[i] = a.endpoint()
	}
	return out
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// podOfFiber is the agent whose UID starts the fiber id.
func podOfFiber(t *testing.T, as []*agent, id string) *agent {
	t.Helper()
	for _, a := range as {
		if strings.HasPrefix(id, a.uid+"/") {
			return a
		}
	}
	t.Fatalf("fiber %q is of no agent", id)
	return nil
}

func TestCloneNamesEachPodsOwnGrantAndSpreads(t *testing.T) {
	as := agents(t, 3)
	p := newPool(t, NewStaticSource(endpoints(as...)...), nil)
	for range 60 {
		resp, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Payload: []byte("x")})
		if err != nil {
			t.Fatalf("Clone: %v", err)
		}
		a := podOfFiber(t, as, resp.FiberID)
		if got := a.lastClone(); got.GrantUID != a.uid || string(got.Payload) != "x" {
			t.Fatalf("%s was sent %+v, want grantUID %s and the payload", a.name, got, a.uid)
		}
	}
	for _, a := range as {
		// Equal Pods are picked at random: 60 Clones over 3 Pods leave
		// none without one but once in 10^10 runs.
		if a.calls() == 0 {
			t.Errorf("%s got no Clone of 60: equal Pods are not spread", a.name)
		}
	}
}

func TestCloneRejectsANamedGrant(t *testing.T) {
	as := agents(t, 1)
	p := newPool(t, NewStaticSource(endpoints(as...)...), nil)
	for _, req := range []api.CloneRequest{{GrantUID: "uid-0"}, {Grant: "a.b.c"}} {
		_, err := p.Clone(ctxT(t, time.Second), req)
		if !errors.Is(err, core.ErrInvalid) || !strings.Contains(err.Error(), "leave Grant and GrantUID empty") {
			t.Errorf("Clone(%+v) = %v, want ErrInvalid saying to leave the grant empty", req, err)
		}
	}
	if as[0].calls() != 0 {
		t.Error("a Clone naming a grant was sent")
	}
}

func TestCloneFailsOverOnMissAndRanksTheMissingPodsLast(t *testing.T) {
	as := agents(t, 3)
	as[0].set(shed)
	as[1].set(deferred)
	p := newPool(t, NewStaticSource(endpoints(as...)...), nil)
	// Equal Pods are asked in random order: Clone until both missing
	// Pods were asked once.
	for i := 0; as[0].calls() == 0 || as[1].calls() == 0; i++ {
		if i == 50 {
			t.Fatalf("after 50 Clones the missing Pods were asked %d and %d times", as[0].calls(), as[1].calls())
		}
		resp, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{})
		if err != nil {
			t.Fatalf("Clone with one Pod of three serving: %v", err)
		}
		if podOfFiber(t, as, resp.FiberID) != as[2] {
			t.Fatalf("served by %s, want p-2", resp.FiberID)
		}
		if as[0].calls() > 1 || as[1].calls() > 1 {
			t.Fatalf("a Pod that missed was asked again: %d, %d", as[0].calls(), as[1].calls())
		}
	}
	before := as[0].calls() + as[1].calls()
	for range 5 {
		if _, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{}); err != nil {
			t.Fatalf("Clone: %v", err)
		}
	}
	if after := as[0].calls() + as[1].calls(); after != before {
		t.Errorf("Pods that just missed were asked %d more times while another had room", after-before)
	}
}

func TestCloneAllMissListsEveryPod(t *testing.T) {
	as := agents(t, 3)
	as[0].set(shed)
	as[1].set(internal)
	p := newPool(t, NewStaticSource(append(endpoints(as[0], as[1]), Endpoint{PodName: "p-dead", PodUID: "uid-dead", Addr: deadAddr(t)})...), nil)
	_, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{})
	pe, ok := AsError(err)
	if !ok {
		t.Fatalf("Clone = %v, want a *pool.Error", err)
	}
	if len(pe.Attempts) != 3 || pe.Err != nil {
		t.Fatalf("attempts %d, Err %v; want 3 and nil: %v", len(pe.Attempts), pe.Err, err)
	}
	for _, want := range []string{"pool ns/p: no grant Pod served the Clone", "pod p-0 (", "429 SHED: at fibers.max", "pod p-1 (", "500 INTERNAL: fork failed", "pod p-dead (", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	m, ok := core.IsMiss(err)
	if !ok || m.Code != core.CodeShed || m.RetryAfter != time.Second {
		t.Errorf("core.IsMiss = %+v, %v; want the SHED with its Retry-After", m, ok)
	}
	if as[0].calls() != 1 || as[1].calls() != 1 {
		t.Errorf("calls %d, %d; want each Pod asked once", as[0].calls(), as[1].calls())
	}
}

func TestCloneRefusalIsReturnedAtOnce(t *testing.T) {
	as := agents(t, 3)
	for _, a := range as {
		a.set(unauth)
	}
	p := newPool(t, NewStaticSource(endpoints(as...)...), nil)
	_, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: "s", ReleaseKey: "wrong"})
	if !errors.Is(err, core.ErrUnauthenticated) {
		t.Fatalf("Clone = %v, want UNAUTHENTICATED", err)
	}
	if ce, ok := client.AsError(err); !ok || ce.Status != 401 {
		t.Errorf("client.AsError(%v) = %v, %v", err, ce, ok)
	}
	if !strings.Contains(err.Error(), "pool ns/p: pod p-") {
		t.Errorf("error %q does not name the Pod", err)
	}
	total := 0
	for _, a := range as {
		total += a.calls()
	}
	if total != 1 {
		t.Errorf("%d Pods asked, want 1: a refusal that is not a miss is the same everywhere", total)
	}
}

func TestCloneAvoidsAPodWithClonesUnderWay(t *testing.T) {
	as := agents(t, 2)
	as[0].set(gated)
	src := NewStaticSource(endpoints(as[0])...)
	p := newPool(t, src, nil)
	done := make(chan error, 1)
	go func() {
		_, err := p.Clone(ctxT(t, 10*time.Second), api.CloneRequest{})
		done <- err
	}()
	for as[0].calls() == 0 {
		time.Sleep(time.Millisecond)
	}
	// p-1 joins while p-0 holds a Clone of this client: every Clone goes
	// to p-1 until it does not.
	src.Set(endpoints(as...)...)
	for range 10 {
		if _, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := as[0].calls(); n != 1 {
		t.Errorf("p-0, with a Clone under way, was sent %d more", n-1)
	}
	close(as[0].gate)
	if err := <-done; err != nil {
		t.Fatalf("the gated Clone: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pd := range p.listed {
		if pd.inflight != 0 {
			t.Errorf("%s counts %d Clones under way after all ended", pd.ep.PodName, pd.inflight)
		}
	}
}

func TestCloneSkipsADeadPod(t *testing.T) {
	as := agents(t, 2)
	dead := Endpoint{PodName: "p-dead", PodUID: "uid-dead", Addr: deadAddr(t)}
	p := newPool(t, NewStaticSource(append(endpoints(as...), dead)...), nil)
	for range 20 {
		if _, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{}); err != nil {
			t.Fatalf("Clone with a dead Pod listed: %v", err)
		}
	}
	p.mu.Lock()
	downed := !p.pods["uid-dead"].down.IsZero()
	p.mu.Unlock()
	if !downed {
		t.Error("the dead Pod is not ranked down after 20 Clones")
	}
}

// sessionFirst returns a session whose rendezvous order over uids puts
// uids[0] first.
func sessionFirst(t *testing.T, uids ...string) string {
	t.Helper()
	for i := range 10000 {
		s := fmt.Sprintf("session-%d", i)
		best := ""
		var bw uint64
		for _, u := range uids {
			if w := rendezvous(s, u); best == "" || w > bw {
				best, bw = u, w
			}
		}
		if best == uids[0] {
			return s
		}
	}
	t.Fatal("no session found")
	return ""
}

func TestCloneAHungPodCostsOneAttemptTimeout(t *testing.T) {
	as := agents(t, 2)
	as[0].set(hang)
	p := newPool(t, NewStaticSource(endpoints(as...)...), func(c *Config) { c.AttemptTimeout = 200 * time.Millisecond })
	s := sessionFirst(t, "uid-0", "uid-1")
	start := time.Now()
	resp, err := p.Clone(ctxT(t, 10*time.Second), api.CloneRequest{Session: s})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Clone: %v", err)
	}
	if podOfFiber(t, as, resp.FiberID) != as[1] || as[0].calls() != 1 {
		t.Fatalf("served %s after %d calls to the hung Pod; want p-1 after 1", resp.FiberID, as[0].calls())
	}
	if took < 200*time.Millisecond || took > 2*time.Second {
		t.Errorf("took %v, want about the attempt timeout of 200ms", took)
	}
	if dl := as[0].lastClone().DeadlineMs; dl <= 0 || dl > 200 {
		t.Errorf("the hung Pod was sent deadlineMs %d, want the attempt's bound (<= 200)", dl)
	}
	if dl := as[1].lastClone().DeadlineMs; dl <= 0 || dl > 10000 {
		t.Errorf("the last Pod was sent deadlineMs %d, want what is left of the call (<= 10000)", dl)
	}
}

func TestCloneDeadlineBoundsEverything(t *testing.T) {
	as := agents(t, 3)
	for _, a := range as {
		a.set(hang)
	}
	p := newPool(t, NewStaticSource(endpoints(as...)...), func(c *Config) { c.AttemptTimeout = -1 })
	start := time.Now()
	_, err := p.Clone(ctxT(t, 300*time.Millisecond), api.CloneRequest{})
	took := time.Since(start)
	if took > 2*time.Second {
		t.Errorf("Clone took %v with a 300ms deadline", took)
	}
	pe, ok := AsError(err)
	if !ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Clone = %v, want a *pool.Error of the deadline", err)
	}
	if len(pe.Attempts) != 1 || pe.Untried != 2 || !strings.Contains(err.Error(), "2 more not asked") {
		t.Errorf("attempts %d untried %d (%v); want 1 and 2", len(pe.Attempts), pe.Untried, err)
	}
	// Without a deadline of its own, Config.Timeout bounds the call.
	p2 := newPool(t, NewStaticSource(endpoints(as...)...), func(c *Config) { c.Timeout = 300 * time.Millisecond })
	start = time.Now()
	if _, err := p2.Clone(context.Background(), api.CloneRequest{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Clone without a deadline = %v, want the Timeout's", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Clone without a deadline took %v, Timeout 300ms", took)
	}
}

func TestCloneWithNoPods(t *testing.T) {
	src := NewStaticSource()
	p := newPool(t, src, nil)
	_, err := p.Clone(ctxT(t, time.Second), api.CloneRequest{})
	if m, ok := core.IsMiss(err); !ok || m.Code != core.CodeShed || !errors.Is(err, ErrNoReadyPods) {
		t.Fatalf("Clone = %v, want a SHED caused by ErrNoReadyPods", err)
	}
	if !strings.Contains(err.Error(), "pool ns/p has no ready grant Pod") {
		t.Errorf("error %q does not say the pool has no ready Pod", err)
	}
}

func TestSessionAffinity(t *testing.T) {
	as := agents(t, 5)
	src := NewStaticSource(endpoints(as[0], as[1])...)
	p := newPool(t, src, nil)
	first, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	home := podOfFiber(t, as, first.FiberID)
	// Pods join: the session stays on its Pod, and the Clone attaches.
	src.Set(endpoints(as...)...)
	for range 5 {
		again, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		if again.FiberID != first.FiberID || again.Kind != api.KindAttach {
			t.Fatalf("session went to %s (%s), want its fiber %s attached", again.FiberID, again.Kind, first.FiberID)
		}
	}
	// Another client process, which never saw the session, agrees on a
	// new session's Pod: the rendezvous hash.
	other := newPool(t, NewStaticSource(endpoints(as...)...), nil)
	for i := range 20 {
		s := fmt.Sprintf("fresh-%d", i)
		a, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: s})
		if err != nil {
			t.Fatal(err)
		}
		b, err := other.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: s})
		if err != nil {
			t.Fatal(err)
		}
		if a.FiberID != b.FiberID || b.Kind != api.KindAttach {
			t.Fatalf("session %s: clients disagree: %s then %s (%s)", s, a.FiberID, b.FiberID, b.Kind)
		}
	}
	// Its Pod leaves: the session is created anew on another.
	var rest []*agent
	for _, a := range as {
		if a != home {
			rest = append(rest, a)
		}
	}
	src.Set(endpoints(rest...)...)
	moved, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if podOfFiber(t, as, moved.FiberID) == home || moved.Kind != api.KindCreate {
		t.Fatalf("session on %s (%s) after its Pod left", moved.FiberID, moved.Kind)
	}
}

func TestSessionFailsOverWhenItsPodMisses(t *testing.T) {
	as := agents(t, 2)
	p := newPool(t, NewStaticSource(endpoints(as...)...), nil)
	first, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: "s"})
	if err != nil {
		t.Fatal(err)
	}
	home := podOfFiber(t, as, first.FiberID)
	home.set(shed)
	moved, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: "s"})
	if err != nil {
		t.Fatalf("Clone with the session's Pod shedding: %v", err)
	}
	if podOfFiber(t, as, moved.FiberID) == home || moved.Kind != api.KindCreate {
		t.Fatalf("got %s (%s), want a new fiber on the other Pod", moved.FiberID, moved.Kind)
	}
	home.set(serve)
	back, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: "s"})
	if err != nil || back.FiberID != moved.FiberID {
		t.Fatalf("Clone = %v, %v; want the session's new Pod, %s", back.FiberID, err, moved.FiberID)
	}
}

func TestRendezvousMovesOnlyTheSessionsOfAPodThatChanges(t *testing.T) {
	pick := func(session string, uids []string) string {
		pods := make([]*pod, len(uids))
		for i, u := range uids {
			pods[i] = &pod{ep: Endpoint{PodUID: u}}
		}
		return order(pods, session, nil, time.Now())[0].ep.PodUID
	}
	four := []string{"a", "b", "c", "d"}
	five := append(four[:4:4], "e")
	three := []string{"a", "b", "d"}
	counts := map[string]int{}
	for i := range 4000 {
		s := fmt.Sprintf("s%d", i)
		before := pick(s, four)
		counts[before]++
		if got := pick(s, []string{"d", "c", "b", "a"}); got != before {
			t.Fatalf("session %s: %s over a,b,c,d but %s over d,c,b,a", s, before, got)
		}
		if after := pick(s, five); after != before && after != "e" {
			t.Fatalf("session %s moved from %s to %s when e joined", s, before, after)
		}
		if after := pick(s, three); before != "c" && after != before {
			t.Fatalf("session %s moved from %s to %s when c left", s, before, after)
		}
	}
	for _, u := range four {
		if counts[u] < 800 || counts[u] > 1200 {
			t.Errorf("Pod %s got %d of 4000 sessions, want about 1000", u, counts[u])
		}
	}
	// The weight is part of the contract between clients (those of
	// other releases and languages compute it alike): pin it.
	if w := rendezvous("s", "uid"); w != 0x2d6f500de9e44f31 {
		t.Errorf("rendezvous(s, uid) = %#x, want 0x2d6f500de9e44f31", w)
	}
}

func TestOrderRanksByLoadThenMisses(t *testing.T) {
	now := time.Now()
	mk := func(uid string, inflight int, missed, down bool) *pod {
		pd := &pod{ep: Endpoint{PodUID: uid}, inflight: inflight}
		if missed {
			pd.missed = now.Add(time.Second)
		}
		if down {
			pd.down = now.Add(time.Second)
		}
		return pd
	}
	listed := []*pod{mk("busy", 3, false, false), mk("down", 0, false, true), mk("idle", 0, false, false), mk("missed", 0, true, false), mk("some", 1, false, false)}
	for range 20 {
		var got []string
		for _, pd := range order(listed, "", nil, now) {
			got = append(got, pd.ep.PodUID)
		}
		if want := "idle some busy missed down"; strings.Join(got, " ") != want {
			t.Fatalf("order = %v, want %s", got, want)
		}
	}
	// A cooldown that has passed counts for nothing.
	if got := order(listed, "", nil, now.Add(2*time.Second)); got[len(got)-1].ep.PodUID != "busy" {
		t.Errorf("after the cooldowns the last Pod is %s, want busy", got[len(got)-1].ep.PodUID)
	}
}

func TestSessionCacheIsBounded(t *testing.T) {
	c := newSessionCache(3)
	for i := range 5 {
		c.put(fmt.Sprint(i), "u")
	}
	c.get("2") // used: kept over 3
	c.put("5", "u")
	if c.len() != 3 {
		t.Fatalf("len %d, want 3", c.len())
	}
	for _, s := range []string{"2", "4", "5"} {
		if _, ok := c.get(s); !ok {
			t.Errorf("session %s forgotten", s)
		}
	}
	if _, ok := c.get("3"); ok {
		t.Error("the least recently used session is still remembered")
	}
}

func TestReleaseAndParkGoToTheServingPod(t *testing.T) {
	as := agents(t, 3)
	src := NewStaticSource(endpoints(as...)...)
	p := newPool(t, src, nil)
	var fibers []api.CloneResponse
	for i := range 6 {
		resp, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{Session: fmt.Sprint("s", i)})
		if err != nil {
			t.Fatal(err)
		}
		fibers = append(fibers, resp)
	}
	// The Pod of the first fiber drains: it leaves the endpoints but its
	// fibers are still released there.
	draining := podOfFiber(t, as, fibers[0].FiberID)
	var rest []*agent
	for _, a := range as {
		if a != draining {
			rest = append(rest, a)
		}
	}
	src.Set(endpoints(rest...)...)
	for _, f := range fibers[:3] {
		if err := p.Release(ctxT(t, 5*time.Second), f.FiberID); err != nil {
			t.Fatalf("Release %s: %v", f.FiberID, err)
		}
		a := podOfFiber(t, as, f.FiberID)
		a.mu.Lock()
		got := a.released[len(a.released)-1]
		a.mu.Unlock()
		if got != f.FiberID {
			t.Errorf("%s released %s, want %s", a.name, got, f.FiberID)
		}
	}
	parked, err := p.Park(ctxT(t, 5*time.Second), fibers[3].FiberID)
	if err != nil {
		t.Fatal(err)
	}
	if parked.Session != "s3" {
		t.Errorf("parked session %q, want s3", parked.Session)
	}
	if ep, err := p.PodOf(fibers[0].FiberID); err != nil || ep.PodName != draining.name {
		t.Errorf("PodOf = %+v, %v; want %s", ep, err, draining.name)
	}
	err = p.Release(ctxT(t, time.Second), "uid-nobody/1/1")
	if !errors.Is(err, ErrUnknownPod) || !strings.Contains(err.Error(), "no grant Pod of UID uid-nobody") {
		t.Errorf("Release of an unknown Pod's fiber = %v", err)
	}
	if err := p.Release(ctxT(t, time.Second), "not-a-fiber"); !errors.Is(err, core.ErrInvalid) {
		t.Errorf("Release of a malformed id = %v, want ErrInvalid", err)
	}
	// A refusal of the Pod comes back as its own.
	if err := p.Release(ctxT(t, time.Second), "uid-1/1/999"); !errors.Is(err, core.ErrNotFound) || !strings.Contains(err.Error(), "pod p-1") {
		t.Errorf("Release of an unknown fiber = %v, want NOT_FOUND naming p-1", err)
	}
}

func TestForgetDropsDepartedPods(t *testing.T) {
	as := agents(t, 2)
	src := NewStaticSource(endpoints(as...)...)
	p := newPool(t, src, func(c *Config) { c.Forget = 50 * time.Millisecond })
	resp, err := p.Clone(ctxT(t, 5*time.Second), api.CloneRequest{})
	if err != nil {
		t.Fatal(err)
	}
	src.Set()
	if _, err := p.PodOf(resp.FiberID); err != nil {
		t.Fatalf("PodOf right after the Pod left: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	src.Set() // a new version makes the Pool look again
	if _, err := p.PodOf(resp.FiberID); !errors.Is(err, ErrUnknownPod) {
		t.Errorf("PodOf after Forget = %v, want ErrUnknownPod", err)
	}
}

func TestClosedPool(t *testing.T) {
	as := agents(t, 1)
	p := newPool(t, NewStaticSource(endpoints(as...)...), nil)
	if _, err := p.Clone(ctxT(t, time.Second), api.CloneRequest{}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close()
	if _, err := p.Clone(ctxT(t, time.Second), api.CloneRequest{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Clone after Close = %v", err)
	}
	if err := p.Release(ctxT(t, time.Second), "uid-0/1/1"); !errors.Is(err, ErrClosed) {
		t.Errorf("Release after Close = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	src := NewStaticSource()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Source: src}, "Name is empty"},
		{Config{Name: "p", Namespace: "ns"}, "pool ns/p: Source is nil"},
		{Config{Name: "p", Source: src, Timeout: -1}, "Timeout -1ns is negative"},
		{Config{Name: "p", Source: src, Sessions: -1}, "Sessions -1 is negative"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestDefaultServerName(t *testing.T) {
	p := newPool(t, NewStaticSource(), func(c *Config) { c.TLS = mustTLS(t) })
	if got := p.cfg.TLS.ServerName; got != "fiberd.ns.svc" {
		t.Errorf("ServerName = %q, want fiberd.ns.svc", got)
	}
}

func mustTLS(*testing.T) *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS13} }

// order drains a picker: every Pod a Clone of session would ask, in order.
func order(listed []*pod, session string, home *pod, now time.Time) []*pod {
	pk := newPicker(listed, session, home)
	var out []*pod
	for pd := pk.next(now); pd != nil; pd = pk.next(now) {
		out = append(out, pd)
	}
	return out
}

func TestPickerAsksEachPodOnceHomeFirst(t *testing.T) {
	var listed []*pod
	for i := range 10 {
		listed = append(listed, &pod{ep: Endpoint{PodUID: fmt.Sprint("u", i)}})
	}
	now := time.Now()
	listed[7].down = now.Add(time.Second)
	for _, session := range []string{"", "s"} {
		got := order(listed, session, listed[3], now)
		seen := map[*pod]bool{}
		for _, pd := range got {
			if seen[pd] {
				t.Fatalf("session %q: %s handed out twice", session, pd.ep.PodUID)
			}
			seen[pd] = true
		}
		if len(got) != len(listed) {
			t.Fatalf("session %q: %d Pods handed out, want %d", session, len(got), len(listed))
		}
		if got[len(got)-1] != listed[7] {
			t.Errorf("session %q: the Pod that is down is not last", session)
		}
		if session != "" && got[0] != listed[3] {
			t.Errorf("the session's Pod is not first")
		}
	}
}

func TestConcurrentClonesUnderChurn(t *testing.T) {
	as := agents(t, 4)
	src := NewStaticSource(endpoints(as...)...)
	p := newPool(t, src, nil)
	ctx := ctxT(t, 30*time.Second)
	home, err := p.Clone(ctx, api.CloneRequest{Session: "steady"})
	if err != nil {
		t.Fatal(err)
	}
	homeAgent := podOfFiber(t, as, home.FiberID)
	var others []*agent
	for _, a := range as {
		if a != homeAgent {
			others = append(others, a)
		}
	}
	// The other Pods come and go; the session's Pod stays listed.
	stop := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			src.Set(endpoints(append([]*agent{homeAgent}, others[:i%len(others)]...)...)...)
			time.Sleep(time.Millisecond)
		}
	}()
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 40 {
				req := api.CloneRequest{}
				if i%4 == 0 {
					req.Session = "steady"
				}
				resp, err := p.Clone(ctx, req)
				if err == nil && req.Session != "" && resp.FiberID != home.FiberID {
					err = fmt.Errorf("goroutine %d: session went to %s, want %s", g, resp.FiberID, home.FiberID)
				}
				if err == nil && req.Session == "" {
					err = p.Release(ctx, resp.FiberID)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	<-churned
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pd := range p.pods {
		if pd.inflight != 0 {
			t.Errorf("%s counts %d Clones under way after all ended", pd.ep.PodName, pd.inflight)
		}
	}
}

package standalone

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/grant/granttest"
	"fiberd.io/fiberd/pkg/home"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1_800_000_000, 0).UTC()

// base quiets a test's home.
func base(c Config) Config {
	c.Logger = logr.Discard()
	return c
}

// fakeCgroups is the host's cgroup hierarchy in memory. Delegated roots and
// made directories are recorded.
type fakeCgroups struct {
	mount, self string
	mountErr    error
	delegateErr error
	checkErr    error

	mu        sync.Mutex
	delegated []string
	made      []string
	removed   []string
}

func (f *fakeCgroups) Mount() (string, error) { return f.mount, f.mountErr }
func (f *fakeCgroups) Self() (string, error)  { return f.self, nil }
func (f *fakeCgroups) Delegate(root string, _ logr.Logger) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.delegateErr != nil {
		return "", f.delegateErr
	}
	f.delegated = append(f.delegated, root)
	return filepath.Join(root, "grants"), nil
}
func (f *fakeCgroups) Check(string) error { return f.checkErr }
func (f *fakeCgroups) RemoveDir(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, dir)
	return nil
}
func (f *fakeCgroups) MakeDir(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.made = append(f.made, dir)
	return nil
}

func TestValidate(t *testing.T) {
	cache := mustCache(t, "http://127.0.0.1:1")
	tests := []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{name: "zero value", cfg: Config{}},
		{name: "everything", cfg: Config{GrantsDir: "/g", Cache: cache, StaleTTL: time.Minute, CgroupRoot: "/sys/fs/cgroup/x", Devices: []string{"/dev/null"}}},
		{name: "negative poll", cfg: Config{GrantsPoll: -1}, want: "GrantsPoll"},
		{name: "negative ttl", cfg: Config{StaleTTL: -time.Second}, want: "StaleTTL"},
		{name: "negative refresh", cfg: Config{RefreshInterval: -time.Second}, want: "RefreshInterval"},
		{name: "refresh not shorter than ttl", cfg: Config{Cache: cache, StaleTTL: time.Second, RefreshInterval: time.Second}, want: "not shorter than StaleTTL"},
		{name: "relative grants dir", cfg: Config{GrantsDir: "grants"}, want: "-grants-dir"},
		{name: "relative cgroup root", cfg: Config{CgroupRoot: "x"}, want: "-cgroup-root"},
		{name: "empty device", cfg: Config{Devices: []string{"/dev/a", ""}}, want: "Devices[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

func TestCgroupRoot(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		sys      *fakeCgroups
		want     string
		wantErr  string
		delegate bool
		made     string
	}{
		{name: "delegates its own cgroup", sys: &fakeCgroups{mount: "/cg", self: "/cg/user/app"},
			want: "/cg/user/app/grants", delegate: true},
		{name: "root cgroup: a child, nothing moved", sys: &fakeCgroups{mount: "/cg", self: "/cg"},
			want: "/cg/fiberd", made: "/cg/fiberd"},
		{name: "no cgroup v2", sys: &fakeCgroups{mountErr: errors.ErrUnsupported}, want: ""},
		{name: "not writable", sys: &fakeCgroups{mount: "/cg", self: "/cg/a", delegateErr: os.ErrPermission}, want: ""},
		{name: "explicit root", cfg: Config{CgroupRoot: "/cg/mine"}, sys: &fakeCgroups{mount: "/cg", self: "/cg/a"}, want: "/cg/mine"},
		{name: "explicit root not a cgroup", cfg: Config{CgroupRoot: "/tmp"}, sys: &fakeCgroups{checkErr: os.ErrNotExist}, wantErr: "CgroupRoot \"/tmp\""},
		{name: "none", cfg: Config{NoCgroups: true, CgroupRoot: "/cg/mine"}, sys: &fakeCgroups{mount: "/cg", self: "/cg/a"}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := newHome(base(tt.cfg), tt.sys)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := h.CgroupRoot(); got != tt.want {
				t.Errorf("CgroupRoot = %q, want %q", got, tt.want)
			}
			h.Close()
			// Close removes the child of the root cgroup it carved, and
			// nothing it did not create.
			if tt.made != "" && (len(tt.sys.removed) != 1 || tt.sys.removed[0] != tt.made) {
				t.Errorf("Close removed %v, want the carved %q", tt.sys.removed, tt.made)
			}
			if tt.made == "" && len(tt.sys.removed) != 0 {
				t.Errorf("Close removed %v, which it did not create", tt.sys.removed)
			}
			if got := len(tt.sys.delegated) > 0; got != tt.delegate {
				t.Errorf("delegated %v, want %v", tt.sys.delegated, tt.delegate)
			}
			if tt.made != "" && (len(tt.sys.made) != 1 || tt.sys.made[0] != tt.made) {
				t.Errorf("made %v, want %q", tt.sys.made, tt.made)
			}
		})
	}
}

func TestNoGrantsDirMeansGrantsInClone(t *testing.T) {
	h := newTestHome(t, Config{})
	ch, err := h.Grants(context.Background())
	if err != nil || ch != nil {
		t.Fatalf("Grants = %v, %v; want a nil channel and no error", ch, err)
	}
	if h.Name() != "standalone" || h.Scope() != nil || h.SelfAdmitUID() != "" {
		t.Errorf("Name %q Scope %v SelfAdmitUID %q", h.Name(), h.Scope(), h.SelfAdmitUID())
	}
	if tok, ok := h.OwnGrant(); ok || tok != nil {
		t.Errorf("OwnGrant = %q, %v; want none", tok, ok)
	}
	h.Close()
	h.Close()
}

func TestGrantsFromTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "grants") // New creates it
	clk := clocktesting.NewFakeClock(t0)
	h := newTestHome(t, Config{GrantsDir: dir, Clock: clk})
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("grants dir: %v, %v; want created 0700", fi, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := h.Grants(ctx)
	if err != nil || ch == nil {
		t.Fatalf("Grants = %v, %v", ch, err)
	}
	if _, err := h.Grants(ctx); err == nil {
		t.Error("a second Grants succeeded")
	}

	tok := mintToken(t, "g-one")
	if err := core.WriteFileAtomic(filepath.Join(dir, "one.jwt"), tok, 0o600); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, clk, ch)
	if ev.Kind != home.GrantAdded || ev.UID != "g-one" || string(ev.Token) != string(tok) {
		t.Fatalf("event %v %q, want GrantAdded g-one with the token", ev.Kind, ev.UID)
	}

	os.Remove(filepath.Join(dir, "one.jwt"))
	ev = nextEvent(t, clk, ch)
	if ev.Kind != home.GrantRemoved || ev.UID != "g-one" {
		t.Fatalf("event %v %q, want GrantRemoved g-one", ev.Kind, ev.UID)
	}

	// Close ends the lane even while Grants' context is alive.
	h.Close()
	for range ch {
	}
}

func TestHealthFollowsKeyRefreshes(t *testing.T) {
	iss := granttest.NewIssuer(granttest.Options{})
	t.Cleanup(iss.Close)
	clk := clocktesting.NewFakeClock(t0)
	cache, err := grant.NewCache(iss.URL, grant.CacheOptions{Clock: clk, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 30 * time.Second
	h := newTestHome(t, Config{Cache: cache, StaleTTL: ttl, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "the first refresh", func() bool { return !cache.LastRefresh().IsZero() })
	if !h.Health().Healthy() {
		t.Fatal("unhealthy after a successful refresh")
	}

	// The issuer fails: after StaleTTL without a refresh the home is
	// unhealthy, one refresh per RefreshInterval (ttl/3) being tried.
	iss.SetFailing(true)
	for i := 1; i <= 3; i++ {
		n := iss.DiscoveryHits()
		stepTicker(t, clk, ttl/3)
		waitFor(t, fmt.Sprintf("failed refresh %d", i), func() bool { return iss.DiscoveryHits() > n })
	}
	if h.Health().Healthy() {
		t.Fatal("healthy after StaleTTL of failed refreshes")
	}

	// The issuer answers again: the next refresh makes it healthy.
	iss.SetFailing(false)
	last := cache.LastRefresh()
	stepTicker(t, clk, ttl/3)
	waitFor(t, "a refresh after the outage", func() bool { return cache.LastRefresh().After(last) })
	if !h.Health().Healthy() {
		t.Fatal("unhealthy after the issuer answered again")
	}

	// The admin override wins over refreshes until lifted.
	h.SetIssuerReachable(false)
	if h.Health().Healthy() {
		t.Fatal("healthy while marked unreachable")
	}
	h.SetIssuerReachable(true)
	if !h.Health().Healthy() {
		t.Fatal("unhealthy after the override was lifted")
	}

	// A second Run returns at once.
	h.Run(ctx)
}

func TestHealthWithoutIssuerNeverStales(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	h := newTestHome(t, Config{Clock: clk, StaleTTL: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	clk.Step(365 * 24 * time.Hour)
	if !h.Health().Healthy() {
		t.Fatal("a home without an issuer went unhealthy")
	}
	h.SetIssuerReachable(false)
	if h.Health().Healthy() {
		t.Fatal("the override did not make it unhealthy")
	}
	cancel()
	<-done
}

func TestDevices(t *testing.T) {
	h := newTestHome(t, Config{})
	ch, release, err := h.Devices(context.Background(), core.Grant{UID: "g"})
	if err != nil || ch.Kind != core.DeviceKindNone || len(ch.Devices) != 0 {
		t.Fatalf("Devices without -devices = %+v, %v", ch, err)
	}
	release()

	devs := []string{"/dev/nvidia0", "/dev/nvidiactl"}
	h = newTestHome(t, Config{Devices: devs})
	devs[0] = "changed by the caller"
	ch, release, err = h.Devices(context.Background(), core.Grant{UID: "g"})
	if err != nil || ch.Kind != core.DeviceKindStatic || strings.Join(ch.Devices, ",") != "/dev/nvidia0,/dev/nvidiactl" {
		t.Fatalf("Devices = %+v, %v; want the static set", ch, err)
	}
	ch.Devices[0] = "changed by the agent"
	again, _, _ := h.Devices(context.Background(), core.Grant{UID: "h"})
	if again.Devices[0] != "/dev/nvidia0" {
		t.Fatalf("the home's device set was shared with a caller: %v", again.Devices)
	}
	release()
}

func TestPublishReady(t *testing.T) {
	h := newTestHome(t, Config{})
	ctx := context.Background()
	if h.Ready() {
		t.Fatal("ready before any template is warm")
	}
	steps := []struct {
		uid   string
		ready bool
		want  bool
	}{
		{"a", true, true},
		{"b", true, true},
		{"a", false, true},
		{"b", false, false},
		{"b", false, false},
	}
	for _, s := range steps {
		if err := h.PublishReady(ctx, s.uid, s.ready); err != nil {
			t.Fatal(err)
		}
		if h.Ready() != s.want {
			t.Fatalf("after PublishReady(%s, %v): Ready = %v, want %v", s.uid, s.ready, h.Ready(), s.want)
		}
	}
}

// --- helpers

func newTestHome(t *testing.T, cfg Config) *Home {
	t.Helper()
	h, err := newHome(base(cfg), &fakeCgroups{mountErr: errors.ErrUnsupported})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

func mustCache(t *testing.T, url string) *grant.Cache {
	c, err := grant.NewCache(url, grant.CacheOptions{Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mintToken(t *testing.T, uid string) []byte {
	t.Helper()
	key, err := grant.GenerateKey("EdDSA", "k1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := grant.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Mint(core.Grant{
		UID: uid, Issuer: "https://issuer.test", Audience: "node",
		Template: "counter@sha256:" + strings.Repeat("ab", 32),
		Fibers:   core.Fibers{Max: 2}, IssuedAt: t0, Expiry: t0.Add(time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// nextEvent steps the lane's ticker until an event arrives.
func nextEvent(t *testing.T, clk *clocktesting.FakeClock, ch <-chan home.GrantEvent) home.GrantEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("lane closed")
			}
			return ev
		case <-time.After(20 * time.Millisecond):
		}
		if clk.HasWaiters() {
			clk.Step(home.DefaultGrantsPoll)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no lane event within 10s")
	return home.GrantEvent{}
}

// stepTicker waits for Run's ticker, then steps the clock by d.
func stepTicker(t *testing.T, clk *clocktesting.FakeClock, d time.Duration) {
	t.Helper()
	waitFor(t, "Run's ticker", clk.HasWaiters)
	clk.Step(d)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

package kubernetes_test

import (
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/kubernetes/fake"
)

// "Validate reports the first thing wrong with c, after defaults", naming
// the field and the fix.
func TestValidate(t *testing.T) {
	valid := func() kubernetes.Config {
		return kubernetes.Config{Kube: fake.New(), PodName: testPod, PodNamespace: testNS, PodUID: testUID}
	}
	fetch := func(c *kubernetes.Config) {
		c.GrantTokenFile = "/var/run/secrets/tokens/grant"
		c.GrantIssuerURL = "https://controller.fiberd-system.svc"
		c.GrantsDir = "/var/lib/fiberd/grants"
	}
	tests := []struct {
		name   string
		mutate func(*kubernetes.Config)
		want   []string // substrings of the error; nil = valid
	}{
		{"defaults fill the rest", func(*kubernetes.Config) {}, nil},
		{"fetch on", fetch, nil},
		{"fetch on, URL with a slash", func(c *kubernetes.Config) { fetch(c); c.GrantIssuerURL += "/" }, nil},
		{"Kube", func(c *kubernetes.Config) { c.Kube = nil }, []string{"Kube", "NewKube"}},
		{"PodName", func(c *kubernetes.Config) { c.PodName = "" }, []string{"PodName", "metadata.name"}},
		{"PodNamespace", func(c *kubernetes.Config) { c.PodNamespace = "" }, []string{"PodNamespace", "metadata.namespace"}},
		{"PodUID", func(c *kubernetes.Config) { c.PodUID = "" }, []string{"PodUID", "metadata.uid"}},
		{"StaleTTL negative", func(c *kubernetes.Config) { c.StaleTTL = -time.Second }, []string{"StaleTTL", "positive"}},
		{"Poll negative", func(c *kubernetes.Config) { c.Poll = -time.Second }, []string{"Poll", "positive"}},
		{"Poll not below StaleTTL", func(c *kubernetes.Config) { c.StaleTTL = 10 * time.Second; c.Poll = 10 * time.Second }, []string{"Poll", "below StaleTTL"}},
		{"Poll above the default StaleTTL", func(c *kubernetes.Config) { c.Poll = time.Minute }, []string{"Poll", "StaleTTL"}},
		// Every duration must be positive after defaults: a StaleTTL of
		// 1ns leaves a Poll of 0, which no ticker takes.
		{"Poll zero after defaults", func(c *kubernetes.Config) { c.StaleTTL = time.Nanosecond }, []string{"Poll", "StaleTTL", "at least 200ms"}},
		// Absurdly short durations: a busy loop, a home that can hardly be
		// healthy (design decision 90).
		{"Poll 1ns", func(c *kubernetes.Config) { c.Poll = time.Nanosecond }, []string{"Poll 1ns", "at least 100ms"}},
		{"Poll below 100ms", func(c *kubernetes.Config) { c.Poll = 99 * time.Millisecond }, []string{"Poll 99ms", "at least 100ms"}},
		{"Poll 100ms", func(c *kubernetes.Config) { c.Poll = 100 * time.Millisecond }, nil},
		{"StaleTTL 2ns", func(c *kubernetes.Config) { c.StaleTTL = 2 * time.Nanosecond }, []string{"half of StaleTTL 2ns", "StaleTTL of at least 200ms"}},
		{"StaleTTL 200ms", func(c *kubernetes.Config) { c.StaleTTL = 200 * time.Millisecond }, nil},
		{"GrantsPoll negative", func(c *kubernetes.Config) { c.GrantsPoll = -1 }, []string{"GrantsPoll", "at least 10ms"}},
		{"GrantsPoll 1ns", func(c *kubernetes.Config) { c.GrantsPoll = time.Nanosecond }, []string{"GrantsPoll 1ns", "at least 10ms"}},
		{"GrantsPoll 10ms", func(c *kubernetes.Config) { c.GrantsPoll = 10 * time.Millisecond }, nil},
		{"GrantFetchTimeout negative", func(c *kubernetes.Config) { c.GrantFetchTimeout = -1 }, []string{"GrantFetchTimeout", "positive"}},
		{"Family unknown", func(c *kubernetes.Config) { c.Family = endpoint.Family(9) }, []string{"Family", "endpoint.Inet4"}},
		{"CgroupRoot relative", func(c *kubernetes.Config) { c.CgroupRoot = "sys/fs/cgroup" }, []string{"CgroupRoot", "absolute"}},
		{"token without GrantsDir", func(c *kubernetes.Config) { fetch(c); c.GrantsDir = "" }, []string{"GrantsDir", "GrantTokenFile"}},
		{"token without URL", func(c *kubernetes.Config) { fetch(c); c.GrantIssuerURL = "" }, []string{"GrantIssuerURL", "https"}},
		{"token with http URL", func(c *kubernetes.Config) { fetch(c); c.GrantIssuerURL = "http://controller" }, []string{"GrantIssuerURL", "https"}},
		{"token with hostless URL", func(c *kubernetes.Config) { fetch(c); c.GrantIssuerURL = "https:///x" }, []string{"GrantIssuerURL", "https"}},
		{"token with query", func(c *kubernetes.Config) { fetch(c); c.GrantIssuerURL = "https://c/?a=b" }, []string{"GrantIssuerURL", "query"}},
		{"http URL without a token is unused", func(c *kubernetes.Config) { c.GrantIssuerURL = "http://controller" }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// New refuses what Validate refuses.
func TestNewValidates(t *testing.T) {
	if _, err := kubernetes.New(t.Context(), kubernetes.Config{}); err == nil || !strings.Contains(err.Error(), "Kube") {
		t.Fatalf("New(zero Config) = %v, want Validate's error", err)
	}
	// A StaleTTL too short to poll within is refused here, not by a panic
	// in Run.
	cfg := baseConfig(t, newWorld(), newClock())
	cfg.StaleTTL = time.Nanosecond
	if h, err := kubernetes.New(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "Poll") {
		if h != nil {
			h.Close()
		}
		t.Fatalf("New with StaleTTL 1ns = %v, want Validate's error naming Poll", err)
	}
}

// A GrantCAFile that is missing or holds no certificate fails New with the
// path and the fix.
func TestNewBadGrantCAFile(t *testing.T) {
	srv := newGrantServer(t)
	for _, ca := range []string{"/nonexistent/ca.pem", srv.saFile} {
		k := newWorld()
		cfg := baseConfig(t, k, newClock())
		srv.configure(t, &cfg)
		cfg.GrantCAFile = ca
		_, err := kubernetes.New(t.Context(), cfg)
		if err == nil || !strings.Contains(err.Error(), ca) || !strings.Contains(err.Error(), "GrantCAFile") {
			t.Fatalf("New with GrantCAFile %s: %v; want an error naming it", ca, err)
		}
		if srv.count() != 0 {
			t.Fatal("fetched without a usable CA")
		}
	}
}

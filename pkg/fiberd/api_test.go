package fiberd

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	homefake "fiberd.io/fiberd/pkg/home/fake"
	"fiberd.io/fiberd/pkg/template"
)

// TestStrictJSON: unknown members at any depth, names in the wrong case,
// repeated members, trailing data and wrong types are 400; a body over the
// cap is 413, refused before it is read when its length is declared.
func TestStrictJSON(t *testing.T) {
	e := newEnv(t)
	bad := []string{
		`{"grantUID":"g1","extra":1}`,
		`{"GrantUID":"g1"}`,
		`{"grantUID":"g1","grantUID":"g2"}`,
		`{"grantUID":"g1"} {}`,
		`{"grantUID":"g1"}x`,
		`{"grantUID":{"nested":"x"}}`,
		`{"payload":{"unknown":true}}`,
		`{"deadlineMs":"soon"}`,
		`[]`,
		``,
	}
	for _, b := range bad {
		if r := e.post(e.unix, "/v1/clone", b); r.status != 400 || r.apiError(t).Code != api.CodeInvalid {
			t.Errorf("clone %s: %d %s, want 400", b, r.status, r.body)
		}
	}
	if r := e.post(e.unix, "/v1/release", `{"fiberID":"g1/1/1","why":{"deep":1}}`); r.status != 400 {
		t.Errorf("release with an unknown member: %d, want 400", r.status)
	}

	// Declared length over the cap: refused before the body is read. The
	// reader fails the test if the server reads more than the cap.
	big := strings.Repeat("x", api.MaxRequestBody+1)
	req, err := http.NewRequest(http.MethodPost, "http://fiberd/v1/clone", &failAfter{t: t, r: strings.NewReader(big), limit: 4096})
	must(t, err)
	req.ContentLength = int64(len(big))
	resp, err := e.unix.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("declared oversized body: %d, want 413", resp.StatusCode)
		}
	}
	// Undeclared (chunked): cut at the cap.
	req, err = http.NewRequest(http.MethodPost, "http://fiberd/v1/clone", io.MultiReader(strings.NewReader(`{"grant":"`), strings.NewReader(big)))
	must(t, err)
	req.ContentLength = -1
	resp, err = e.unix.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked oversized body: %d, want 413", resp.StatusCode)
	}
}

// failAfter is a body that fails the test once more than limit bytes are
// read from it.
type failAfter struct {
	t     *testing.T
	r     io.Reader
	n     int
	limit int
}

func (f *failAfter) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	f.n += n
	if f.n > f.limit+len(p) {
		return n, errors.New("server kept reading an oversized body")
	}
	return n, err
}

// TestMetrics: /metrics exposes clones by kind and outcome, the latency
// histogram, running fibers per grant, warm templates, epoch, lane health.
func TestMetrics(t *testing.T) {
	e := newEnv(t)
	e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")})
	e.cloneReq(e.unix, api.CloneRequest{GrantUID: "nobody"})
	r := e.do(e.tcp, http.MethodGet, "/metrics", nil)
	for _, want := range []string{
		`fiberd_clones_total{kind="create",outcome="served"} 1`,
		`fiberd_clones_total{kind="none",outcome="deferred_fallback"} 1`,
		`fiberd_clone_duration_seconds_count{kind="create",outcome="served"} 1`,
		`fiberd_running_fibers{grant="g1"} 1`,
		`fiberd_warm_templates 1`,
		`fiberd_epoch 1`,
		`fiberd_lane_healthy 1`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %q:\n%s", want, r.body)
		}
	}
}

// TestStatusAndWatch: status lists the grant; watch streams a line now and
// one per change, and ends when the agent stops.
func TestStatusAndWatch(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1"))
	req, err := http.NewRequest(http.MethodGet, "http://fiberd/v1/watch", nil)
	must(t, err)
	resp, err := e.unix.Do(req)
	must(t, err)
	defer resp.Body.Close()
	lines := watchLines(resp.Body)
	next := func() api.Status {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("watch ended early")
			}
			var st api.Status
			must(t, json.Unmarshal([]byte(l), &st))
			return st
		case <-time.After(10 * time.Second):
			t.Fatal("no watch line")
		}
		return api.Status{}
	}
	if st := next(); len(st.Grants) != 1 || st.Grants[0].Running != 0 || !st.Grants[0].Warm || st.Grants[0].Tier != core.TierWarm {
		t.Fatalf("first watch line %+v", st)
	}
	e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "a"})
	for {
		st := next()
		if st.Grants[0].Running == 1 {
			g := st.Grants[0]
			if g.LatestFence == nil || g.LatestFence.Seq != 1 || len(g.Fibers) != 1 || g.Fibers[0].Session != "a" || !st.Ready || !st.Lane.Healthy {
				t.Fatalf("status after clone %+v", st)
			}
			break
		}
	}
	e.stop()
	for range lines {
	}
}

// TestConfigValidate: the start-up rules, each refusal naming its field.
func TestConfigValidate(t *testing.T) {
	basic := fake.New(core.TierBasic, fake.Hooks{})
	t.Cleanup(func() { _ = basic.Close() })
	base := func() Config {
		return Config{Home: newTestHome(clocktesting.NewFakeClock(testStart)), Issuer: testIssuer, NodeID: testNode, Keys: &switchKeys{},
			Templates: "/t", Basic: basic, StateDir: "/var/lib/fiberd"}
	}
	cases := []struct {
		name  string
		edit  func(*Config)
		field string // "" = valid
	}{
		{"defaults", func(c *Config) {}, ""},
		{"no home", func(c *Config) { c.Home = nil }, "Home"},
		{"no issuer", func(c *Config) { c.Issuer = "" }, "Issuer"},
		{"no node", func(c *Config) { c.NodeID = "" }, "NodeID"},
		{"no keys", func(c *Config) { c.Keys = nil }, "Keys"},
		{"no backend", func(c *Config) { c.Basic = nil }, "Warm and Basic"},
		{"relative state", func(c *Config) { c.StateDir = "state" }, "StateDir"},
		{"relative socket", func(c *Config) { c.Socket = "x.sock" }, "Socket"},
		{"tcp without tls", func(c *Config) { c.Listen = "127.0.0.1:8484" }, "Listen"},
		{"plaintext loopback", func(c *Config) { c.Listen = "127.0.0.1:8484"; c.InsecurePlaintext = true }, ""},
		{"plaintext localhost", func(c *Config) { c.Listen = "localhost:8484"; c.InsecurePlaintext = true }, ""},
		{"plaintext ipv6 loopback", func(c *Config) { c.Listen = "[::1]:8484"; c.InsecurePlaintext = true }, ""},
		{"plaintext wildcard", func(c *Config) { c.Listen = ":8484"; c.InsecurePlaintext = true }, "Listen"},
		{"plaintext non-loopback", func(c *Config) { c.Listen = "10.0.0.7:8484"; c.InsecurePlaintext = true }, "Listen"},
		{"plaintext named non-loopback", func(c *Config) {
			c.Listen = "10.0.0.7:8484"
			c.InsecurePlaintext, c.InsecureAllowNonLoopback = true, true
		}, ""},
		{"tls partial", func(c *Config) { c.TLSCert, c.TLSKey = "/c", "/k" }, "TLSCert, TLSKey and ClientCA"},
		{"tls full", func(c *Config) { c.Listen = "0.0.0.0:8484"; c.TLSCert, c.TLSKey, c.ClientCA = "/c", "/k", "/ca" }, ""},
		{"bad listen", func(c *Config) { c.Listen = "8484"; c.InsecurePlaintext = true }, "Listen"},
		{"negative rate", func(c *Config) { c.ThrashRate = -1 }, "ThrashRate"},
		{"infinite rate", func(c *Config) { c.ThrashRate = math.Inf(1) }, "ThrashRate"},
		{"relative templates", func(c *Config) { c.Templates = "t" }, "Templates"},
		{"listen port out of range", func(c *Config) { c.Listen = "127.0.0.1:70000"; c.InsecurePlaintext = true }, "Listen"},
		{"negative deny", func(c *Config) { c.DenyFor = -time.Second }, "DenyFor"},
		{"negative budget interval", func(c *Config) { c.BudgetInterval = -time.Second }, "BudgetInterval"},
		{"pressure threshold", func(c *Config) { c.PressureThreshold = DefaultPressureThreshold }, ""},
		{"negative pressure threshold", func(c *Config) { c.PressureThreshold = -1 }, "PressureThreshold"},
		{"pressure threshold over 100", func(c *Config) { c.PressureThreshold = 100.5 }, "PressureThreshold"},
		{"pressure threshold NaN", func(c *Config) { c.PressureThreshold = math.NaN() }, "PressureThreshold"},
		{"endpoint host family", func(c *Config) { c.EndpointFamily = 1; c.EndpointHost = "::1" }, "EndpointHost"},
		{"admin unsafe", func(c *Config) { c.AdminUnsafe = true }, map[bool]string{true: "", false: "AdminUnsafe"}[TestHooks]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			err := c.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, core.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate = %v, want an ErrInvalid naming %s", err, tc.field)
			}
		})
	}
	// ValidateSettings is Validate without the parts a caller builds.
	c := base()
	c.Home, c.Keys, c.Basic = nil, nil, nil
	if err := c.ValidateSettings(); err != nil {
		t.Errorf("ValidateSettings without the parts: %v", err)
	}
	c.Issuer = ""
	if err := c.ValidateSettings(); err == nil || !strings.Contains(err.Error(), "Issuer") {
		t.Errorf("ValidateSettings without an issuer: %v", err)
	}
}

// TestNewRefusesAndLeavesParts: a Config Validate refuses leaves the home
// and backends the caller built untouched: they are still the caller's.
func TestNewRefusesAndLeavesParts(t *testing.T) {
	h := newTestHome(clocktesting.NewFakeClock(testStart))
	b := fake.New(core.TierBasic, fake.Hooks{})
	_, err := New(context.Background(), Config{Home: h, Issuer: testIssuer, NodeID: testNode, Keys: &switchKeys{},
		Templates: "/t", Basic: b, StateDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "TLS") || !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("New with plaintext TCP and no -insecure-plaintext: %v", err)
	}
	if n := h.Closes(); n != 0 {
		t.Errorf("home closed %d times by a refused New, want 0", n)
	}
	if err := b.Warm(context.Background(), backend.WarmRequest{Grant: core.Grant{UID: "g"}, Spec: template.Spec{Command: "/bin/true"}, RunDir: t.TempDir()}); err != nil {
		t.Errorf("backend unusable after a refused New: %v", err)
	}
	b.Close()
}

// TestNewFailsCleanlyWhenTheAddressIsTaken: a failure after New has begun
// building (here the TCP address is in use) is an error naming the address,
// not a panic, and leaves no listener, home or backend open.
func TestNewFailsCleanlyWhenTheAddressIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	h := newTestHome(clocktesting.NewFakeClock(testStart))
	b := fake.New(core.TierBasic, fake.Hooks{})
	state := t.TempDir()
	_, err = New(context.Background(), Config{Home: h, Issuer: testIssuer, NodeID: testNode, Keys: &switchKeys{},
		Templates: "/t", Basic: b, StateDir: state, Listen: taken.Addr().String(), InsecurePlaintext: true})
	if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
		t.Fatalf("New on a taken address: %v, want an error naming %s", err, taken.Addr())
	}
	if n := h.Closes(); n != 1 {
		t.Errorf("home closed %d times, want 1", n)
	}
	if _, ok := <-b.Exits(); ok {
		t.Errorf("backend not closed")
	}
	// The unix sockets bound before the TCP listener failed are closed: a
	// new agent on the same state directory can bind them again.
	h2 := newTestHome(clocktesting.NewFakeClock(testStart))
	a, err := New(context.Background(), Config{Home: h2, Issuer: testIssuer, NodeID: testNode, Keys: &switchKeys{},
		Templates: "/t", Basic: fake.New(core.TierBasic, fake.Hooks{}), StateDir: state, Listen: ""})
	if err != nil {
		t.Fatalf("second New on the same state directory: %v", err)
	}
	a.Close()
}

// waitingHome is a home that waits for its endpoint host until it is
// closed, as the Kubernetes home does while the kubelet has not written
// the Pod's IP.
type waitingHome struct {
	*homefake.Home
	asked  chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (h *waitingHome) EndpointHost() string {
	close(h.asked)
	<-h.closed
	return ""
}

func (h *waitingHome) Close() {
	h.Home.Close()
	h.once.Do(func() { close(h.closed) })
}

// TestNewStopsWhileTheHomeWaitsForItsAddress: the end of New's context
// (SIGTERM at start) ends the home's wait for its endpoint host, and New
// fails with the context's cause, leaving nothing open.
func TestNewStopsWhileTheHomeWaitsForItsAddress(t *testing.T) {
	h := &waitingHome{Home: newTestHome(clocktesting.NewFakeClock(testStart)), asked: make(chan struct{}), closed: make(chan struct{})}
	b := fake.New(core.TierBasic, fake.Hooks{})
	ctx, cancel := context.WithCancelCause(context.Background())
	sigterm := errors.New("SIGTERM")
	go func() {
		<-h.asked
		cancel(sigterm)
	}()
	done := make(chan error, 1)
	go func() {
		a, err := New(ctx, Config{Home: h, Issuer: testIssuer, NodeID: testNode, Keys: &switchKeys{}, Templates: "/t", Basic: b,
			StateDir: t.TempDir(), EndpointFamily: endpoint.Inet4, EndpointHost: "127.0.0.1"})
		if a != nil {
			a.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, sigterm) || !strings.Contains(err.Error(), "endpoint host") {
			t.Fatalf("New cut short: %v, want the context's cause, saying what it waited for", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("New still waits for the home's endpoint host after its context ended")
	}
	if _, ok := <-b.Exits(); ok {
		t.Errorf("backend not closed")
	}
}

// TestTLS: the TCP listener speaks TLS 1.3 only and needs a client
// certificate chained to the client CA; such callers are authenticated and
// may self-admit.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t, "client-ca")
	sca, scaKey := newCA(t, "server-ca")
	writeCert(t, filepath.Join(dir, "ca.pem"), ca, nil)
	srv, srvKey := leafCert(t, sca, scaKey, "fiberd", true)
	writeCert(t, filepath.Join(dir, "srv.pem"), srv, nil)
	writeCert(t, filepath.Join(dir, "srv.key"), nil, srvKey)
	cli, cliKey := leafCert(t, ca, caKey, "caller", false)
	stranger, strangerKey := leafCert(t, sca, scaKey, "stranger", false)

	e := newEnv(t, withHome(func(c *homefake.Config) { c.SelfAdmitUID = "pod-uid-1" }), withConfig(func(c *Config) {
		c.InsecurePlaintext = false
		c.TLSCert, c.TLSKey, c.ClientCA = filepath.Join(dir, "srv.pem"), filepath.Join(dir, "srv.key"), filepath.Join(dir, "ca.pem")
	}))
	e.home.SetOwnGrant([]byte(e.mint("pod-uid-1")))
	roots := x509.NewCertPool()
	roots.AddCert(sca)
	client := func(cert *x509.Certificate, key *ecdsa.PrivateKey, maxVersion uint16) *http.Client {
		tc := &tls.Config{RootCAs: roots, ServerName: "fiberd", MaxVersion: maxVersion}
		if cert != nil {
			tc.Certificates = []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}}
		}
		tr := &http.Transport{TLSClientConfig: tc}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	url := "https://" + e.agent.Addr().String() + "/v1/clone"
	body := `{"grantUID":"pod-uid-1"}`

	resp, err := client(cli, cliKey, 0).Post(url, "application/json", strings.NewReader(body))
	must(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS.Version != tls.VersionTLS13 {
		t.Fatalf("clone with a client certificate: %d %s", resp.StatusCode, b)
	}
	for name, c := range map[string]*http.Client{
		"no client certificate": client(nil, nil, 0),
		"foreign client CA":     client(stranger, strangerKey, 0),
		"TLS 1.2":               client(cli, cliKey, tls.VersionTLS12),
		"plaintext":             {},
	} {
		u := url
		if name == "plaintext" {
			u = strings.Replace(url, "https", "http", 1)
		}
		resp, err := c.Post(u, "application/json", strings.NewReader(body))
		if err == nil {
			if resp.StatusCode == 200 {
				t.Errorf("%s: served", name)
			}
			resp.Body.Close()
		}
		if name == "plaintext" && (err != nil || resp.StatusCode != http.StatusBadRequest) {
			t.Errorf("plain HTTP to the TLS listener: %v, want a 400 saying so", err)
		}
	}
}

func newCA(t *testing.T, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	c, err := x509.ParseCertificate(der)
	must(t, err)
	return c, key
}

func leafCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, server bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{cn}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	must(t, err)
	c, err := x509.ParseCertificate(der)
	must(t, err)
	return c, key
}

func writeCert(t *testing.T, path string, c *x509.Certificate, key *ecdsa.PrivateKey) {
	var buf bytes.Buffer
	if c != nil {
		must(t, pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	if key != nil {
		der, err := x509.MarshalECPrivateKey(key)
		must(t, err)
		must(t, pem.Encode(&buf, &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	}
	must(t, os.WriteFile(path, buf.Bytes(), 0o600))
}

// TestAdminSocket: the admin socket answers /healthz; the test-only routes
// do not exist without the testhooks tag (admin_hooks_test.go covers the
// tagged build). The private directory is 0700 and the sockets 0600.
func TestAdminSocket(t *testing.T) {
	e := newEnv(t)
	admin := adminClient(t, e.agent.AdminSocketPath())
	if r := adminDo(t, admin, http.MethodGet, "/healthz", ""); r.status != 200 {
		t.Fatalf("admin healthz: %d", r.status)
	}
	if !TestHooks {
		for _, p := range []string{"/issuer", "/scope-lost"} {
			if r := adminDo(t, admin, http.MethodPost, p, `{"reachable":false}`); r.status != 404 {
				t.Errorf("POST %s without testhooks: %d, want 404", p, r.status)
			}
		}
	}
	for path, want := range map[string]os.FileMode{
		filepath.Dir(e.agent.AdminSocketPath()): 0o700,
		e.agent.AdminSocketPath():               0o600,
		e.agent.SocketPath():                    0o600,
	} {
		fi, err := os.Stat(path)
		must(t, err)
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
}

func adminClient(t *testing.T, sock string) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func adminDo(t *testing.T, c *http.Client, method, path, body string) reply {
	req, err := http.NewRequest(method, "http://admin"+path, strings.NewReader(body))
	must(t, err)
	resp, err := c.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestServeFailureEndsRun: when the API's listener breaks, Run drains and
// returns the server's error, naming the address.
func TestServeFailureEndsRun(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1"))
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	sock := e.agent.SocketPath()
	must(t, e.agent.apiUnix.Close()) // the socket breaks under the server
	select {
	case err := <-e.runErr:
		if err == nil || !strings.Contains(err.Error(), sock) {
			t.Fatalf("Run returned %v, want the server's error naming %s", err, sock)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its server failed")
	}
	e.runErr <- nil // for e.stop
	if n := len(e.warm.Running("")); n != 0 {
		t.Errorf("%d fibers run after Run returned", n)
	}
	if n := e.home.Closes(); n != 1 {
		t.Errorf("home closed %d times, want 1", n)
	}
}

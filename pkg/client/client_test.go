package client

import (
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
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeAgent answers the API the way fiberd's server does, from a table of
// canned answers keyed by path.
type fakeAgent struct {
	t       *testing.T
	answers map[string]answer
	seen    chan *http.Request
}

type answer struct {
	status int
	header map[string]string
	body   string
}

func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.seen != nil {
		body, _ := io.ReadAll(r.Body)
		r2 := r.Clone(context.Background())
		r2.Body = io.NopCloser(strings.NewReader(string(body)))
		f.seen <- r2
	}
	a, ok := f.answers[r.Method+" "+r.URL.Path]
	if !ok {
		http.Error(w, "no route", http.StatusNotFound)
		return
	}
	for k, v := range a.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

func newClient(t *testing.T, addr string) *Client {
	t.Helper()
	c, err := New(Config{Addr: addr})
	if err != nil {
		t.Fatalf("New(%q): %v", addr, err)
	}
	t.Cleanup(c.http.CloseIdleConnections)
	return c
}

func TestCloneServed(t *testing.T) {
	want := api.CloneResponse{
		FiberID:  "g1/3/7",
		Endpoint: "tcp://127.0.0.1:30001",
		Fence:    core.Fence{GrantUID: "g1", Epoch: 3, Seq: 7},
		Kind:     api.KindCreate,
	}
	b, _ := json.Marshal(want)
	agent := &fakeAgent{t: t, seen: make(chan *http.Request, 1), answers: map[string]answer{
		"POST /v1/clone": {status: 200, body: string(b)},
	}}
	srv := httptest.NewServer(agent)
	defer srv.Close()
	c := newClient(t, srv.Listener.Addr().String())

	got, err := c.Clone(context.Background(), api.CloneRequest{GrantUID: "g1", Session: "s", Payload: []byte("hi"), ReleaseKey: "k3y"})
	if err != nil {
		t.Fatalf("Clone: %v", err)
	}
	if got != want {
		t.Errorf("Clone = %+v, want %+v", got, want)
	}
	r := <-agent.seen
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	var sent api.CloneRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sent); err != nil {
		t.Fatalf("the request body does not decode strictly: %v", err)
	}
	if sent.GrantUID != "g1" || sent.Session != "s" || string(sent.Payload) != "hi" || sent.ReleaseKey != "k3y" {
		t.Errorf("sent %+v", sent)
	}
}

func TestRefusals(t *testing.T) {
	tests := []struct {
		name      string
		ans       answer
		wantIs    error
		shed      bool
		deferred  bool
		notFound  bool
		retry     time.Duration
		wantInMsg string
	}{
		{
			name: "shed with Retry-After header",
			ans: answer{status: 429, header: map[string]string{"Retry-After": "3"},
				body: `{"code":"SHED","message":"at fibers.max","issuer":"https://iss"}`},
			shed: true, retry: 3 * time.Second, wantInMsg: "SHED: at fibers.max (issuer https://iss)",
		},
		{
			name: "shed with retry in body",
			ans:  answer{status: 429, body: `{"code":"SHED","message":"thrash","retryAfterSeconds":5}`},
			shed: true, retry: 5 * time.Second, wantInMsg: "retry after 5s",
		},
		{
			name:     "deferred",
			ans:      answer{status: 503, body: `{"code":"DEFERRED_FALLBACK","message":"unknown grant","issuer":"https://iss"}`},
			deferred: true, wantInMsg: "503 DEFERRED_FALLBACK",
		},
		{
			name:     "not found",
			ans:      answer{status: 404, body: `{"code":"NOT_FOUND","message":"fiber g/1/1 of epoch 1, now 2"}`},
			wantIs:   core.ErrNotFound,
			notFound: true,
		},
		{name: "invalid", ans: answer{status: 400, body: `{"code":"INVALID","message":"unknown field"}`}, wantIs: core.ErrInvalid},
		{name: "unauthenticated", ans: answer{status: 401, body: `{"code":"UNAUTHENTICATED","message":"bad sig"}`}, wantIs: core.ErrUnauthenticated},
		{name: "tier gap", ans: answer{status: 412, body: `{"code":"TIER_GAP","message":"no checkpoint"}`}, wantIs: core.ErrTierGap},
		{
			name:      "not an api.Error",
			ans:       answer{status: 502, body: "<html>bad gateway</html>"},
			wantInMsg: "502: <html>bad gateway</html>",
		},
		{name: "empty body", ans: answer{status: 500}, wantInMsg: "500: Internal Server Error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(&fakeAgent{t: t, answers: map[string]answer{"POST /v1/clone": tt.ans}})
			defer srv.Close()
			c := newClient(t, srv.URL)
			_, err := c.Clone(context.Background(), api.CloneRequest{GrantUID: "g1"})
			e, ok := AsError(err)
			if !ok {
				t.Fatalf("Clone error %v is not a *client.Error", err)
			}
			if e.Status != tt.ans.status {
				t.Errorf("Status = %d, want %d", e.Status, tt.ans.status)
			}
			if e.IsShed() != tt.shed || e.IsDeferred() != tt.deferred || e.IsMiss() != (tt.shed || tt.deferred) {
				t.Errorf("IsShed %v IsDeferred %v IsMiss %v", e.IsShed(), e.IsDeferred(), e.IsMiss())
			}
			if e.IsNotFound() != tt.notFound {
				t.Errorf("IsNotFound = %v", e.IsNotFound())
			}
			if e.RetryAfter() != tt.retry {
				t.Errorf("RetryAfter = %v, want %v", e.RetryAfter(), tt.retry)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.wantIs)
			}
			if m, ok := core.IsMiss(err); ok != (tt.shed || tt.deferred) {
				t.Errorf("core.IsMiss = %v", ok)
			} else if ok && m.RetryAfter != tt.retry {
				t.Errorf("miss RetryAfter = %v", m.RetryAfter)
			}
			if !strings.Contains(err.Error(), tt.wantInMsg) {
				t.Errorf("error %q does not contain %q", err, tt.wantInMsg)
			}
		})
	}
}

func TestReleaseParkStatusOverUnixSocket(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "f.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	st := api.Status{Home: "standalone", Epoch: 4, Lane: api.Lane{Healthy: true},
		Grants: []api.GrantStatus{{UID: "g1", Running: 2, Max: 64, Warm: true}}}
	sb, _ := json.Marshal(st)
	agent := &fakeAgent{t: t, seen: make(chan *http.Request, 8), answers: map[string]answer{
		"POST /v1/release": {status: 200, body: `{}`},
		"POST /v1/park":    {status: 412, body: `{"code":"TIER_GAP","message":"tier WARM has no checkpoint"}`},
		"GET /v1/status":   {status: 200, body: string(sb)},
		"GET /healthz":     {status: 200, body: "ok\n"},
	}}
	srv := &http.Server{Handler: agent}
	go srv.Serve(ln)
	defer srv.Close()

	for _, addr := range []string{"unix://" + sock, sock} {
		c := newClient(t, addr)
		ctx := context.Background()
		if err := c.Release(ctx, "g1/4/1"); err != nil {
			t.Errorf("%s: Release: %v", addr, err)
		}
		r := <-agent.seen
		var fr api.FiberRequest
		if err := json.NewDecoder(r.Body).Decode(&fr); err != nil || fr.FiberID != "g1/4/1" {
			t.Errorf("release body %+v, %v", fr, err)
		}
		if _, err := c.Park(ctx, "g1/4/1"); !errors.Is(err, core.ErrTierGap) {
			t.Errorf("%s: Park = %v, want a tier gap", addr, err)
		}
		<-agent.seen
		// The proofs a plaintext listener asks for travel in the body.
		proof := api.FiberRequest{FiberID: "g1/4/1", ReleaseKey: "k3y", Grant: "a.b.c"}
		if err := c.ReleaseFiber(ctx, proof); err != nil {
			t.Errorf("%s: ReleaseFiber: %v", addr, err)
		}
		r = <-agent.seen
		if err := json.NewDecoder(r.Body).Decode(&fr); err != nil || fr != proof {
			t.Errorf("ReleaseFiber body %+v, %v; want %+v", fr, err, proof)
		}
		if _, err := c.ParkFiber(ctx, proof); !errors.Is(err, core.ErrTierGap) {
			t.Errorf("%s: ParkFiber = %v, want a tier gap", addr, err)
		}
		r = <-agent.seen
		if err := json.NewDecoder(r.Body).Decode(&fr); err != nil || fr != proof {
			t.Errorf("ParkFiber body %+v, %v; want %+v", fr, err, proof)
		}
		got, err := c.Status(ctx)
		if err != nil {
			t.Fatalf("%s: Status: %v", addr, err)
		}
		<-agent.seen
		if got.Epoch != 4 || len(got.Grants) != 1 || got.Grants[0].Running != 2 {
			t.Errorf("%s: Status = %+v", addr, got)
		}
		if err := c.Healthz(ctx); err != nil {
			t.Errorf("%s: Healthz: %v", addr, err)
		}
		<-agent.seen
	}
}

func TestWatchStreams(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/watch" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := uint64(1); i <= 2; i++ {
			json.NewEncoder(w).Encode(api.Status{Home: "standalone", Epoch: i})
			w.(http.Flusher).Flush()
		}
		select { // hold the stream open like a quiet agent
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	c := newClient(t, srv.URL)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := c.Watch(ctx)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for want := uint64(1); want <= 2; want++ {
		s, err := w.Next()
		if err != nil || s.Epoch != want {
			t.Fatalf("Next = %+v, %v; want epoch %d", s, err, want)
		}
	}
	// The stream outlives DefaultTimeout-style bounds: only ctx ends it.
	cancel()
	if _, err := w.Next(); err == nil {
		t.Fatal("Next after cancel returned no error")
	}
	w.Close()
	w.Close()
}

func TestWatchEOFAndRefusal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Refuse") != "" {
			return
		}
		json.NewEncoder(w).Encode(api.Status{Epoch: 9})
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	w, err := c.Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if s, err := w.Next(); err != nil || s.Epoch != 9 {
		t.Fatalf("Next = %+v, %v", s, err)
	}
	if _, err := w.Next(); err != io.EOF {
		t.Fatalf("Next at the end = %v, want io.EOF", err)
	}

	srv404 := httptest.NewServer(http.NotFoundHandler())
	defer srv404.Close()
	if _, err := newClient(t, srv404.URL).Watch(context.Background()); !errors.Is(err, core.ErrNotFound) && !strings.Contains(fmt.Sprint(err), "404") {
		t.Fatalf("Watch of a missing route = %v, want a 404", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		addr    string
		tls     bool
		base    string
		socket  string
		wantErr string
	}{
		{addr: "", wantErr: "Addr is empty"},
		{addr: "unix:///run/fiberd.sock", base: "http://fiberd", socket: "/run/fiberd.sock"},
		{addr: "/var/lib/fiberd/fiberd.sock", base: "http://fiberd", socket: "/var/lib/fiberd/fiberd.sock"},
		{addr: "unix://rel.sock", wantErr: "must be absolute"},
		{addr: "127.0.0.1:8484", base: "http://127.0.0.1:8484"},
		{addr: "127.0.0.1:8484", tls: true, base: "https://127.0.0.1:8484"},
		{addr: "[::1]:8484", base: "http://[::1]:8484"},
		{addr: "https://node1:8484", base: "https://node1:8484"},
		{addr: "http://node1:8484/v1", wantErr: "no path"},
		{addr: "localhost", wantErr: "want unix:///path or host:port"},
	}
	for _, tt := range tests {
		var tc *tls.Config
		if tt.tls {
			tc = &tls.Config{}
		}
		err := Config{Addr: tt.addr, TLS: tc}.Validate()
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate(%q) = %v, want %q", tt.addr, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Validate(%q) = %v", tt.addr, err)
			continue
		}
		base, socket, _ := parseAddr(tt.addr, tt.tls)
		if base != tt.base || socket != tt.socket {
			t.Errorf("parseAddr(%q) = %q, %q; want %q, %q", tt.addr, base, socket, tt.base, tt.socket)
		}
	}
	if err := (Config{Addr: "h:1", Timeout: -1}).Validate(); err == nil {
		t.Error("a negative Timeout validated")
	}
}

func TestTimeoutBoundsUnaryCalls(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-block:
		}
	}))
	defer srv.Close()
	defer close(block)
	c, err := New(Config{Addr: srv.URL, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.http.CloseIdleConnections()
	if _, err := c.Status(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Status against a silent agent = %v, want the deadline", err)
	}
}

func TestTLSWithClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t)
	serverCert := issue(t, ca, caKey, "server", x509.ExtKeyUsageServerAuth)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	clientDER, clientKey := issueDER(t, ca, caKey, "caller", x509.ExtKeyUsageClientAuth)
	writePEM(t, filepath.Join(dir, "client.pem"), "CERTIFICATE", clientDER)
	kb, _ := x509.MarshalECPrivateKey(clientKey)
	writePEM(t, filepath.Join(dir, "client-key.pem"), "EC PRIVATE KEY", kb)

	pool := x509.NewCertPool()
	pool.AddCert(ca)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"home":"standalone","epoch":2,"lane":{"healthy":true,"lastSync":"2026-01-01T00:00:00Z"},"ready":true,"grants":[]}`)
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{serverCert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	defer srv.Close()

	tc, err := TLSConfig(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem"), filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatalf("TLSConfig: %v", err)
	}
	c, err := New(Config{Addr: srv.Listener.Addr().String(), TLS: tc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.http.CloseIdleConnections()
	if st, err := c.Status(context.Background()); err != nil || st.Epoch != 2 {
		t.Fatalf("Status over TLS = %+v, %v", st, err)
	}

	// Without the client certificate the server refuses the handshake.
	bare, _ := TLSConfig("", "", filepath.Join(dir, "ca.pem"))
	c2, _ := New(Config{Addr: srv.Listener.Addr().String(), TLS: bare})
	defer c2.http.CloseIdleConnections()
	if _, err := c2.Status(context.Background()); err == nil {
		t.Fatal("a caller without a client certificate was served")
	}

	for _, bad := range [][3]string{
		{filepath.Join(dir, "client.pem"), "", ""},
		{"", "", filepath.Join(dir, "missing.pem")},
		{"", "", filepath.Join(dir, "client-key.pem")},
	} {
		if _, err := TLSConfig(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("TLSConfig(%q) succeeded", bad)
		}
	}
}

// shortTempDir is a temp dir short enough for a unix socket path.
func shortTempDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "fc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	return ca, key
}

func issueDER(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Unix(0, 0), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, usage x509.ExtKeyUsage) tls.Certificate {
	der, key := issueDER(t, ca, caKey, cn, usage)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t *testing.T, path, typ string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
		t.Fatal(err)
	}
}

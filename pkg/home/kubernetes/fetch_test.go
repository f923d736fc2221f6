package kubernetes_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/internal/logtest"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/grant/granttest"
	"fiberd.io/fiberd/pkg/home/kubernetes"
)

func newClock() *clocktesting.FakeClock { return clocktesting.NewFakeClock(epoch) }

// grantServer is the controller's grant endpoint over TLS. It records each
// request and answers with what respond says for the nth (from 1).
type grantServer struct {
	*httptest.Server
	mu       sync.Mutex
	paths    []string
	auths    []string
	respond  func(n int) (int, []byte)
	caFile   string
	saFile   string
	grantDir string
}

func newGrantServer(t *testing.T) *grantServer {
	t.Helper()
	s := &grantServer{respond: func(int) (int, []byte) { return http.StatusOK, token(testUID, epoch, epoch.Add(2*time.Hour)) }}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.paths = append(s.paths, r.URL.Path)
		s.auths = append(s.auths, r.Header.Get("Authorization"))
		n, respond := len(s.paths), s.respond
		s.mu.Unlock()
		code, body := respond(n)
		w.Header().Set("Content-Type", "application/jwt")
		w.WriteHeader(code)
		_, _ = w.Write(body)
	}))
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	s.StartTLS()
	t.Cleanup(s.Close)
	dir := t.TempDir()
	s.caFile = filepath.Join(dir, "ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
	if err := os.WriteFile(s.caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	s.saFile = filepath.Join(dir, "sa-token")
	s.setSAToken(t, "sa-token-1")
	s.grantDir = filepath.Join(dir, "grants")
	return s
}

func (s *grantServer) setSAToken(t *testing.T, tok string) {
	t.Helper()
	if err := os.WriteFile(s.saFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (s *grantServer) setRespond(fn func(n int) (int, []byte)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.respond = fn
}

func (s *grantServer) requests() (paths, auths []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.paths...), append([]string(nil), s.auths...)
}

func (s *grantServer) count() int {
	p, _ := s.requests()
	return len(p)
}

// configure turns the grant fetch on in c, against s.
func (s *grantServer) configure(t *testing.T, c *kubernetes.Config) {
	c.GrantsDir = s.grantDir
	c.GrantTokenFile = s.saFile
	c.GrantIssuerURL = s.URL
	c.GrantCAFile = s.caFile
}

func (s *grantServer) grantFile() string { return filepath.Join(s.grantDir, testUID+".jwt") }

// newAsync runs New in a goroutine, stepping clk by step whenever New
// waits between attempts, and returns what New returned. New waits on the
// clock in two ways: for the deadline of its first fetch
// (GrantFetchTimeout), all along, and for a backoff between attempts; only
// then are two waiters on the clock. Stepping only then cuts no attempt in
// flight short by fake time racing ahead of it.
func newAsync(t *testing.T, ctx context.Context, cfg kubernetes.Config, clk *clocktesting.FakeClock, step time.Duration) (*kubernetes.Home, error) {
	t.Helper()
	type result struct {
		h   *kubernetes.Home
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := kubernetes.New(ctx, cfg)
		done <- result{h, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case r := <-done:
			if r.h != nil {
				t.Cleanup(r.h.Close)
			}
			return r.h, r.err
		case <-time.After(200 * time.Microsecond):
			if time.Now().After(deadline) {
				t.Fatal("New did not return")
			}
			if clk.Waiters() >= 2 {
				clk.Step(step)
			}
		}
	}
}

// "With a grant token file, New fetches the Pod's grant before it
// returns": GET <GrantIssuerURL>/v1/grant with the Pod's token, written as
// GrantsDir/<PodUID>.jwt with mode 0600; OwnGrant "is the Pod's own grant,
// the file the grant fetch wrote".
func TestNewFetchesThePodsGrant(t *testing.T) {
	for _, suffix := range []string{"", "/"} {
		t.Run("url"+suffix, func(t *testing.T) {
			srv := newGrantServer(t)
			want := token(testUID, epoch, epoch.Add(2*time.Hour))
			h, _, _ := newHome(t, func(c *kubernetes.Config) {
				srv.configure(t, c)
				c.GrantIssuerURL += suffix
			})
			paths, auths := srv.requests()
			if len(paths) != 1 || paths[0] != "/v1/grant" || auths[0] != "Bearer sa-token-1" {
				t.Fatalf("requests %q with %q; want one GET /v1/grant with Bearer sa-token-1", paths, auths)
			}
			b, err := os.ReadFile(srv.grantFile())
			if err != nil || string(b) != string(want) {
				t.Fatalf("grant file: %q, %v; want the fetched token", b, err)
			}
			fi, _ := os.Stat(srv.grantFile())
			if fi.Mode().Perm() != 0o600 {
				t.Fatalf("grant file mode %v, want 0600", fi.Mode().Perm())
			}
			got, ok := h.OwnGrant()
			if !ok || string(got) != string(want) {
				t.Fatalf("OwnGrant() = %q, %v; want the fetched token", got, ok)
			}
		})
	}
}

// GrantTokenFile: "Empty means no fetch, and grants arrive only as
// files", even with a controller's URL set: no request, no own grant, and
// no renewal once the home runs.
func TestNoTokenFileNoFetch(t *testing.T) {
	srv := newGrantServer(t)
	k := newWorld()
	cfg := baseConfig(t, k, newClock())
	srv.configure(t, &cfg)
	cfg.GrantTokenFile = ""
	// A fetch would wait on the fake clock; the deadline ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := kubernetes.New(ctx, cfg)
	if err != nil {
		t.Fatalf("New without a token file: %v", err)
	}
	t.Cleanup(h.Close)
	run(t, h)
	rounds(t, k, 1)
	settle()
	if n := srv.count(); n != 0 {
		t.Fatalf("%d grant requests without a token file, want none", n)
	}
	if tok, ok := h.OwnGrant(); ok || tok != nil {
		t.Fatalf("OwnGrant() = %q, %v; want none", tok, ok)
	}
}

// "retrying for up to GrantFetchTimeout": a 404 means "not yet" and is
// retried, with backoff on the clock.
func TestNewRetriesUntilTheGrantComes(t *testing.T) {
	srv := newGrantServer(t)
	srv.setRespond(func(n int) (int, []byte) {
		if n <= 3 {
			return http.StatusNotFound, []byte("no grant for this pod yet")
		}
		return http.StatusOK, token(testUID, epoch, epoch.Add(2*time.Hour))
	})
	k := newWorld()
	clk := newClock()
	cfg := baseConfig(t, k, clk)
	srv.configure(t, &cfg)
	h, err := newAsync(t, context.Background(), cfg, clk, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if srv.count() != 4 {
		t.Fatalf("%d requests, want 4", srv.count())
	}
	if _, ok := h.OwnGrant(); !ok {
		t.Fatal("no own grant")
	}
	// Backoff: 500ms, 1s, 2s before the 2nd, 3rd and 4th request.
	if waited := clk.Since(epoch); waited < 3500*time.Millisecond {
		t.Fatalf("retried after %v in all, want backoff of at least 3.5s", waited)
	}
}

// "It fails when no grant came by then" ...
func TestNewFailsWhenNoGrantCameInTime(t *testing.T) {
	srv := newGrantServer(t)
	srv.setRespond(func(int) (int, []byte) { return http.StatusNotFound, nil })
	k := newWorld()
	clk := newClock()
	cfg := baseConfig(t, k, clk)
	srv.configure(t, &cfg)
	cfg.GrantFetchTimeout = 10 * time.Second
	h, err := newAsync(t, context.Background(), cfg, clk, 250*time.Millisecond)
	if err == nil || h != nil {
		t.Fatalf("New = %v, %v; want an error", h, err)
	}
	if waited := clk.Since(epoch); waited < 10*time.Second {
		t.Fatalf("gave up after %v, want GrantFetchTimeout (10s)", waited)
	}
	if !strings.Contains(err.Error(), "GrantFetchTimeout") {
		t.Errorf("error %q does not name the fix", err)
	}
}

// "retrying for up to GrantFetchTimeout. It fails when no grant came by
// then": every attempt ends when the clock passes GrantFetchTimeout, also
// one in flight to a controller that accepts the connection and never
// answers, before or after the TLS handshake.
func TestNewBoundsEveryAttemptByTheTimeLeft(t *testing.T) {
	for _, tt := range []struct {
		name  string
		serve func(t *testing.T) (url string, reached func() bool)
	}{
		{"no handshake", func(t *testing.T) (string, func() bool) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var conns []net.Conn
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					conns = append(conns, c) // held open, never written to
					mu.Unlock()
				}
			}()
			t.Cleanup(func() {
				ln.Close()
				mu.Lock()
				defer mu.Unlock()
				for _, c := range conns {
					c.Close()
				}
			})
			return "https://" + ln.Addr().String(), func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(conns) > 0
			}
		}},
		{"no answer", func(t *testing.T) (string, func() bool) {
			srv := newGrantServer(t)
			stop := make(chan struct{})
			t.Cleanup(func() { close(stop) }) // runs before the server's Close
			srv.setRespond(func(int) (int, []byte) {
				<-stop
				return http.StatusServiceUnavailable, nil
			})
			return srv.URL, func() bool { return srv.count() > 0 }
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, reached := tt.serve(t)
			srv := newGrantServer(t) // for its CA and token files
			clk := newClock()
			cfg := baseConfig(t, newWorld(), clk)
			srv.configure(t, &cfg)
			cfg.GrantIssuerURL = url
			cfg.GrantFetchTimeout = time.Second
			done := make(chan error, 1)
			go func() {
				h, err := kubernetes.New(context.Background(), cfg)
				if h != nil {
					h.Close()
				}
				done <- err
			}()
			eventually(t, "the first attempt reaching the controller", reached)
			clk.Step(time.Second)
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "GrantFetchTimeout") {
					t.Fatalf("New = %v, want the error naming GrantFetchTimeout", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("New still waits on an attempt in flight 5s after the clock passed GrantFetchTimeout")
			}
		})
	}
}

// DefaultGrantFetchTimeout "is how long New retries the first grant
// fetch": 60s.
func TestDefaultGrantFetchTimeout(t *testing.T) {
	if kubernetes.DefaultGrantFetchTimeout != 60*time.Second {
		t.Fatalf("DefaultGrantFetchTimeout = %v, want 60s", kubernetes.DefaultGrantFetchTimeout)
	}
	srv := newGrantServer(t)
	k := newWorld()
	clk := newClock()
	srv.setRespond(func(int) (int, []byte) {
		if clk.Since(epoch) < 55*time.Second {
			return http.StatusNotFound, nil
		}
		return http.StatusOK, token(testUID, epoch, epoch.Add(2*time.Hour))
	})
	cfg := baseConfig(t, k, clk)
	srv.configure(t, &cfg)
	if _, err := newAsync(t, context.Background(), cfg, clk, 250*time.Millisecond); err != nil {
		t.Fatalf("New gave up before the default 60s: %v", err)
	}
	// And it does give up.
	srv.setRespond(func(int) (int, []byte) { return http.StatusNotFound, nil })
	clk2 := newClock()
	cfg2 := baseConfig(t, newWorld(), clk2)
	srv.configure(t, &cfg2)
	if err := os.Remove(srv.grantFile()); err != nil {
		t.Fatal(err)
	}
	if _, err := newAsync(t, context.Background(), cfg2, clk2, 250*time.Millisecond); err == nil {
		t.Fatal("New never gave up")
	}
	if w := clk2.Since(epoch); w < 60*time.Second || w > 61*time.Second {
		t.Fatalf("gave up after %v, want 60s", w)
	}
}

// "... unless the grants directory holds an unexpired grant file for the
// Pod. Run renews the grant from there."
func TestNewFallsBackToAnUnexpiredGrantFile(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		tok   []byte
		works bool
	}{
		{"unexpired", testUID + ".jwt", token(testUID, epoch.Add(-50*time.Minute), epoch.Add(10*time.Minute)), true},
		{"expired", testUID + ".jwt", token(testUID, epoch.Add(-2*time.Hour), epoch), false},
		{"another pod's file", otherUID + ".jwt", token(otherUID, epoch, epoch.Add(time.Hour)), false},
		// "an unexpired grant file for the Pod": the file's name is not
		// enough, its token must be the Pod's grant.
		{"the Pod's file with another grant", testUID + ".jwt", token(otherUID, epoch, epoch.Add(time.Hour)), false},
		{"malformed", testUID + ".jwt", []byte("not a jwt"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newGrantServer(t)
			srv.setRespond(func(int) (int, []byte) { return http.StatusInternalServerError, []byte("controller down") })
			if err := os.MkdirAll(srv.grantDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(srv.grantDir, tt.file), tt.tok, 0o600); err != nil {
				t.Fatal(err)
			}
			k := newWorld()
			clk := newClock()
			cfg := baseConfig(t, k, clk)
			srv.configure(t, &cfg)
			cfg.GrantFetchTimeout = 2 * time.Second
			h, err := newAsync(t, context.Background(), cfg, clk, 250*time.Millisecond)
			if !tt.works {
				if err == nil {
					t.Fatal("New succeeded without a grant")
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if got, ok := h.OwnGrant(); !ok || string(got) != string(tt.tok) {
				t.Fatalf("OwnGrant() = %q, %v; want the file's grant", got, ok)
			}
			// Run renews it: its renewal time has passed, so at once.
			renewed := token(testUID, epoch, epoch.Add(2*time.Hour))
			srv.setRespond(func(int) (int, []byte) { return http.StatusOK, renewed })
			run(t, h)
			eventually(t, "the renewal", func() bool {
				b, _ := os.ReadFile(srv.grantFile())
				return string(b) == string(renewed)
			})
			eventually(t, "OwnGrant renewed", func() bool {
				got, _ := h.OwnGrant()
				return string(got) == string(renewed)
			})
		})
	}
}

// The fallback says why the grant file cannot stand in for the fetch: in
// a log line naming the file, and in New's error.
func TestNewSaysWhyTheGrantFileCannotStandIn(t *testing.T) {
	for _, tt := range []struct {
		name  string
		write func(t *testing.T, path string)
		why   string
	}{
		{"unreadable", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"another grant", func(t *testing.T, path string) {
			if err := os.WriteFile(path, token(otherUID, epoch, epoch.Add(time.Hour)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, otherUID},
		{"expired", func(t *testing.T, path string) {
			if err := os.WriteFile(path, token(testUID, epoch.Add(-2*time.Hour), epoch.Add(-time.Hour)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "expired"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newGrantServer(t)
			srv.setRespond(func(int) (int, []byte) { return http.StatusInternalServerError, []byte("controller down") })
			if err := os.MkdirAll(srv.grantDir, 0o700); err != nil {
				t.Fatal(err)
			}
			tt.write(t, srv.grantFile())
			logs := logtest.Recorder{}
			clk := newClock()
			cfg := baseConfig(t, newWorld(), clk)
			srv.configure(t, &cfg)
			cfg.Logger = logs.Logger()
			cfg.GrantFetchTimeout = time.Second
			_, err := newAsync(t, context.Background(), cfg, clk, 250*time.Millisecond)
			if err == nil {
				t.Fatal("New succeeded without a grant")
			}
			if !strings.Contains(err.Error(), tt.why) {
				t.Errorf("New's error %q does not say why the file cannot stand in (%q)", err, tt.why)
			}
			if l := logs.Matching(srv.grantFile(), tt.why); len(l) != 1 {
				t.Errorf("want one log line naming %s and %q; log:\n%s", srv.grantFile(), tt.why, logs.String())
			}
		})
	}
}

// "When ctx ends first, New closes the home and returns ctx's cause."
func TestNewReturnsTheCauseWhenCtxEnds(t *testing.T) {
	srv := newGrantServer(t)
	srv.setRespond(func(int) (int, []byte) { return http.StatusNotFound, nil })
	k := newWorld()
	clk := newClock()
	cfg := baseConfig(t, k, clk)
	srv.configure(t, &cfg)
	cause := errors.New("fiberd is stopping")
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		h, err := kubernetes.New(ctx, cfg)
		if h != nil {
			h.Close()
		}
		done <- err
	}()
	eventually(t, "a first request", func() bool { return srv.count() >= 1 })
	cancel(cause)
	select {
	case err := <-done:
		if !errors.Is(err, cause) {
			t.Fatalf("New returned %v, want the cause %v", err, cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("New did not return once ctx ended")
	}
}

// GrantCAFile: "the PEM CA bundle the grant endpoint's certificate must
// chain to. Empty means the system roots." The test server's certificate
// chains to no system root, nor to another server's CA.
func TestGrantFetchVerifiesTheCertificate(t *testing.T) {
	for _, tt := range []struct {
		name string
		ca   func(t *testing.T, srv *grantServer) string
	}{
		{"system roots", func(*testing.T, *grantServer) string { return "" }},
		{"another CA", func(t *testing.T, _ *grantServer) string { return otherCA(t) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newGrantServer(t)
			k := newWorld()
			clk := newClock()
			cfg := baseConfig(t, k, clk)
			srv.configure(t, &cfg)
			cfg.GrantCAFile = tt.ca(t, srv)
			cfg.GrantFetchTimeout = time.Second
			if _, err := newAsync(t, context.Background(), cfg, clk, 250*time.Millisecond); err == nil {
				t.Fatal("New fetched over an unverified TLS connection")
			}
			if srv.count() != 0 {
				t.Fatalf("the server answered %d requests over an untrusted connection", srv.count())
			}
		})
	}
}

// otherCA writes a PEM file of a fresh self-signed CA, which signed
// nothing the test servers present.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "another CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// 401 and 403 "are logged with the body's first line".
func TestRefusedFetchLogsTheBodysFirstLine(t *testing.T) {
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			srv := newGrantServer(t)
			srv.setRespond(func(int) (int, []byte) {
				return code, []byte("token audience is not the controller\nsecond line with details")
			})
			logs := logtest.Recorder{Verbosity: 1}
			k := newWorld()
			clk := newClock()
			cfg := baseConfig(t, k, clk)
			srv.configure(t, &cfg)
			cfg.Logger = logs.Logger()
			cfg.GrantFetchTimeout = time.Second
			_, err := newAsync(t, context.Background(), cfg, clk, 250*time.Millisecond)
			if err == nil {
				t.Fatal("New succeeded on a refusal")
			}
			if len(logs.Matching("token audience is not the controller")) == 0 {
				t.Fatal("the refusal's first line was not logged")
			}
			if len(logs.Matching("second line")) != 0 {
				t.Fatal("more than the first line was logged")
			}
		})
	}
}

// The body is bounded by the 8 KiB token cap.
func TestGrantFetchBodyIsBounded(t *testing.T) {
	srv := newGrantServer(t)
	huge := token(testUID, epoch, epoch.Add(time.Hour))
	huge = append(huge[:len(huge)-1:len(huge)-1], []byte(strings.Repeat("A", grant.MaxTokenSize))...)
	srv.setRespond(func(int) (int, []byte) { return http.StatusOK, huge })
	k := newWorld()
	clk := newClock()
	cfg := baseConfig(t, k, clk)
	srv.configure(t, &cfg)
	cfg.GrantFetchTimeout = time.Second
	if _, err := newAsync(t, context.Background(), cfg, clk, 250*time.Millisecond); err == nil {
		t.Fatal("New accepted a grant over 8 KiB")
	}
	if _, err := os.Stat(srv.grantFile()); !os.IsNotExist(err) {
		t.Fatalf("an oversized grant was written: %v", err)
	}
}

// The overview: the home "renews it at half its lease"; renewal re-reads
// the token file, and a failed renewal is retried with backoff, never
// deleting the current file.
func TestRunRenewsAtHalfTheLease(t *testing.T) {
	srv := newGrantServer(t)
	first := token(testUID, epoch, epoch.Add(2*time.Hour))
	srv.setRespond(func(int) (int, []byte) { return http.StatusOK, first })
	h, _, clk := newHome(t, func(c *kubernetes.Config) { srv.configure(t, c) })
	renewed := token(testUID, epoch.Add(time.Hour), epoch.Add(3*time.Hour))
	srv.setRespond(func(n int) (int, []byte) {
		if n <= 3 { // the first renewal attempts fail
			return http.StatusServiceUnavailable, []byte("try later")
		}
		return http.StatusOK, renewed
	})
	srv.setSAToken(t, "sa-token-2") // the kubelet rotated the token
	run(t, h)
	tick(t, clk, 59*time.Minute)
	settle()
	if srv.count() != 1 {
		t.Fatalf("%d requests before half the lease, want only New's", srv.count())
	}
	tick(t, clk, time.Minute)
	eventually(t, "the first renewal attempt", func() bool { return srv.count() == 2 })
	b, err := os.ReadFile(srv.grantFile())
	if err != nil || string(b) != string(first) {
		t.Fatalf("after a failed renewal the file holds %q, %v; want the current grant", b, err)
	}
	_, auths := srv.requests()
	if auths[1] != "Bearer sa-token-2" {
		t.Fatalf("renewal sent %q, want the re-read token", auths[1])
	}
	for srv.count() < 4 {
		tick(t, clk, 30*time.Second)
		time.Sleep(time.Millisecond)
	}
	eventually(t, "the renewed grant written", func() bool {
		b, _ := os.ReadFile(srv.grantFile())
		return string(b) == string(renewed)
	})
	eventually(t, "OwnGrant renewed", func() bool {
		got, _ := h.OwnGrant()
		return string(got) == string(renewed)
	})
}

// wallStepClock is a fake clock whose reading can jump while its timers
// keep running on their own time, as a real clock's wall reading does
// when NTP steps it (a timer runs on the monotonic clock).
type wallStepClock struct {
	*clocktesting.FakeClock
	mu     sync.Mutex
	offset time.Duration
}

func (c *wallStepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.FakeClock.Now().Add(c.offset)
}

func (c *wallStepClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// jump steps the reading by d; no timer fires.
func (c *wallStepClock) jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// "renews it at half its lease": half the lease as the clock reads it,
// also after the wall clock was stepped. The renewal time comes from the
// token (a wall-clock time), so a step forward makes it due at once; the
// home sees that within a minute, not when the wait computed before the
// step runs out (design decision 90).
func TestRenewalFollowsAWallClockStep(t *testing.T) {
	srv := newGrantServer(t)
	srv.setRespond(func(int) (int, []byte) { return http.StatusOK, token(testUID, epoch, epoch.Add(2*time.Hour)) })
	clk := &wallStepClock{FakeClock: newClock()}
	k := newWorld()
	cfg := baseConfig(t, k, clk.FakeClock)
	cfg.Clock = clk
	srv.configure(t, &cfg)
	h, err := kubernetes.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	renewed := token(testUID, epoch.Add(time.Hour), epoch.Add(3*time.Hour))
	srv.setRespond(func(int) (int, []byte) { return http.StatusOK, renewed })
	run(t, h)
	tick(t, clk.FakeClock, 10*time.Minute)
	settle()
	if srv.count() != 1 {
		t.Fatalf("%d requests 10 minutes into a 2h lease, want only New's", srv.count())
	}
	// NTP steps the clock 55 minutes forward: the renewal (due at 1h) is
	// due at once.
	clk.jump(55 * time.Minute)
	tick(t, clk.FakeClock, time.Minute)
	eventually(t, "the renewal after the step", func() bool { return srv.count() == 2 })
	eventually(t, "OwnGrant renewed", func() bool {
		got, _ := h.OwnGrant()
		return string(got) == string(renewed)
	})
}

// newIssuer starts a test issuer on loopback, closed when the test ends.
func newIssuer(t *testing.T) *granttest.Issuer {
	iss := granttest.NewIssuer(granttest.Options{})
	t.Cleanup(iss.Close)
	return iss
}

// issuerCache is a key cache of iss.
func issuerCache(t *testing.T, iss *granttest.Issuer) *grant.Cache {
	t.Helper()
	c, err := grant.NewCache(iss.URL, grant.CacheOptions{Logger: quiet(), HTTPClient: iss.Client()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Cache: "refreshed in the background while the home runs", by the keys'
// own lifetime, not every poll round: once at once, then when half of the
// cache's MaxStale has passed since the last load, as the grant is renewed
// at half its lease.
func TestRunRefreshesTheKeysByTheirLifetime(t *testing.T) {
	iss := newIssuer(t)
	clk := newClock()
	c, err := grant.NewCache(iss.URL, grant.CacheOptions{Logger: quiet(), HTTPClient: iss.Client(), Clock: clk, MaxStale: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	h, k, _ := newHomeOn(t, clk, func(cfg *kubernetes.Config) { cfg.Cache = c })
	run(t, h)
	eventually(t, "the first refresh", func() bool { return iss.DiscoveryHits() == 1 && !c.LastRefresh().IsZero() })
	rounds(t, k, 1)
	for i := 2; i <= 20; i++ { // 4m45s of poll rounds
		tick(t, clk, 15*time.Second)
		rounds(t, k, i)
	}
	settle()
	if n := iss.DiscoveryHits(); n != 1 {
		t.Fatalf("%d key refreshes in 4m45s of poll rounds, want 1: the keys last 10m", n)
	}
	tick(t, clk, 15*time.Second) // 5m: half of MaxStale
	eventually(t, "the refresh at half the keys' lifetime", func() bool { return iss.DiscoveryHits() == 2 })
}

// A key refresh that fails is retried once per the cache's
// MinRefreshInterval, and the outage is logged once, at its start, and
// once at its end: neither the home nor the cache logs each failed retry
// at V(0).
func TestKeyRefreshOutageIsLoggedOnceAndItsEnd(t *testing.T) {
	iss := newIssuer(t)
	clk := newClock()
	logs := logtest.Recorder{}
	c, err := grant.NewCache(iss.URL, grant.CacheOptions{
		Logger: logs.Logger(), HTTPClient: iss.Client(), Clock: clk,
		MaxStale: 10 * time.Minute, MinRefreshInterval: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, _, _ := newHomeOn(t, clk, func(cfg *kubernetes.Config) { cfg.Cache = c; cfg.Logger = logs.Logger() })
	iss.SetFailing(true)
	run(t, h)
	// hits waits for n refreshes in all, and for no more to follow.
	hits := func(n int64) {
		t.Helper()
		eventually(t, fmt.Sprintf("refresh %d", n), func() bool { return iss.DiscoveryHits() >= n })
		settle()
		if got := iss.DiscoveryHits(); got != n {
			t.Fatalf("%d refreshes %v into the outage, want %d: one per minute", got, clk.Since(epoch), n)
		}
	}
	hits(1)
	for i := 1; i <= 4; i++ { // 30s steps to 2m: retries at 1m and 2m
		tick(t, clk, 30*time.Second)
		hits(int64(1 + i/2))
	}
	iss.SetFailing(false)
	tick(t, clk, time.Minute) // 3m: the next retry works
	eventually(t, "the refresh after the outage", func() bool { return c.LastRefresh().Equal(epoch.Add(3 * time.Minute)) })
	eventually(t, "the end of the outage logged", func() bool { return logs.Count("works again") == 1 })
	var about []string
	for _, l := range logs.Lines() {
		if strings.Contains(strings.ToLower(l), "keys") {
			about = append(about, l)
		}
	}
	if len(about) != 2 {
		t.Fatalf("%d lines about the keys, want 2 (the outage once, its end once): %q", len(about), about)
	}
}

// The overview: the home "writes it into the grants directory. The
// directory is polled for *.jwt files": the fetched grant reaches the
// agent through Grants like any other file.
func TestFetchedGrantArrivesThroughTheLane(t *testing.T) {
	srv := newGrantServer(t)
	h, _, _ := newHome(t, func(c *kubernetes.Config) { srv.configure(t, c) })
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := h.Grants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	select {
	case ev := <-ch:
		own, _ := h.OwnGrant()
		if ev.UID != testUID || string(ev.Token) != string(own) {
			t.Fatalf("event %+v, want the Pod's own grant", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fetched grant never came through Grants")
	}
}

package pool

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// testCA is a throw-away certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

// issue signs a leaf certificate for name with the given use.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames:  []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// fakeFiberd answers GET /v1/status as fiberd's TLS listener does (TLS 1.3, a client certificate
// of its client CA required), on one port of several loopback addresses, one per fake grant Pod,
// with the fibers in use set for that address.
type fakeFiberd struct {
	t        *testing.T
	port     int
	srv      *http.Server
	serverCA *testCA
	clientCA *testCA
	wg       sync.WaitGroup

	mu      sync.Mutex
	running map[string]int64 // by local IP; absent answers 503
	reads   map[string]int
}

// newFakeFiberd serves with a certificate for serverName; stopped when the test ends.
func newFakeFiberd(t *testing.T, serverName string) *fakeFiberd {
	t.Helper()
	f := &fakeFiberd{
		t: t, serverCA: newTestCA(t, "fiberd api"), clientCA: newTestCA(t, "fiberd clients"),
		running: map[string]int64{}, reads: map[string]int{},
	}
	f.srv = &http.Server{
		Handler: http.HandlerFunc(f.serve),
		TLSConfig: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{f.serverCA.issue(t, serverName, x509.ExtKeyUsageServerAuth)},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    f.clientCA.pool(),
		},
		ErrorLog: log.New(io.Discard, "", 0), // refused handshakes are what some tests want
	}
	f.listen("127.0.0.1")
	t.Cleanup(func() {
		if err := f.srv.Close(); err != nil {
			t.Errorf("fake fiberd: %v", err)
		}
		f.wg.Wait()
	})
	return f
}

// listen serves on ip at the fake's port (the first call picks it).
func (f *fakeFiberd) listen(ip string) {
	f.t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(f.port)))
	if err != nil {
		f.t.Fatalf("fake fiberd on %s: %v", ip, err)
	}
	if f.port == 0 {
		f.port = l.Addr().(*net.TCPAddr).Port
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		if err := f.srv.ServeTLS(l, "", ""); !errors.Is(err, http.ErrServerClosed) {
			f.t.Errorf("fake fiberd: %v", err)
		}
	}()
}

// pod makes ip (127.0.0.N) a fake grant Pod with running fibers; later calls change the count.
func (f *fakeFiberd) pod(ip string, running int64) {
	f.mu.Lock()
	_, known := f.running[ip]
	f.running[ip] = running
	f.mu.Unlock()
	if !known && ip != "127.0.0.1" {
		f.listen(ip)
	}
}

// unreachable makes ip answer 503.
func (f *fakeFiberd) unreachable(ip string) {
	f.mu.Lock()
	delete(f.running, ip)
	f.mu.Unlock()
}

func (f *fakeFiberd) readsOf(ip string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads[ip]
}

func (f *fakeFiberd) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/status" || r.Method != http.MethodGet {
		http.NotFound(w, r)
		return
	}
	ip, _, _ := net.SplitHostPort(r.Context().Value(http.LocalAddrContextKey).(net.Addr).String())
	f.mu.Lock()
	f.reads[ip]++
	n, ok := f.running[ip]
	f.mu.Unlock()
	if !ok {
		http.Error(w, `{"code":"UNAVAILABLE"}`, http.StatusServiceUnavailable)
		return
	}
	// Two grants, the fibers split between them, as a Pod's fiberd with a renewed grant shows.
	st := map[string]any{"home": "kubernetes", "ready": true, "grants": []map[string]any{
		{"uid": "a", "running": n / 2, "max": 8}, {"uid": "b", "running": n - n/2, "max": 8},
	}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

// config is the FibersConfig of a controller holding a client certificate fiberd accepts.
func (f *fakeFiberd) config(serverName string) FibersConfig {
	return FibersConfig{
		TLS: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{f.clientCA.issue(f.t, "fiberd-controller", x509.ExtKeyUsageClientAuth)},
			RootCAs:      f.serverCA.pool(),
		},
		ServerName: serverName,
		Port:       int32(f.port),
	}
}

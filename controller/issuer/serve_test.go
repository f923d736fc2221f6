//go:build !integration

package issuer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"fiberd.io/fiberd/pkg/grant"
	shared "fiberd.io/fiberd/pkg/issuer"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir, and returns their paths
// and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "issuer test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// freePort is a TCP port of 127.0.0.1 free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestStartServesHTTPS runs the issuer as the controller does: over TLS, fiberd's key cache finds
// its keys by OIDC discovery, and the grant it serves verifies with them; once its context ends,
// Start returns and leaves nothing running.
func TestStartServesHTTPS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, roots := selfSigned(t, dir)
	url := "https://127.0.0.1:" + strconv.Itoa(freePort(t))
	pod := testPoolPod(t, nil)
	base := testScheme(t).WithObjects(testPool(nil), pod).Build()
	live := interceptor.NewClient(base.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			tr, ok := obj.(*authenticationv1.TokenReview)
			if !ok {
				return c.Create(ctx, obj, opts...)
			}
			if tr.Spec.Token == "token-web-0" && len(tr.Spec.Audiences) == 1 && tr.Spec.Audiences[0] == url {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
					User: authenticationv1.UserInfo{Username: "system:serviceaccount:apps:fiberd", Extra: map[string]authenticationv1.ExtraValue{
						shared.ExtraPodName: {pod.Name}, shared.ExtraPodUID: {string(pod.UID)},
					}}}
			}
			return nil
		},
	})
	iss, err := New(Config{IssuerURL: url, ListenAddress: strings.TrimPrefix(url, "https://"),
		CertFile: certFile, KeyFile: keyFile, Namespace: "fiberd-system"}, live, base)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- iss.Start(ctx) }()

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for iss.Ready(nil) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the issuer did not load its keys")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cache, err := grant.NewCache(url, grant.CacheOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if err = cache.Refresh(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fiberd's key cache cannot load the issuer's keys: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+shared.PathGrant, nil)
	req.Header.Set("Authorization", "Bearer token-web-0")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/grant: %s %s", resp.Status, body)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: url, Audience: pod.Name, Keys: cache})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := v.Verify(ctx, body); err != nil || g.UID != podUID {
		t.Fatalf("the served grant (%+v) does not verify with the discovered keys: %v", g, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Start = %v after its context ended, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
}

// TestStartRefusesABadCertificate: a certificate that cannot be loaded fails Start at once,
// naming the files.
func TestStartRefusesABadCertificate(t *testing.T) {
	dir := t.TempDir()
	iss, err := New(Config{IssuerURL: testIssuer, ListenAddress: "127.0.0.1:0", CertFile: filepath.Join(dir, "missing.crt"),
		KeyFile: filepath.Join(dir, "missing.key"), Namespace: "fiberd-system"}, testScheme(t).Build(), testScheme(t).Build())
	if err != nil {
		t.Fatal(err)
	}
	if err := iss.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Fatalf("Start = %v, want an error naming the certificate", err)
	}
}

// TestCertificateReloaded: a certificate renewed in place is served from the next handshake on,
// and files caught half written keep the one loaded before.
func TestCertificateReloaded(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir)
	r, err := newCertReloader(certFile, keyFile, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	first, _ := r.GetCertificate(nil)
	if again, _ := r.GetCertificate(nil); again != first {
		t.Fatal("an unchanged certificate was loaded again")
	}
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := r.GetCertificate(nil); err != nil || got != first {
		t.Fatalf("a half-written renewal: %v, %v; want the certificate loaded before", got, err)
	}
	time.Sleep(10 * time.Millisecond) // a new modification time
	selfSigned(t, dir)
	second, err := r.GetCertificate(nil)
	if err != nil || second == first || string(second.Certificate[0]) == string(first.Certificate[0]) {
		t.Fatal("the renewed certificate is not served")
	}
}

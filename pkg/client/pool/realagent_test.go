package pool

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/grant"
	homefake "fiberd.io/fiberd/pkg/home/fake"
	"fiberd.io/fiberd/pkg/template"
)

// The pool client against real fiberd agents (pkg/fiberd, in process, on fake homes and fake
// backends): each plays a grant Pod, serving its own grant, minted for its Pod UID, to callers
// authenticated by a client certificate over TLS 1.3, as deploy/kubernetes/grant-pod.yaml
// configures it. Its server certificate names fiberd.ns.svc only, not the address dialled.

// pki is a server CA, a client CA and their certificates, written as PEM files.
type pki struct {
	dir          string
	srvCert      string // fiberd.ns.svc, signed by the server CA
	srvKey       string
	clientCA     string
	serverCA     *x509.CertPool
	client       tls.Certificate
	wrongSrvCert string // fiberd.other.svc
	wrongSrvKey  string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), serverCA: x509.NewCertPool()}
	sca, scaKey := selfSigned(t, "server-ca")
	cca, ccaKey := selfSigned(t, "client-ca")
	p.serverCA.AddCert(sca)
	p.clientCA = writePEM(t, p.dir, "client-ca.pem", cca, nil)
	srv, srvKey := leaf(t, sca, scaKey, "fiberd.ns.svc", true)
	p.srvCert = writePEM(t, p.dir, "srv.pem", srv, nil)
	p.srvKey = writePEM(t, p.dir, "srv.key", nil, srvKey)
	wrong, wrongKey := leaf(t, sca, scaKey, "fiberd.other.svc", true)
	p.wrongSrvCert = writePEM(t, p.dir, "wrong.pem", wrong, nil)
	p.wrongSrvKey = writePEM(t, p.dir, "wrong.key", nil, wrongKey)
	cli, cliKey := leaf(t, cca, ccaKey, "caller", false)
	p.client = tls.Certificate{Certificate: [][]byte{cli.Raw}, PrivateKey: cliKey}
	return p
}

// clientTLS is the caller's side, without a ServerName: the pool's default applies.
func (p *pki) clientTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.serverCA, Certificates: []tls.Certificate{p.client}}
}

func selfSigned(t *testing.T, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func leaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, server bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func writePEM(t *testing.T, dir, name string, c *x509.Certificate, key *ecdsa.PrivateKey) string {
	t.Helper()
	var b bytes.Buffer
	if c != nil {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	if key != nil {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		_ = pem.Encode(&b, &pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// grantPod runs a real fiberd agent as grant Pod name (UID uid) would: its own grant of
// fibers.max max on a fake home that self-admits uid, a TLS listener requiring client
// certificates. wrongCert serves the certificate of another name.
func grantPod(t *testing.T, p *pki, name, uid string, max int, wrongCert bool) Endpoint {
	t.Helper()
	key, err := grant.GenerateKey("EdDSA", "k1")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := grant.PublicJWKS(key)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := grant.NewStaticKeys(jwks)
	if err != nil {
		t.Fatal(err)
	}
	// Short paths: unix socket paths are limited to 108 bytes.
	state, err := os.MkdirTemp("", "pc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	tdir := filepath.Join(state, "templates")
	spec := `{"command":"/bin/true","zygote":true}`
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tdir, "counter.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	own, err := signer.Mint(core.Grant{UID: uid, Issuer: "https://issuer.test", Audience: "node-1",
		Template: "counter@sha256:" + template.Digest([]byte(spec)), Fibers: core.Fibers{Max: max},
		IssuedAt: now, Expiry: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	home := homefake.New(homefake.Config{Clock: clock.RealClock{}, Devices: []string{"/dev/null"}, SelfAdmitUID: uid, NoLane: true})
	home.SetOwnGrant(own)
	cert, certKey := p.srvCert, p.srvKey
	if wrongCert {
		cert, certKey = p.wrongSrvCert, p.wrongSrvKey
	}
	a, err := fiberd.New(context.Background(), fiberd.Config{
		Issuer: "https://issuer.test", NodeID: "node-1", Keys: keys, Templates: tdir, StateDir: state,
		Listen: "127.0.0.1:0", TLSCert: cert, TLSKey: certKey, ClientCA: p.clientCA,
		Home: home, Warm: fake.New(core.TierWarm, fake.Hooks{}), Basic: fake.New(core.TierBasic, fake.Hooks{}),
		Clock: clock.RealClock{}, Logger: testr.NewWithOptions(t, testr.Options{Verbosity: 0}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	})
	return Endpoint{PodName: name, PodUID: uid, Addr: a.Addr().String(), Node: "node-1"}
}

func TestPoolOfRealAgentsOverTLS(t *testing.T) {
	p := newPKI(t)
	eps := []Endpoint{
		grantPod(t, p, "p-0", "6f1c0d6e-0000-4000-8000-000000000000", 2, false),
		grantPod(t, p, "p-1", "6f1c0d6e-0000-4000-8000-000000000001", 2, false),
	}
	pl := newPool(t, NewStaticSource(eps...), func(c *Config) { c.TLS = p.clientTLS() })
	ctx := ctxT(t, 30*time.Second)

	// Two Pods of fibers.max 2: four Clones are served, two on each, as the second Pod is asked
	// when the first is full.
	perPod := map[string]int{}
	var fibers []api.CloneResponse
	for i := range 4 {
		resp, err := pl.Clone(ctx, api.CloneRequest{Payload: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatalf("Clone %d of 4 with room for 4: %v", i, err)
		}
		ep, err := pl.PodOf(resp.FiberID)
		if err != nil || resp.Fence.GrantUID != ep.PodUID {
			t.Fatalf("fiber %s: PodOf = %+v, %v", resp.FiberID, ep, err)
		}
		perPod[ep.PodName]++
		fibers = append(fibers, resp)
	}
	if perPod["p-0"] != 2 || perPod["p-1"] != 2 {
		t.Fatalf("fibers per Pod %v, want 2 and 2", perPod)
	}
	// The fifth: both Pods miss, and the error says what each answered.
	_, err := pl.Clone(ctx, api.CloneRequest{})
	pe, ok := AsError(err)
	if !ok || len(pe.Attempts) != 2 {
		t.Fatalf("Clone with the pool full = %v, want a *pool.Error of two attempts", err)
	}
	if _, miss := core.IsMiss(err); !miss || !strings.Contains(err.Error(), "pod p-0") || !strings.Contains(err.Error(), "pod p-1") {
		t.Errorf("Clone with the pool full = %v, want a miss naming both Pods", err)
	}
	// A release on its Pod makes room there, and the next Clone finds it.
	if err := pl.Release(ctx, fibers[0].FiberID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	resp, err := pl.Clone(ctx, api.CloneRequest{})
	if err != nil {
		t.Fatalf("Clone after a release: %v", err)
	}
	if resp.Fence.GrantUID != fibers[0].Fence.GrantUID {
		t.Errorf("served on %s, want the Pod that had room, %s", resp.Fence.GrantUID, fibers[0].Fence.GrantUID)
	}
	for _, f := range append(fibers[1:], resp) {
		if err := pl.Release(ctx, f.FiberID); err != nil {
			t.Fatalf("Release %s: %v", f.FiberID, err)
		}
	}

	// A session is created on one Pod and attached there again.
	first, err := pl.Clone(ctx, api.CloneRequest{Session: "user-42"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := pl.Clone(ctx, api.CloneRequest{Session: "user-42"})
	if err != nil {
		t.Fatal(err)
	}
	if again.FiberID != first.FiberID || again.Kind != api.KindAttach {
		t.Errorf("second Clone of the session: %s (%s), want %s attached", again.FiberID, again.Kind, first.FiberID)
	}
	if err := pl.Release(ctx, first.FiberID); err != nil {
		t.Fatal(err)
	}
}

func TestPoolRefusesAPodWithTheWrongCertificate(t *testing.T) {
	p := newPKI(t)
	eps := []Endpoint{
		grantPod(t, p, "p-0", "6f1c0d6e-0000-4000-8000-0000000000a0", 4, true),
		grantPod(t, p, "p-1", "6f1c0d6e-0000-4000-8000-0000000000a1", 4, false),
	}
	pl := newPool(t, NewStaticSource(eps...), func(c *Config) { c.TLS = p.clientTLS() })
	ctx := ctxT(t, 30*time.Second)
	for range 6 {
		resp, err := pl.Clone(ctx, api.CloneRequest{})
		if err != nil {
			t.Fatalf("Clone: %v", err)
		}
		if ep, _ := pl.PodOf(resp.FiberID); ep.PodName != "p-1" {
			t.Fatalf("served by %s, whose certificate names another Service", ep.PodName)
		}
		_ = pl.Release(ctx, resp.FiberID)
	}
	// Alone, the Pod with the wrong certificate is an error that says so.
	bad := newPool(t, NewStaticSource(eps[0]), func(c *Config) { c.TLS = p.clientTLS() })
	_, err := bad.Clone(ctx, api.CloneRequest{})
	var ce *tls.CertificateVerificationError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "fiberd.other.svc") || !strings.Contains(err.Error(), "fiberd.ns.svc") {
		t.Errorf("Clone of a Pod whose certificate names fiberd.other.svc = %v", err)
	}
	// Without a client certificate no Pod self-admits: nothing is served.
	anon := newPool(t, NewStaticSource(eps[1]), func(c *Config) {
		c.TLS = &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.serverCA}
	})
	if _, err := anon.Clone(ctx, api.CloneRequest{}); err == nil {
		t.Error("a caller without a client certificate was served")
	}
}

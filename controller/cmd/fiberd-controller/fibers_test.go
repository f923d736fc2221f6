package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate and its key as PEM to dir/crt and dir/key.
func writeCert(t *testing.T, dir, crt, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fiberd-controller"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, crt), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if key != "" {
		if err := os.WriteFile(filepath.Join(dir, key), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFibersConfig reads -fiberd-tls-dir: none of its files leaves fibers in use unknown, all
// three give a client certificate, and some of them is refused naming what is missing.
func TestFibersConfig(t *testing.T) {
	o, err := parseFlags([]string{"-issuer-bind-address=0", "-fiberd-tls-dir", t.TempDir()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if fc, err := fibersConfig(o); err != nil || fc.TLS != nil {
		t.Errorf("empty directory: TLS %v, %v; want none and no error", fc.TLS, err)
	}

	dir := t.TempDir()
	writeCert(t, dir, "tls.crt", "tls.key")
	o.tlsDir = dir
	if _, err := fibersConfig(o); err == nil || !strings.Contains(err.Error(), "not ca.crt") {
		t.Errorf("no ca.crt: %v, want an error naming it", err)
	}
	writeCert(t, dir, "ca.crt", "")
	fc, err := fibersConfig(o)
	if err != nil || fc.TLS == nil || fc.TLS.GetClientCertificate == nil || fc.TLS.RootCAs == nil {
		t.Fatalf("all three: %+v, %v; want a client certificate and the CA", fc.TLS, err)
	}
	first, err := fc.TLS.GetClientCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	// The Secret's certificate is renewed in place: the next handshake sends the new one.
	writeCert(t, dir, "tls.crt", "tls.key")
	later := time.Now().Add(time.Minute)
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Chtimes(filepath.Join(dir, f), later, later); err != nil {
			t.Fatal(err)
		}
	}
	second, err := fc.TLS.GetClientCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(first.Certificate[0]) == string(second.Certificate[0]) {
		t.Error("the client certificate was not read again after its files changed")
	}
	// A key that does not match (a half-written update) keeps the last good pair.
	writeCert(t, dir, "tls.crt", "")
	if third, err := fc.TLS.GetClientCertificate(nil); err != nil || third != second {
		t.Errorf("mid-update: %v, %v; want the last good certificate", third, err)
	}
	if fc.ServerName != "fiberd.{namespace}.svc" || fc.Interval != 15*time.Second {
		t.Errorf("server name %q interval %v, want the defaults", fc.ServerName, fc.Interval)
	}

	if _, err := parseFlags([]string{"-issuer-bind-address=0", "-fibers-interval", "10ms"}, io.Discard); err == nil {
		t.Error("-fibers-interval 10ms accepted, want refused")
	}
}

package main

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestIssuerClientTrustsTheGivenCA: key discovery must reach an issuer whose
// certificate chains to a private CA, given by -issuer-ca-file or, failing
// that, -grant-ca-file (the controller is both), and must not trust it
// otherwise.
func TestIssuerClientTrustsTheGivenCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	get := func(o options) error {
		c, err := issuerClient(o)
		if err != nil {
			t.Fatalf("issuerClient: %v", err)
		}
		if c == nil {
			c = &http.Client{}
		}
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(options{issuerCAFile: caFile}); err != nil {
		t.Errorf("with -issuer-ca-file: %v", err)
	}
	if err := get(options{grantCAFile: caFile}); err != nil {
		t.Errorf("with only -grant-ca-file: %v", err)
	}
	if err := get(options{}); err == nil {
		t.Error("without a CA file the private CA was trusted")
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, []byte("not pem"), 0o600)
	if _, err := issuerClient(options{issuerCAFile: bad}); err == nil || !strings.Contains(err.Error(), "-issuer-ca-file") {
		t.Errorf("a CA file without PEM: %v, want an error naming -issuer-ca-file", err)
	}
}

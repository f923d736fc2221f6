package client

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSConfig builds the client side of fiberd's TLS listener: TLS 1.3, the
// server's certificate checked against the PEM bundle caFile (empty: the
// system roots), and the client certificate certFile/keyFile that fiberd's
// -client-ca must have signed (both empty: none). It fails naming the file
// that cannot be read or parsed.
func TLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("client TLS: give both a certificate and a key, or neither")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client TLS: certificate %q, key %q: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("client TLS: CA %q: %w", caFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client TLS: CA %q: no PEM certificate in it", caFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

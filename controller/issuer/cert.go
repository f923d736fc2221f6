package issuer

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// certReloader serves the certificate of two PEM files and loads them again when either changes,
// so a certificate renewed in its Secret (the kubelet swaps the mounted files) is served without
// a restart. A reload that fails keeps the certificate loaded before and is logged once per
// change.
type certReloader struct {
	certFile, keyFile string
	log               logr.Logger

	mu     sync.Mutex
	cert   *tls.Certificate
	stamp  string // the files' sizes and modification times when cert was loaded
	failed string // the stamp whose reload failed, so it is logged once
}

// newCertReloader loads the files once; an error names them.
func newCertReloader(certFile, keyFile string, log logr.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	stamp, err := r.fileStamp()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("issuer: serving certificate %s and key %s: %w", certFile, keyFile, err)
	}
	r.cert, r.stamp = &cert, stamp
	return r, nil
}

// fileStamp describes both files as they are now.
func (r *certReloader) fileStamp() (string, error) {
	var s string
	for _, f := range []string{r.certFile, r.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("issuer: serving certificate %s and key %s: %w", r.certFile, r.keyFile, err)
		}
		s += fmt.Sprintf("%d@%s;", fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
	}
	return s, nil
}

// GetCertificate is tls.Config's: the current certificate, reloaded first if the files changed.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamp, err := r.fileStamp()
	if err != nil || stamp == r.stamp || stamp == r.failed {
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		// The two files of a Secret change together, but a handshake may fall between them.
		r.failed = stamp
		r.log.Error(err, "Reloading the issuer's serving certificate failed; serving the one loaded before", "cert", r.certFile, "key", r.keyFile)
		return r.cert, nil
	}
	r.cert, r.stamp, r.failed = &cert, stamp, ""
	r.log.Info("Issuer serving certificate reloaded", "cert", r.certFile)
	return r.cert, nil
}

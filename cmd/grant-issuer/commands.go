package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-jose/go-jose/v4"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"fiberd.io/fiberd/cmd/grant-issuer/internal/issuer"
	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/grant"
)

// shutdownGrace bounds how long serve waits for requests in flight after
// its context ends.
const shutdownGrace = 5 * time.Second

// newFlags returns the flag set of "grant-issuer NAME", reporting on
// e.stderr (grantcli.NewFlags).
func newFlags(name string, e env) *flag.FlagSet {
	return grantcli.NewFlags("grant-issuer "+name, e.stderr)
}

// grantEnv is the part of e the shared grant commands use.
func (e env) grantEnv() grantcli.Env {
	return grantcli.Env{Stdout: e.stdout, Stderr: e.stderr, Clock: e.clock}
}

// keygen: grant-issuer keygen [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
func keygen(args []string, e env) int {
	return grantcli.Keygen("grant-issuer keygen", args, e.grantEnv())
}

// mint: grant-issuer mint -key key.jwk -issuer URL -audience NODE -template T [-uid U] [-max N] [-lease D]
func mint(args []string, e env) int {
	return grantcli.Mint("grant-issuer mint", grantcli.MintOptions{Lease: issuer.DefaultLease, PodHints: true}, args, e.grantEnv())
}

// serveFlags are serve's flags, parsed.
type serveFlags struct {
	listen, issuerURL, audience, keyFile, certFile, certKey, kubeconfig string
	lease, reviewTimeout                                                time.Duration
}

// serve: grant-issuer serve -issuer URL -key key.jwk -tls-cert F -tls-key F [flags]
func serve(args []string, e env) int {
	fs := newFlags("serve", e)
	var f serveFlags
	fs.StringVar(&f.listen, "listen", ":8443", "address to serve HTTPS on")
	fs.StringVar(&f.issuerURL, "issuer", "", "this issuer's own https URL, as grant Pods reach it: the iss of every grant and the audience tokens must carry (required)")
	fs.StringVar(&f.audience, "audience", "", "audience the bearer tokens must carry; empty means -issuer")
	fs.StringVar(&f.keyFile, "key", "", "private signing JWK written by keygen (required)")
	fs.StringVar(&f.certFile, "tls-cert", "", "PEM serving certificate (chain) for -issuer's host (required)")
	fs.StringVar(&f.certKey, "tls-key", "", "PEM private key of -tls-cert (required)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster; empty means in-cluster (the Pod's service account)")
	fs.DurationVar(&f.lease, "lease", issuer.DefaultLease, "lease of every grant minted, at least 1s")
	fs.DurationVar(&f.reviewTimeout, "review-timeout", issuer.DefaultReviewTimeout, "bound on the TokenReview and Pod read of one request")
	if st, ok := grantcli.ParseFlags(fs, args); !ok {
		return st
	}
	if st, ok := grantcli.Required(fs, "issuer", "key", "tls-cert", "tls-key"); !ok {
		return st
	}
	if f.lease < time.Second {
		return grantcli.UsageError(fs, "-lease %v: must be at least 1s", f.lease)
	}
	if f.reviewTimeout <= 0 {
		return grantcli.UsageError(fs, "-review-timeout %v: must be positive", f.reviewTimeout)
	}
	key, err := grant.ReadKeyFile(f.keyFile)
	if err != nil {
		return grantcli.Failure(fs, fmt.Errorf("-key: %w", err))
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		return grantcli.Failure(fs, fmt.Errorf("-key %s: %w", f.keyFile, err))
	}
	cert, err := tls.LoadX509KeyPair(f.certFile, f.certKey)
	if err != nil {
		return grantcli.Failure(fs, fmt.Errorf("-tls-cert/-tls-key: %w", err))
	}
	kube, err := kubeClient(f.kubeconfig)
	if err != nil {
		return grantcli.Failure(fs, err)
	}
	log := klog.Background().WithName("grant-issuer")
	srv, err := issuer.New(issuer.Config{
		IssuerURL:     f.issuerURL,
		Audience:      f.audience,
		Signer:        signer,
		Keys:          []jose.JSONWebKey{key},
		Kube:          kube,
		Lease:         f.lease,
		ReviewTimeout: f.reviewTimeout,
		Clock:         e.clock,
		Logger:        log,
	})
	if err != nil {
		return grantcli.UsageError(fs, "%v", err)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return grantcli.Failure(fs, fmt.Errorf("-listen: %w", err))
	}
	hs := &http.Server{
		Handler:           srv,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          nil,
	}
	done := make(chan error, 1)
	go func() { done <- hs.ServeTLS(ln, "", "") }()
	log.Info("serving; this is the development issuer, the production issuer is the FiberPool controller's (fiberd-controller)",
		"address", ln.Addr().String(), "issuer", f.issuerURL, "kid", signer.KeyID(), "lease", f.lease.String())
	select {
	case err := <-done:
		return grantcli.Failure(fs, err)
	case <-e.ctx.Done():
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		_ = hs.Close()
	}
	<-done
	log.Info("stopped")
	return grantcli.ExitOK
}

// kubeClient builds a clientset from kubeconfig, or in-cluster when empty.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("-kubeconfig is empty and not in a cluster: %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("-kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.UserAgent = "fiberd-grant-issuer"
	return kubernetes.NewForConfig(cfg)
}

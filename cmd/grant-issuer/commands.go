package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
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
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// shutdownGrace bounds how long serve waits for requests in flight after
// its context ends.
const shutdownGrace = 5 * time.Second

func newFlags(name string, e env) *flag.FlagSet {
	fs := flag.NewFlagSet("grant-issuer "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

// parseFlags parses args and refuses positional arguments. ok false means
// return status.
func parseFlags(fs *flag.FlagSet, args []string) (status int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return exitUsage, false
	}
	return exitOK, true
}

func usageError(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	return exitUsage
}

func failure(fs *flag.FlagSet, err error) int {
	fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
	return exitFailure
}

// required returns the name of the first empty flag of pairs, or "".
func required(pairs ...[2]string) string {
	for _, p := range pairs {
		if p[1] == "" {
			return p[0]
		}
	}
	return ""
}

// keygen: grant-issuer keygen [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
func keygen(args []string, e env) int {
	fs := newFlags("keygen", e)
	alg := fs.String("alg", "EdDSA", "signature algorithm of the key: EdDSA or ES256")
	kid := fs.String("kid", "", "key id; empty uses the key's RFC 7638 thumbprint")
	out := fs.String("out", "", "file to write the private JWK to, mode 0600 (required)")
	jwksOut := fs.String("jwks-out", "", "file to write the public JWKS to (optional)")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if *alg != "EdDSA" && *alg != "ES256" {
		return usageError(fs, "-alg %q: want EdDSA or ES256", *alg)
	}
	if *out == "" {
		return usageError(fs, "-out is required: the file to write the private key to")
	}
	key, err := grant.GenerateKey(*alg, *kid)
	if err != nil {
		return failure(fs, err)
	}
	if *jwksOut != "" {
		jwks, err := grant.PublicJWKS(key)
		if err != nil {
			return failure(fs, err)
		}
		if err := core.WriteFileAtomic(*jwksOut, append(jwks, '\n'), 0o644); err != nil {
			return failure(fs, err)
		}
	}
	if err := grant.WriteKeyFile(*out, key); err != nil {
		return failure(fs, err)
	}
	fmt.Fprintf(e.stdout, "kid %s\n", key.KeyID)
	return exitOK
}

// mint: grant-issuer mint -key key.jwk -issuer URL -audience NODE -template T [-uid U] [-max N] [-lease D]
func mint(args []string, e env) int {
	fs := newFlags("mint", e)
	keyFile := fs.String("key", "", "private JWK file written by keygen (required)")
	iss := fs.String("issuer", "", "issuer URL, the iss claim (required)")
	aud := fs.String("audience", "", "node id of the home, the aud claim; in Kubernetes the Pod name (required)")
	template := fs.String("template", "", "template the grant runs, name@sha256:<64 hex> (required)")
	uid := fs.String("uid", "", "grant UID, the jti claim, a DNS-1123 label such as a Pod UID; empty picks a random one")
	maxFibers := fs.Int("max", 1, "fibers.max: fibers that may run at once, at least 1")
	lease := fs.Duration("lease", issuer.DefaultLease, "lease: exp - iat, at least 1s")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if name := required([2]string{"key", *keyFile}, [2]string{"issuer", *iss},
		[2]string{"audience", *aud}, [2]string{"template", *template}); name != "" {
		return usageError(fs, "-%s is required", name)
	}
	if err := grant.ValidTemplate(*template); err != nil {
		return usageError(fs, "-template: %v", err)
	}
	if *uid == "" {
		b := make([]byte, 10)
		_, _ = rand.Read(b)
		*uid = "g-" + hex.EncodeToString(b)
	} else if err := grant.ValidUID(*uid); err != nil {
		return usageError(fs, "-uid: %v", err)
	}
	if *maxFibers < 1 {
		return usageError(fs, "-max %d: must be at least 1", *maxFibers)
	}
	if *lease < time.Second {
		return usageError(fs, "-lease %v: must be at least 1s", *lease)
	}
	key, err := grant.ReadKeyFile(*keyFile)
	if err != nil {
		return failure(fs, err)
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		return failure(fs, fmt.Errorf("-key %s: %w", *keyFile, err))
	}
	now := e.clock.Now().Truncate(time.Second)
	tok, err := signer.Mint(core.Grant{
		UID: *uid, Issuer: *iss, Audience: *aud, Template: *template,
		Fibers: core.Fibers{Max: *maxFibers}, IssuedAt: now, Expiry: now.Add(*lease),
	})
	if err != nil {
		return failure(fs, err)
	}
	fmt.Fprintf(e.stdout, "%s\n", tok)
	return exitOK
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
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if name := required([2]string{"issuer", f.issuerURL}, [2]string{"key", f.keyFile},
		[2]string{"tls-cert", f.certFile}, [2]string{"tls-key", f.certKey}); name != "" {
		return usageError(fs, "-%s is required", name)
	}
	if f.lease < time.Second {
		return usageError(fs, "-lease %v: must be at least 1s", f.lease)
	}
	if f.reviewTimeout <= 0 {
		return usageError(fs, "-review-timeout %v: must be positive", f.reviewTimeout)
	}
	key, err := grant.ReadKeyFile(f.keyFile)
	if err != nil {
		return failure(fs, fmt.Errorf("-key: %w", err))
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		return failure(fs, fmt.Errorf("-key %s: %w", f.keyFile, err))
	}
	cert, err := tls.LoadX509KeyPair(f.certFile, f.certKey)
	if err != nil {
		return failure(fs, fmt.Errorf("-tls-cert/-tls-key: %w", err))
	}
	kube, err := kubeClient(f.kubeconfig)
	if err != nil {
		return failure(fs, err)
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
		return usageError(fs, "%v", err)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return failure(fs, fmt.Errorf("-listen: %w", err))
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
	log.Info("serving; this is the development issuer, the production controller is a separate project",
		"address", ln.Addr().String(), "issuer", f.issuerURL, "kid", signer.KeyID(), "lease", f.lease.String())
	select {
	case err := <-done:
		return failure(fs, err)
	case <-e.ctx.Done():
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		_ = hs.Close()
	}
	<-done
	log.Info("stopped")
	return exitOK
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

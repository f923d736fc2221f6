// Command grant-issuer is fiberd's development grant issuer: it signs grants,
// publishes its keys by OIDC discovery, and hands each grant Pod its grant in
// exchange for the Pod's bound service-account token. It exists to run and
// test the Kubernetes story end to end without the controller; the production
// issuer is the FiberPool controller's (controller/issuer, served by
// fiberd-controller), which mints each grant Pod's grant from its FiberPool
// and rotates its keys. Both share the exchange of pkg/issuer.
//
// Usage:
//
//	grant-issuer keygen [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
//	grant-issuer mint -key key.jwk -issuer URL -audience NODE -template name@sha256:HEX [-uid U] [-max N] [-lease D]
//	grant-issuer serve -issuer URL -key key.jwk -tls-cert FILE -tls-key FILE [-listen ADDR]
//	                   [-kubeconfig FILE] [-lease D] [-audience AUD] [-review-timeout D]
//
// serve answers, under the path of -issuer:
//
//	/.well-known/openid-configuration   OIDC discovery (issuer, jwks_uri)
//	/openid/v1/jwks                     the public keys
//	/v1/grant                           the grant exchange (GET, bearer token)
//	/healthz                            "ok"
//
// For /v1/grant it reviews the bearer token with the TokenReview API for the
// audience -audience (default: -issuer), requires the token to be bound to a
// Pod, reads that Pod, checks its UID, and mints a grant with UID = the Pod
// UID, audience = the Pod name and lease -lease, whose template and
// fibers.max come from the Pod's annotations fiberd.io/template and
// fiberd.io/fibers-max. A Pod without fiberd.io/template has no grant yet
// (404); a Pod with it but without a usable fiberd.io/fibers-max, or with a
// malformed template, is refused (403). Every refusal is logged with its
// reason; tokens are never logged. Its service account needs create on
// tokenreviews and get on pods (deploy/kubernetes/issuer.yaml).
//
// Exit status: 0 on success (serve: after SIGTERM or SIGINT), 1 when the
// command failed, 2 on bad usage; the message names the flag.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/utils/clock"

	"fiberd.io/fiberd/internal/grantcli"
)

// env is what a command may touch besides its flags. Tests pass their own.
type env struct {
	stdout io.Writer
	stderr io.Writer
	clock  clock.PassiveClock
	// ctx ends serve; main ends it on SIGTERM or SIGINT.
	ctx context.Context
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(os.Args[1:], env{stdout: os.Stdout, stderr: os.Stderr, clock: clock.RealClock{}, ctx: ctx})
	stop()
	os.Exit(code)
}

// run dispatches args to a command and returns the exit status.
func run(args []string, e env) int {
	if len(args) == 0 {
		usage(e.stderr)
		return grantcli.ExitUsage
	}
	switch args[0] {
	case "keygen":
		return keygen(args[1:], e)
	case "mint":
		return mint(args[1:], e)
	case "serve":
		return serve(args[1:], e)
	case "help", "-h", "-help", "--help":
		usage(e.stdout)
		return grantcli.ExitOK
	}
	fmt.Fprintf(e.stderr, "grant-issuer: unknown command %q\n", args[0])
	usage(e.stderr)
	return grantcli.ExitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: grant-issuer <command> [flags]

The development grant issuer of fiberd. It is for development and tests; the
production issuer is the FiberPool controller's (fiberd-controller), which mints
each grant Pod's grant from its FiberPool and rotates its keys.

commands:
  keygen   make a signing key (private JWK, optional public JWKS)
  mint     sign a grant token and print it
  serve    serve OIDC discovery, the JWKS and GET /v1/grant over HTTPS; the
           grant exchange checks the Pod's bound service-account token with
           the TokenReview API and reads the grant from the Pod's annotations
           fiberd.io/template (absent: 404, no grant yet) and
           fiberd.io/fibers-max (absent or bad while the template is set: 403)

Run "grant-issuer <command> -h" for the flags of a command.
`)
}

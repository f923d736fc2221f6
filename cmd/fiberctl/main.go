// Command fiberctl is the fiberd client and the grant tool.
//
// Usage:
//
//	fiberctl grant keygen [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
//	fiberctl grant mint -key key.jwk -issuer URL -audience NODE -template name@sha256:HEX [flags]
//	fiberctl grant verify -jwks jwks.json -issuer URL -audience NODE [-token FILE]
//
// Exit status: 0 on success, 1 when the command failed, 2 on bad usage (an
// unknown command, a bad or missing flag); the message names the flag.
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/utils/clock"
)

// env is what a command may touch besides its flags: its input, outputs
// and the clock. Tests pass their own.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	clock  clock.PassiveClock
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, clock: clock.RealClock{}}))
}

// run dispatches args to a command group and returns the exit status.
func run(args []string, e env) int {
	if len(args) == 0 {
		usage(e.stderr)
		return exitUsage
	}
	switch args[0] {
	case "grant":
		return runGrant(args[1:], e)
	case "help", "-h", "-help", "--help":
		usage(e.stdout)
		return exitOK
	}
	fmt.Fprintf(e.stderr, "fiberctl: unknown command %q\n", args[0])
	usage(e.stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: fiberctl <command> [flags]

commands:
  grant keygen   make an issuer signing key (private JWK, optional public JWKS)
  grant mint     sign a grant token and print it
  grant verify   check a grant token against a public JWKS and print its grant

Run "fiberctl grant <subcommand> -h" for the flags of a subcommand.
`)
}

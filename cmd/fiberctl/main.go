// Command fiberctl is the fiberd client and the grant tool.
//
// Usage:
//
//	fiberctl [-addr unix:///path|host:port] [-o text|json] [-tls-cert F -tls-key F] [-ca F] <command>
//	fiberctl clone [-grant-uid UID | -grant FILE] [-session S [-key KEY]] [-deadline D] [-payload P]
//	fiberctl clone -pool NAME [-namespace NS] [-kubeconfig F] [-server-name N] [-session S] [-deadline D] [-payload P]
//	fiberctl release|park [-key KEY | -grant FILE] [-pool NAME [-namespace NS] [-kubeconfig F]] FIBER_ID
//	fiberctl status [-ready]
//	fiberctl watch
//	fiberctl grant keygen [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
//	fiberctl grant mint -key key.jwk -issuer URL -audience NODE -template name@sha256:HEX [flags]
//	fiberctl grant verify -jwks jwks.json -issuer URL -audience NODE [-token FILE]
//
// Strings the agent sends back are printed escaped: a field that holds a
// character a terminal would act on is Go-quoted, messages have such
// characters escaped, and -o json escapes every non-printable character.
//
// Exit status: 0 on success, 1 when the command failed, 2 on bad usage (an
// unknown command, a bad or missing flag); the message names the flag.
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/utils/clock"

	"fiberd.io/fiberd/internal/grantcli"
)

// env is what a command may touch besides its flags: its input, outputs,
// the clock and the cluster. Tests pass their own.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	clock  clock.PassiveClock
	// kube connects to the cluster of clone -pool; nil is kubeClient.
	kube kubeFunc
}

func main() {
	os.Exit(run(os.Args[1:], env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, clock: clock.RealClock{}}))
}

// run dispatches args to a command group and returns the exit status.
func run(args []string, e env) int {
	g, args, status, ok := parseGlobal(args, e)
	if !ok {
		return status
	}
	if len(args) == 0 {
		usage(e.stderr)
		return grantcli.ExitUsage
	}
	switch args[0] {
	case "grant":
		return runGrant(args[1:], e)
	case "help", "-h", "-help", "--help":
		usage(e.stdout)
		return grantcli.ExitOK
	}
	if isAgentCommand(args[0]) {
		return runAgent(args[0], args[1:], g, e)
	}
	fmt.Fprintf(e.stderr, "fiberctl: unknown command %q\n", args[0])
	usage(e.stderr)
	return grantcli.ExitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: fiberctl [-addr unix:///path|host:port] [-o text|json] [-tls-cert F -tls-key F] [-ca F] <command> [flags]

The address defaults to $FIBERD_ADDR, else /var/lib/fiberd/fiberd.sock when
it exists, else 127.0.0.1:8484 (fiberd -dev).

commands:
  clone          ask fiberd for a fiber of a grant and print its endpoint:
                 fiberctl clone [-session S [-key KEY]] -grant-uid UID
                 or ask a FiberPool's grant Pods, picked and retried by the client:
                 fiberctl clone -pool NAME [-namespace NS] [-kubeconfig F] [-session S]
  release        end a fiber: fiberctl release [-key KEY] [-pool NAME] FIBER_ID
  park           checkpoint a fiber: fiberctl park [-key KEY] [-pool NAME] FIBER_ID
  status         print the agent's epoch, lane health, grants and fibers
  watch          print each status change until interrupted
  grant keygen   make an issuer signing key (private JWK, optional public JWKS)
  grant mint     sign a grant token and print it
  grant verify   check a grant token against a public JWKS and print its grant

Run "fiberctl <command> -h" or "fiberctl grant <subcommand> -h" for its flags.
`)
}

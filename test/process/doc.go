// Package process tests fiberd as a user runs it: the fiberd and fiberctl
// binaries, built with go build, as separate processes. It starts
// "fiberd -dev", clones fibers of the C and Python example templates with
// fiberctl, talks HTTP to each, restarts fiberd (a new epoch, the old fiber
// ids answer 404, no process of the first run left), and stops it with
// SIGTERM (exit 0, nothing left running).
//
// The test needs a Go toolchain, a C compiler and python3, and skips naming
// what is missing. It runs fibers in a cgroup v2 subtree named after the test
// when cgroup v2 is writable, and without cgroups otherwise.
//
// It imports pkg/api and pkg/cgroup for their types and helpers only; the
// daemon is driven through its binaries.
package process

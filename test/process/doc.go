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
// TestKill9LeavesNothing kills fiberd with SIGKILL while it serves, in the
// middle of a burst of Clones, while its zygotes warm and while it drains,
// and checks that no zygote or fiber outlives it by more than a moment and
// that nothing of the killed run (what its fibers started included) is
// alive, nor any of its cgroups left, once a restarted fiberd serves.
// TestHungTemplateDelaysNobody runs a template that never warms beside the
// counters and checks that it holds up no other grant and no Clone's
// deadline. TestKill9MidParkLeavesNothing kills fiberd with SIGKILL while
// CRIU dumps a fiber and while it restores one, with cgroups and without,
// and checks that once a restarted fiberd serves no fiber, image, process
// or cgroup of the killed run is left; it needs the CRIU hack/criu.sh
// builds and root, and skips saying so (fails under FIBERD_CRIU_REQUIRED=1).
//
// It imports pkg/api, pkg/client and pkg/cgroup for their types and
// helpers, and internal/devkit to build template specs; the daemon is
// driven through its binaries, or its API.
package process

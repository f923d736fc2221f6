// Package kubeapi runs a real Kubernetes API server for tests: one etcd and one kube-apiserver on
// loopback, started by the repository's hack/kube-up.sh from the binaries hack/kube-tools.sh builds
// (`make kube-tools`). There is no scheduler, controller-manager or kubelet, so the package also
// plays the kubelet's part where a test needs it: it writes a Pod's status.podIPs and deletes Pods
// with a grace period of 0.
//
// # Lifecycle
//
// A test binary has one shared control plane. Its TestMain calls Main, which runs the tests and
// stops the control plane afterwards; the first test that calls Shared or NewEnv starts it, so a
// binary whose selected tests need none starts none. A test that must stop, restart or reconfigure
// a control plane (liveness, API version discovery) calls Start for one of its own, which its
// t.Cleanup removes. Every control plane has a watchdog process that stops it and removes its
// directory once the test binary is gone, even when the binary was killed by its timeout and no
// cleanup ran.
//
// Each test gets a fresh namespace from NewEnv, so tests do not see each other's objects. A deleted
// namespace stays Terminating for ever here (no namespace controller runs), which is also how a
// test causes "namespace terminating".
//
// # Missing binaries
//
// When kube-apiserver or etcd are missing, Shared, NewEnv and Start skip the test with a message that
// names `make kube-tools`. With FIBERD_KUBE_REQUIRED=1 in the environment (CI sets it) they fail the
// test instead, so CI never passes by skipping.
//
// # Environment
//
//   - FIBERD_KUBE_BIN: directory with kube-apiserver and etcd. Default
//     ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin, where hack/kube-tools.sh puts them.
//   - FIBERD_KUBE_UP: path of kube-up.sh. Default hack/kube-up.sh in the first parent directory of
//     the working directory that has one (go test runs in the package directory).
//   - FIBERD_KUBE_REQUIRED: "1" turns a skip for missing binaries into a failure.
//
// # Who imports it
//
// Integration tests (pkg/home/kubernetes) and end-to-end tests (test/e2e). It imports client-go and
// the standard library only, nothing of fiberd, so any package may use it without an import cycle.
package kubeapi

// Package node is make e2e-node: grant Pods on a real Kubernetes node. The
// control plane is hack/kube-up.sh's (test/kubeapi), the node
// hack/node-up.sh's: containerd and runc from Debian, a CNI bridge, a
// kubelet, kube-scheduler, kube-controller-manager, kube-proxy and CoreDNS
// built by hack/kube-tools.sh -node, images built here by hack/images.sh and
// imported, never pulled. The suite applies deploy/kubernetes as a user
// would, only the image names substituted, and checks what only a real
// kubelet can show: the readiness gate, the projected grant token, clones
// from another Pod on the Pod IP over mTLS, the drain on delete, a
// restarted container's epoch, namespace deletion, zombies, the security
// context, garbage collection, and that stopping the node leaves nothing behind.
// TestPool adds a second node and runs deploy/controller as a user applies it:
// a FiberPool's grant Pods over both nodes, Clones from a client Pod routed by
// pkg/client/pool with no API server write per Clone, failover when a Pod is
// killed, a drained scale-down and a roll with the controller restarted.
//
// The tests carry the build tag e2enode and need root; run them with
//
//	make e2e-node
//
// Without root or the node's binaries they skip, naming what is missing;
// with FIBERD_KUBE_REQUIRED=1 (make e2e-node, CI) they fail instead.
package node

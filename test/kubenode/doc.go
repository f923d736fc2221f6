// Package kubenode runs a real Kubernetes node for tests and benchmarks:
// hack/node-up.sh's containerd, runc, CNI bridge, kubelet, CoreDNS and, on
// the primary node, kube-scheduler, kube-controller-manager and kube-proxy,
// joined to a control plane of hack/kube-up.sh (test/kubeapi, started with
// Options.NodeAddress). It also builds the images a node runs
// (hack/images.sh), and reads what a node could leave on the machine
// (HostState), so a caller can check that stopping one left nothing.
//
// # Lifecycle
//
// Start starts a node and returns once the Node is Ready; Close stops it,
// Pods still running included, and removes its directory. A node whose
// caller dies is cleaned by node-up.sh's watchdog within a second or two.
//
// # Requirements
//
// Root, the Debian packages containerd, runc, containernetworking-plugins,
// nftables and iproute2, and the binaries of hack/kube-tools.sh -node
// (`make node-tools`). Missing returns what is missing and how to get it.
//
// # Who imports it
//
// The node suite (test/node, make e2e-node) and the bench's real-node
// "Pod per worker" row. It imports nothing of fiberd.
package kubenode

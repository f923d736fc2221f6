// Package e2e is fiberd's end-to-end suite for the Kubernetes grant Pod: a
// real kube-apiserver and etcd (test/kubeapi), the development issuer
// (cmd/grant-issuer serve) and the real `fiberd -home kubernetes` process,
// with the manifests of deploy/kubernetes applied to the API server.
//
// No kubelet runs: the suite plays its part. It creates the grant Pod from
// deploy/kubernetes/grant-pod.yaml, writes status.podIP and podIPs
// (127.0.0.x), requests the Pod's bound token with the TokenRequest API for
// the issuer's audience, and starts fiberd with that token file, the Pod's
// downward-API environment and a kubeconfig of the Pod's own service
// account (never the admin).
//
// The tests carry the build tag e2e, so `go test ./...` compiles none of
// them; run them with
//
//	go test -tags e2e -count=1 -timeout 30m ./test/e2e/
//
// (make e2e). They need kube-apiserver and etcd (make kube-tools), python3
// for the example template, and a Go toolchain to build fiberd, fiberctl
// and grant-issuer; without the control plane binaries they skip, and with
// FIBERD_KUBE_REQUIRED=1 they fail instead.
package e2e

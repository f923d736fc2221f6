// Package kubernetes is fiberd's home in a Kubernetes grant Pod, where
// fiberd is the Pod's one container. The home fetches the Pod's grant from
// the controller with the Pod's bound service-account token, renews it at
// half its lease and writes it into the grants directory. The directory is
// polled for *.jwt files, so a grant another writer drops there is read
// too. Without a token file, grants arrive only as such files.
//
// Control-plane liveness is the API server answering for the Pod.
// Readiness is a Pod condition a readiness gate waits on, set once a
// template is warm. The cgroup subtree is the Pod's own, under the
// kubelet's ceiling. Endpoints are the Pod's IP, and the device channel is
// the Pod's ResourceClaim. Scope is what the Pod is, namespace, service
// account, node and claims, and the home loses it when the Pod is gone,
// replaced or terminating, the namespace terminates, a claim is deleted
// under a live Pod, or the cluster has not served the claims for the stale
// TTL.
//
// The FiberPool controller (the module controller/) creates grant Pods: it
// lists PodConditionZygoteReady as a readiness gate on every grant Pod, and
// its issuer (controller/issuer, on pkg/issuer's exchange) serves the grants
// the home fetches.
//
// cmd/fiberd builds this home (New, with a Kube from NewKube) and hands it
// to pkg/fiberd; it is the only package of fiberd that imports client-go.
// Tests serve Kube from memory with the fake sub-package.
package kubernetes

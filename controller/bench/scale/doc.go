// Command scale measures the FiberPool controller and fiberd's Kubernetes homes at scale, by
// simulation: a real kube-apiserver and etcd on 127.0.0.1 (test/kubeapi, ports the kernel
// picks), N grant Pods on simulated Nodes, and no kubelet.
//
// # What runs
//
//   - The controller, as cmd/fiberd-controller wires it (the pool Reconciler and the issuer in
//     one controller-runtime manager, leader election off, no client certificate for fiberd's
//     API so fibers in use stay unknown), in a process of its own: this executable started
//     again with FIBERD_SCALE_CONTROLLER set, so its RSS and Go heap are its own. Its issuer
//     serves HTTPS on 127.0.0.1 with a self-signed certificate the homes trust.
//   - Simulated kubelets (kubelet.go): each new Pod is bound to the Node with fewest Pods (a
//     Binding), reported Running with a Pod IP (a status patch), and marked Ready once its
//     readiness gate fiberd.io/zygote-ready is True (a status patch).
//   - One real pkg/home/kubernetes home per running Pod, all in this process (homes.go): the
//     Pod's bound token from the TokenRequest API for the issuer's audience, the first grant
//     fetched from the controller's issuer, renewal at half lease, the Pod and its Namespace
//     read every -poll, the readiness condition patched once. Grants are not handed to an
//     engine, so no fiber runs and the grants directory is not watched.
//   - The EndpointSlice controller's part: one write of each pool's EndpointSlices once every
//     Pod is Ready (no kube-controller-manager runs).
//   - Pool clients (pkg/client/pool's SliceSource, what pool.Open runs): -clients watches of
//     the pools' EndpointSlices during the Clone-load window. No Clone is sent: a Clone is a
//     request to a grant Pod's fiberd and costs no API request, and no fiberd runs here.
//
// # What it reports
//
// The time from the pools' creation to every Pod Ready; API requests per second by verb and
// resource (the API server's apiserver_request_total) at rest and under Clone load, split into
// the homes' share (counted in their transport) and the controller's (its
// rest_client_requests_total); the controller's reconcile rate and latency
// (controller_runtime_reconcile_time_seconds, controller "fiberpool"), RSS and Go heap; the
// grants its issuer signed per second. docs/benchmarks.md "At scale, by simulation" holds the
// recorded run and its projection to 10,000 grant Pods.
//
// # Running it
//
// From the controller module, with kube-apiserver and etcd built (`make kube-tools`):
//
//	go run ./bench/scale -pods 1000 -crd ../deploy/controller/fiberd.io_fiberpools.yaml
//
// TestScaleSmoke (build tag integration, part of `make test-integration`) runs it with 4 Pods
// in about 20 s so it cannot rot.
package main

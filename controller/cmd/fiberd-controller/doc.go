// Command fiberd-controller runs the FiberPool controller (package pool) in a controller-runtime
// manager: it keeps each FiberPool's grant Pods and status, serves Prometheus metrics and health
// probes, and, with leader election (on by default), runs as one active replica among several.
//
//	fiberd-controller [-kubeconfig FILE] [-metrics-bind-address :8080] [-health-probe-bind-address :8081]
//	                  [-leader-elect=true] [-leader-election-namespace NS] [-leader-election-id ID]
//	                  [-issuer-url URL] [-fiberd-tls-dir DIR] [-fiberd-server-name NAME]
//	                  [-fibers-interval 15s] [-v N]
//
// With -fiberd-tls-dir (tls.crt and tls.key of a client certificate the grant Pods' client CA
// signed, ca.crt of their serving certificate's CA) it reads each grant Pod's fibers in use from
// fiberd (GET /v1/status) for the pools' status and their drains; without it, or with an empty
// directory (an optional Secret not made), fibers in use are unknown and a draining Pod waits its
// pool's whole drainGracePeriod. The client certificate is read again when its files change;
// ca.crt, and whether the directory holds the files at all, only at start.
//
// Outside a cluster it reads -kubeconfig, else $KUBECONFIG, else ~/.kube/config; in a Pod, its
// service account (deploy/controller). It exits 0 on SIGTERM or SIGINT once the manager has
// stopped (and, with leader election, released its lease), 2 on a bad flag, 1 on any other failure.
package main

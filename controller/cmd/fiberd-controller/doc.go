// Command fiberd-controller runs the FiberPool controller (package pool) in a controller-runtime
// manager: it keeps each FiberPool's grant Pods and status, serves Prometheus metrics and health
// probes, and, with leader election (on by default), runs as one active replica among several.
//
//	fiberd-controller [-kubeconfig FILE] [-metrics-bind-address :8080] [-health-probe-bind-address :8081]
//	                  [-leader-elect=true] [-leader-election-namespace NS] [-leader-election-id ID]
//	                  [-issuer-url URL] [-v N]
//
// Outside a cluster it reads -kubeconfig, else $KUBECONFIG, else ~/.kube/config; in a Pod, its
// service account (deploy/controller). It exits 0 on SIGTERM or SIGINT once the manager has
// stopped (and, with leader election, released its lease), 2 on a bad flag, 1 on any other failure.
package main

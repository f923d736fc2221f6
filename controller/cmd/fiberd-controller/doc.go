// Command fiberd-controller runs the FiberPool controller (package pool) in a controller-runtime
// manager: it keeps each FiberPool's grant Pods and status, serves Prometheus metrics and health
// probes, and, with leader election (on by default), runs as one active replica among several.
// Every replica, leader or not, also serves the grant issuer (package issuer) on
// -issuer-bind-address: the grant Pods' fiberd fetches and renews its grant there, and learns the
// issuer's keys from its OIDC discovery. /readyz fails until the issuer's keys are loaded.
//
//	fiberd-controller [-kubeconfig FILE] [-metrics-bind-address :8080] [-health-probe-bind-address :8081]
//	                  [-leader-elect=true] [-leader-election-namespace NS] [-leader-election-id ID]
//	                  [-issuer-url URL] [-issuer-bind-address :8443|0]
//	                  [-issuer-tls-cert FILE] [-issuer-tls-key FILE]
//	                  [-issuer-keys-namespace NS] [-issuer-keys-secret NAME]
//	                  [-issuer-key-rotation 24h] [-issuer-key-prepublish 15m]
//	                  [-issuer-lease 10m] [-issuer-max-lease 1h]
//	                  [-fiberd-tls-dir DIR] [-fiberd-server-name NAME] [-fibers-interval 15s] [-v N]
//
// -issuer-url is this issuer's URL as the grant Pods reach it (its Service,
// https://fiberd-issuer.fiberd-system.svc by default): the iss of every grant and the audience of
// the grant Pods' projected tokens. -issuer-bind-address=0 turns the issuer off, for a cluster
// whose grants come from elsewhere (the development issuer, cmd/grant-issuer); -issuer-url must
// then name that one.
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

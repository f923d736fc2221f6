package main

// clone -pool: a Clone routed across a FiberPool's grant Pods by pkg/client/pool.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/client/pool"
)

// poolSyncTimeout bounds the wait for the pool's EndpointSlices to be
// listed, within the command's own deadline.
const poolSyncTimeout = 30 * time.Second

// poolOptions are clone's flags for -pool.
type poolOptions struct {
	name       string
	namespace  string
	kubeconfig string
	serverName string
}

// kubeFunc connects to a cluster: a client of the EndpointSlices of
// namespace, or of the namespace kubeconfig's context names when it is
// empty (in a Pod its own, else "default"), and that namespace. kubeconfig
// empty is the default loading rules, then in-cluster.
type kubeFunc func(kubeconfig, namespace string) (pool.SliceClient, string, error)

// kubeClient is the kubeFunc of the real cluster: kubeconfig, else
// $KUBECONFIG or ~/.kube/config, else the Pod's in-cluster configuration.
// Its client knows discovery.k8s.io/v1 alone (pool.NewSliceClient), so
// fiberctl does not link every API group's client.
func kubeClient(kubeconfig, namespace string) (pool.SliceClient, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("-kubeconfig %q: %w", kubeconfig, err)
	}
	if namespace == "" {
		if namespace, _, err = cc.Namespace(); err != nil {
			return nil, "", fmt.Errorf("-kubeconfig %q: namespace: %w", kubeconfig, err)
		}
	}
	rc.UserAgent = "fiberctl"
	c, err := pool.NewSliceClient(rc, namespace)
	if err != nil {
		return nil, "", fmt.Errorf("-kubeconfig %q: %w", kubeconfig, err)
	}
	return c, namespace, nil
}

// fiberCaller releases and parks fibers: a *client.Client of one agent, or
// a *pool.Pool that finds the fiber's Pod.
type fiberCaller interface {
	ReleaseFiber(ctx context.Context, req api.FiberRequest) error
	ParkFiber(ctx context.Context, req api.FiberRequest) (api.ParkResponse, error)
}

// poolCloneOutput is clone -pool's JSON line: the Pod's answer and the Pod
// that served it.
type poolCloneOutput struct {
	api.CloneResponse
	// Pod and PodAddr are the grant Pod that served the Clone and its
	// fiberd API, where release and park of the fiber go.
	Pod     string `json:"pod"`
	PodAddr string `json:"podAddr"`
}

// register adds -pool, -namespace, -kubeconfig and -server-name to fs;
// what is the command's: "clone from" or "release or park a fiber of".
func (po *poolOptions) register(fs *flag.FlagSet, what string) {
	fs.StringVar(&po.name, "pool", "", what+" the FiberPool `NAME`: its grant Pods, found in its Service's EndpointSlices (instead of -addr)")
	fs.StringVar(&po.namespace, "namespace", "", "the pool's namespace (default the kubeconfig context's, in a Pod its own)")
	fs.StringVar(&po.kubeconfig, "kubeconfig", "", "kubeconfig `FILE` to read the EndpointSlices with (default $KUBECONFIG, ~/.kube/config, else in-cluster)")
	fs.StringVar(&po.serverName, "server-name", "", "the name the grant Pods' certificate is checked against (default fiberd.NAMESPACE.svc)")
}

// check is the usage error of pool flags given without -pool, or of -pool
// with -addr; "" when there is none.
func (po poolOptions) check(g global) string {
	switch {
	case po.name != "" && g.addrSet:
		return "-pool finds the grant Pods itself: leave out -addr"
	case po.name == "" && (po.namespace != "" || po.kubeconfig != "" || po.serverName != ""):
		return "-namespace, -kubeconfig and -server-name go with -pool NAME"
	}
	return ""
}

// open starts a pool client of the pool po names, its EndpointSlices
// listed within ctx. On failure it reports and returns the exit status.
func (po poolOptions) open(ctx context.Context, fs *flag.FlagSet, g global, e env) (*pool.Pool, string, int) {
	kube := e.kube
	if kube == nil {
		kube = kubeClient
	}
	sc, ns, err := kube(po.kubeconfig, po.namespace)
	if err != nil {
		return nil, "", grantcli.UsageError(fs, "%v", err)
	}
	cfg := pool.Config{Namespace: ns, Name: po.name}
	if g.tlsCert != "" || g.ca != "" {
		tc, err := client.TLSConfig(g.tlsCert, g.tlsKey, g.ca)
		if err != nil {
			return nil, "", grantcli.UsageError(fs, "%v", err)
		}
		tc.ServerName = po.serverName
		cfg.TLS = tc
	}
	octx, cancel := context.WithTimeout(ctx, poolSyncTimeout)
	defer cancel()
	p, err := pool.Open(octx, sc, cfg)
	if err != nil {
		return nil, "", grantcli.Failure(fs, escapedError{err})
	}
	return p, ns, grantcli.ExitOK
}

// clonePool sends req to the pool po names, within deadline when set, and
// prints the fiber and the Pod that served it.
func clonePool(ctx context.Context, fs *flag.FlagSet, req api.CloneRequest, deadline time.Duration, po poolOptions, g global, e env) int {
	if deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, deadline)
		defer cancel()
	}
	p, ns, code := po.open(ctx, fs, g, e)
	if p == nil {
		return code
	}
	defer p.Close()
	start := e.clock.Now()
	resp, err := p.Clone(ctx, req)
	took := e.clock.Since(start)
	if err != nil {
		code := callFailed(fs, g, e, err)
		if errors.Is(err, pool.ErrNoReadyPods) {
			fmt.Fprintf(e.stderr, "fiberctl clone: see the pool's Pods and endpoints: kubectl -n %s get fiberpool %s; kubectl -n %s get endpointslices -l kubernetes.io/service-name=%s\n",
				field(ns), field(po.name), field(ns), field(po.name))
		}
		return code
	}
	ep, _ := p.PodOf(resp.FiberID)
	if g.json {
		return printJSON(e, poolCloneOutput{CloneResponse: resp, Pod: ep.PodName, PodAddr: ep.Addr})
	}
	printClone(e, resp, took, field(ep.PodName)+" ("+field(ep.Addr)+")")
	return grantcli.ExitOK
}

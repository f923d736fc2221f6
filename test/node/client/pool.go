package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/client/pool"
)

// saNamespace is where a Pod's ServiceAccount token mount names its namespace.
const saNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// poolMode is -pool's flags: Clones routed across a FiberPool by pkg/client/pool.
type poolMode struct {
	name, namespace string
	stopFile        string
	interval        time.Duration
	deadline        time.Duration
}

// run opens the pool with the Pod's in-cluster credentials and the client
// certificate, runs the cycles, and returns the exit code: 0 when every cycle
// worked, 1 when one failed or the pool could not be opened, 2 on bad usage.
func (po poolMode) run(cert, key, ca string, n int) int {
	tlsCfg, err := client.TLSConfig(cert, key, ca)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 2
	}
	ns := po.namespace
	if ns == "" {
		b, err := os.ReadFile(saNamespace)
		if err != nil {
			fmt.Fprintf(os.Stderr, "client: -namespace is empty and the Pod's namespace is unknown: %v\n", err)
			return 2
		}
		ns = strings.TrimSpace(string(b))
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "client: -pool needs in-cluster credentials (a ServiceAccount token): %v\n", err)
		return 2
	}
	sc, err := pool.NewSliceClient(rc, ns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	octx, cancel := context.WithTimeout(context.Background(), time.Minute)
	p, err := pool.Open(octx, sc, pool.Config{Namespace: ns, Name: po.name, TLS: tlsCfg})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	defer p.Close()
	out := json.NewEncoder(os.Stdout)
	failed := false
	for i := 1; ; i++ {
		if i > n && (po.stopFile == "" || stopped(po.stopFile)) {
			break
		}
		cy := po.cycle(p, i)
		_ = out.Encode(cy)
		failed = failed || cy.Error != ""
		if po.interval > 0 {
			time.Sleep(po.interval)
		}
	}
	if failed {
		return 1
	}
	return 0
}

// stopped reports whether the stop file exists.
func stopped(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// cycle clones through the pool within the deadline, reads the fiber's
// answer and releases the fiber on its Pod.
func (po poolMode) cycle(p *pool.Pool, n int) Cycle {
	cy := Cycle{N: n}
	ctx, cancel := context.WithTimeout(context.Background(), po.deadline)
	t0 := time.Now()
	resp, err := p.Clone(ctx, api.CloneRequest{})
	cy.CloneMs = ms(time.Since(t0))
	cancel()
	if err != nil {
		cy.Error, cy.Stage = "clone: "+err.Error(), "clone"
		return cy
	}
	cy.FiberID, cy.Endpoint = resp.FiberID, resp.Endpoint
	if ep, err := p.PodOf(resp.FiberID); err == nil {
		cy.Pod = ep.PodName
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	body, first, err := get(ctx, resp.Endpoint)
	cy.FirstByteMs = ms(first.Sub(t0))
	if err != nil {
		cy.Error, cy.Stage = "GET "+resp.Endpoint+": "+err.Error(), "get"
		return cy
	}
	cy.Body = body
	if err := p.Release(ctx, resp.FiberID); err != nil {
		cy.Error, cy.Stage = "release: "+err.Error(), "release"
	}
	return cy
}

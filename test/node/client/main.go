// Command client is the caller of make e2e-node's grant Pods: it runs in a
// Pod of its own on the node and, for each of -n cycles, clones a fiber of
// a grant through fiberd's API on the grant Pod's IP (TLS 1.3 with a client
// certificate, as deploy/kubernetes configures it), reads the fiber's HTTP
// answer at the endpoint fiberd advertised, and releases the fiber unless
// -keep. It prints one JSON line per cycle (Cycle) and exits 0 when every
// cycle worked; 1 at the first failure, after printing it; 2 on bad usage.
//
// With -pool NAME it clones through the FiberPool NAME instead (package
// pkg/client/pool: the pool's EndpointSlices, read with the Pod's own
// ServiceAccount token, pick the grant Pod and its grant), names the Pod that
// served each fiber, and carries on after a failed cycle: it runs -n cycles,
// or, with -stop-file, until that file exists (at least -n), one cycle every
// -interval, each Clone bounded by -deadline, and exits 1 at the end if any
// cycle failed.
//
// The suite (test/node) packages it as the image fiberd.local/node-client:dev
// (hack/images.sh) and reads its lines from the Pod's log.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
)

// Cycle is what one clone cycle printed: a JSON object per line.
type Cycle struct {
	// N counts the cycles from 1.
	N int `json:"n"`
	// FiberID and Endpoint are the Clone's answer.
	FiberID  string `json:"fiberID"`
	Endpoint string `json:"endpoint"`
	// Body is the fiber's HTTP answer to GET /.
	Body string `json:"body"`
	// CloneMs is the Clone call's time; FirstByteMs from the Clone's start
	// to the first byte of the fiber's answer.
	CloneMs     float64 `json:"cloneMs"`
	FirstByteMs float64 `json:"firstByteMs"`
	// Error, when set, is why the cycle failed, and Stage the step that
	// failed: "clone", "get" (the fiber's answer) or "release".
	Error string `json:"error,omitempty"`
	Stage string `json:"stage,omitempty"`
	// Pod is the grant Pod that served the fiber (pool mode only).
	Pod string `json:"pod,omitempty"`
}

func main() {
	addr := flag.String("addr", "", "fiberd's API, https://POD_IP:PORT (required)")
	serverName := flag.String("server-name", "", "the name fiberd's certificate is checked against (default the host of -addr)")
	cert := flag.String("tls-cert", "", "client certificate (PEM)")
	key := flag.String("tls-key", "", "key of -tls-cert (PEM)")
	ca := flag.String("ca", "", "CA bundle fiberd's certificate chains to (PEM)")
	grantUID := flag.String("grant-uid", "", "the grant to clone: the grant Pod's UID (required)")
	n := flag.Int("n", 1, "clone cycles")
	keep := flag.Bool("keep", false, "keep the fibers (do not release them)")
	wait := flag.Duration("wait", 60*time.Second, "how long the first Clone is retried while fiberd is unreachable")
	var po poolMode
	flag.StringVar(&po.name, "pool", "", "clone through the FiberPool `NAME` (its EndpointSlices, in-cluster credentials) instead of -addr and -grant-uid")
	flag.StringVar(&po.namespace, "namespace", "", "the pool's namespace (default the Pod's own)")
	flag.StringVar(&po.stopFile, "stop-file", "", "with -pool: clone until this file exists (at least -n cycles)")
	flag.DurationVar(&po.interval, "interval", 0, "with -pool: pause between cycles")
	flag.DurationVar(&po.deadline, "deadline", 10*time.Second, "with -pool: bound of each Clone, every Pod asked included")
	flag.Parse()
	if po.name != "" {
		if *addr != "" || *grantUID != "" || *n < 1 {
			fmt.Fprintln(os.Stderr, "client: -pool finds the Pods and their grants: leave out -addr and -grant-uid; -n at least 1")
			os.Exit(2)
		}
		os.Exit(po.run(*cert, *key, *ca, *n))
	}
	if *addr == "" || *grantUID == "" || *n < 1 {
		fmt.Fprintln(os.Stderr, "client: -addr and -grant-uid are required, -n at least 1")
		os.Exit(2)
	}
	tlsCfg, err := client.TLSConfig(*cert, *key, *ca)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(2)
	}
	tlsCfg.ServerName = *serverName
	c, err := client.New(client.Config{Addr: *addr, TLS: tlsCfg, Timeout: 20 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for i := 1; i <= *n; i++ {
		cy := cycle(c, *grantUID, i, *keep, *wait)
		_ = out.Encode(cy)
		if cy.Error != "" {
			os.Exit(1)
		}
	}
}

// cycle clones, reads the fiber's answer and releases the fiber. The first
// cycle retries the Clone while fiberd cannot be reached, up to wait.
func cycle(c *client.Client, uid string, n int, keep bool, wait time.Duration) Cycle {
	cy := Cycle{N: n}
	ctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	deadline := time.Now().Add(wait)
	var (
		resp api.CloneResponse
		err  error
		t0   time.Time
	)
	for {
		t0 = time.Now()
		resp, err = c.Clone(ctx, api.CloneRequest{GrantUID: uid})
		if _, isAPI := client.AsError(err); err == nil || isAPI || n > 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	cy.CloneMs = ms(time.Since(t0))
	if err != nil {
		cy.Error, cy.Stage = "clone: "+err.Error(), "clone"
		return cy
	}
	cy.FiberID, cy.Endpoint = resp.FiberID, resp.Endpoint
	body, first, err := get(ctx, resp.Endpoint)
	cy.FirstByteMs = ms(first.Sub(t0))
	if err != nil {
		cy.Error, cy.Stage = "GET "+resp.Endpoint+": "+err.Error(), "get"
		return cy
	}
	cy.Body = body
	if !keep {
		if err := c.Release(ctx, resp.FiberID); err != nil {
			cy.Error, cy.Stage = "release: "+err.Error(), "release"
		}
	}
	return cy
}

// get dials the fiber's tcp:// endpoint and returns its answer to GET /
// and when its first byte (the status line) came.
func get(ctx context.Context, endpoint string) (string, time.Time, error) {
	hostPort, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", time.Now(), fmt.Errorf("endpoint %q is not tcp://host:port", endpoint)
	}
	if _, _, err := net.SplitHostPort(hostPort); err != nil {
		return "", time.Now(), err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+hostPort+"/", nil)
	if err != nil {
		return "", time.Now(), err
	}
	res, err := http.DefaultClient.Do(req)
	first := time.Now()
	if err != nil {
		return "", first, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if err != nil {
		return "", first, err
	}
	if res.StatusCode != http.StatusOK {
		return string(b), first, fmt.Errorf("status %s", res.Status)
	}
	return string(b), first, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

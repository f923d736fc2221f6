package pool

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Defaults of FibersConfig.
const (
	DefaultFibersServerName  = "fiberd.{namespace}.svc"
	DefaultFibersInterval    = 15 * time.Second
	DefaultFibersTimeout     = 2 * time.Second
	DefaultFibersConcurrency = 8
)

// maxStatusBytes bounds the body of a fiberd status read: a status lists each running fiber
// (about 200 bytes) of a few grants, far below this.
const maxStatusBytes = 4 << 20

// FibersConfig is how the controller reads grant Pods' fibers in use: GET /v1/status on each
// Pod's API port, over TLS 1.3 with a client certificate fiberd's -client-ca signed (fiberd's TLS
// listener refuses a caller without one). The zero value reads none: fibers in use are unknown,
// and a draining Pod waits its pool's whole drainGracePeriod.
type FibersConfig struct {
	// TLS is the client side of fiberd's API: its Certificates (or GetClientCertificate) hold the
	// client certificate, its
	// RootCAs the CA of fiberd's serving certificate, MinVersion TLS 1.3 (pkg/client.TLSConfig
	// builds one). Its ServerName is ignored (ServerName below is). Nil reads no Pod.
	TLS *tls.Config
	// ServerName is the name checked in fiberd's certificate while dialling a Pod IP, with
	// "{namespace}" and "{pool}" replaced by the Pod's. Empty means DefaultFibersServerName, the
	// name deploy/kubernetes's fiberd-api-tls certificate carries.
	ServerName string
	// Port is fiberd's API port on the Pod. Zero means 8484, the grant Pod's.
	Port int32
	// Interval is how long a Pod's count is used before it is read again; a pool with a
	// draining Pod, or with Pods at all, is reconciled again after it. Zero means
	// DefaultFibersInterval.
	Interval time.Duration
	// Timeout bounds one read, connection included. Zero means DefaultFibersTimeout.
	Timeout time.Duration
	// Concurrency is how many Pods of one pool are read at once. Zero means
	// DefaultFibersConcurrency.
	Concurrency int
}

func (c FibersConfig) withDefaults() FibersConfig {
	if c.ServerName == "" {
		c.ServerName = DefaultFibersServerName
	}
	if c.Port == 0 {
		c.Port = apiPort
	}
	if c.Interval == 0 {
		c.Interval = DefaultFibersInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultFibersTimeout
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultFibersConcurrency
	}
	return c
}

// validate reports a field of c that cannot work, naming it.
func (c FibersConfig) validate() error {
	switch {
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("pool: Fibers.Port %d: want a TCP port, 1 to 65535", c.Port)
	case c.Interval < 0 || c.Timeout < 0 || c.Concurrency < 0:
		return errors.New("pool: Fibers.Interval, Timeout and Concurrency must not be negative (zero is the default)")
	case c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetClientCertificate == nil:
		return errors.New("pool: Fibers.TLS has no client certificate: fiberd's API refuses callers without one; give one, or no TLS to leave fibers in use unknown")
	}
	return nil
}

// fiberCount is the fibers in use a Pod reported, and when they were read.
type fiberCount struct {
	n  int64
	at time.Time
}

// fiberSample is one read of a Pod's fibers in use.
type fiberSample struct {
	inUse int64
	err   error
	at    time.Time
}

// fiberCounter reads grant Pods' fibers in use and keeps each count for an interval. It is the
// only state a Reconciler keeps between reconciles, and losing it costs a read per Pod.
type fiberCounter struct {
	cfg  FibersConfig
	http *http.Client

	mu      sync.Mutex
	samples map[types.NamespacedName]map[types.UID]fiberSample // by pool, then Pod
}

// newFiberCounter makes a counter for cfg (defaults filled); nil when cfg.TLS is nil.
func newFiberCounter(cfg FibersConfig) *fiberCounter {
	if cfg.TLS == nil {
		return nil
	}
	base := cfg.TLS.Clone()
	if base.MinVersion < tls.VersionTLS13 {
		base.MinVersion = tls.VersionTLS13
	}
	dialer := &net.Dialer{}
	transport := &http.Transport{
		// One read per Pod per interval: a connection kept open would outlive the reconcile
		// for little gain, and closing each leaves no goroutine behind.
		DisableKeepAlives: true,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			name, _ := ctx.Value(serverNameKey{}).(string)
			cfg := base.Clone()
			cfg.ServerName = name
			d := tls.Dialer{NetDialer: dialer, Config: cfg}
			return d.DialContext(ctx, network, addr)
		},
	}
	return &fiberCounter{
		cfg:     cfg,
		http:    &http.Client{Transport: transport},
		samples: map[types.NamespacedName]map[types.UID]fiberSample{},
	}
}

// serverNameKey carries the TLS server name of one read in its request's context.
type serverNameKey struct{}

// countable reports a Pod whose fiberd can be asked: it has a Pod IP, runs and is not being
// deleted.
func countable(pod *corev1.Pod) bool {
	return pod.Status.PodIP != "" && pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil
}

// count returns the fibers in use of pool's countable pods, by UID, with when each was read,
// reading those whose last
// count is older than the interval (at most Concurrency at once, each within Timeout), and the
// names of the Pods whose count is unknown, with why. It forgets the Pods of pool not in pods.
// It returns once every read it started has ended.
func (f *fiberCounter) count(ctx context.Context, pool types.NamespacedName, pods []*corev1.Pod, now time.Time) (map[types.UID]fiberCount, []string) {
	f.mu.Lock()
	old := f.samples[pool]
	f.mu.Unlock()

	fresh := make(map[types.UID]fiberSample, len(pods))
	var stale []*corev1.Pod
	for _, pod := range pods {
		if !countable(pod) {
			continue
		}
		if s, ok := old[pod.UID]; ok && now.Sub(s.at) < f.cfg.Interval && now.Sub(s.at) >= 0 {
			fresh[pod.UID] = s
			continue
		}
		stale = append(stale, pod)
	}

	results := make([]fiberSample, len(stale))
	sem := make(chan struct{}, f.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, pod := range stale {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			n, err := f.read(ctx, pod)
			results[i] = fiberSample{inUse: n, err: err, at: now}
		}()
	}
	wg.Wait()
	for i, pod := range stale {
		fresh[pod.UID] = results[i]
	}

	f.mu.Lock()
	f.samples[pool] = fresh
	f.mu.Unlock()

	inUse := map[types.UID]fiberCount{}
	var unknown []string
	for _, pod := range pods {
		s, ok := fresh[pod.UID]
		switch {
		case !ok:
		case s.err != nil:
			unknown = append(unknown, fmt.Sprintf("%s: %v", pod.Name, s.err))
		default:
			inUse[pod.UID] = fiberCount{n: s.inUse, at: s.at}
		}
	}
	return inUse, unknown
}

// forget drops what the counter holds for pool (deleted).
func (f *fiberCounter) forget(pool types.NamespacedName) {
	f.mu.Lock()
	delete(f.samples, pool)
	f.mu.Unlock()
}

// fiberdStatus is the part of fiberd's GET /v1/status the counter reads (docs/api.md): each
// admitted grant's running fibers. A caller fiberd does not authenticate gets these counts too.
type fiberdStatus struct {
	Grants []struct {
		Running int64 `json:"running"`
	} `json:"grants"`
}

// read asks pod's fiberd for its status and sums its grants' running fibers.
func (f *fiberCounter) read(ctx context.Context, pod *corev1.Pod) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	name := strings.NewReplacer("{namespace}", pod.Namespace, "{pool}", pod.Labels[LabelPool]).Replace(f.cfg.ServerName)
	ctx = context.WithValue(ctx, serverNameKey{}, name)
	url := "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(f.cfg.Port))) + "/v1/status"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := f.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("fiberd status: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxStatusBytes))
	if err != nil {
		return 0, fmt.Errorf("fiberd status: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("fiberd status: %s: %.200s", resp.Status, body)
	}
	var st fiberdStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return 0, fmt.Errorf("fiberd status: not the JSON of GET /v1/status: %w", err)
	}
	var n int64
	for _, g := range st.Grants {
		n += g.Running
	}
	return n, nil
}

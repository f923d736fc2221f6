package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home/standalone"
	"fiberd.io/fiberd/pkg/template"
)

// Template names of the run.
const (
	tplWarmC      = "counter-c"
	tplColdC      = "counter-c-cold"
	tplWarmPy     = "counter-py"
	tplColdPy     = "counter-py-cold"
	tplDenseC     = "counter-c-dense"
	tplDenseColdC = "counter-c-dense-cold"
)

// The standalone agent's issuer and node id, and the capacity of every
// grant bench mints.
const (
	benchIssuer = "https://bench.fiberd.invalid"
	benchNode   = "bench-node"
	benchMax    = 256
)

// kit is the templates and the issuer key of a run.
type kit struct {
	dir       string            // the templates directory
	specs     map[string][]byte // by name: the spec file's bytes
	missing   map[string]string // by name: why the template is missing
	key       jose.JSONWebKey
	signer    *grant.Signer
	keys      *grant.StaticKeys
	ccVersion string
	pyVersion string
}

func (k *kit) warmCount() int {
	n := 0
	for name := range k.specs {
		if s, err := template.Parse(k.specs[name]); err == nil && s.Zygote {
			n++
		}
	}
	return n
}

// ref is the grant's template reference of name.
func (k *kit) ref(name string) string { return name + "@sha256:" + template.Digest(k.specs[name]) }

// prepareTemplates builds the examples and writes their specs under work.
func prepareTemplates(work string, o options) (*kit, error) {
	root, err := devkit.FindCheckout()
	if err != nil {
		return nil, err
	}
	k := &kit{dir: filepath.Join(work, "templates"), specs: map[string][]byte{}, missing: map[string]string{}}
	if err := os.MkdirAll(k.dir, 0o755); err != nil {
		return nil, err
	}
	add := func(name string, s template.Spec) error {
		b, err := devkit.WriteSpec(k.dir, name, s)
		if err == nil {
			k.specs[name] = b
		}
		return err
	}
	init := strconv.Itoa(o.initMs)
	if bin, err := devkit.BuildCounterC(root, filepath.Join(work, "bin")); err != nil {
		for _, n := range []string{tplWarmC, tplColdC, tplDenseC, tplDenseColdC, tplParkC1, tplParkC16} {
			k.missing[n] = "C template not built: " + err.Error()
		}
	} else {
		dense := []string{"--init-ms", init, "--hold-mib", strconv.Itoa(o.holdMiB), "--dirty-mib", strconv.Itoa(o.dirtyMiB)}
		for _, zy := range []bool{true, false} {
			if err := add(devkit.ColdName(tplWarmC, zy), devkit.CounterCSpec(bin, zy, "--init-ms", init)); err != nil {
				return nil, err
			}
			if err := add(devkit.ColdName(tplDenseC, zy), devkit.CounterCSpec(bin, zy, dense...)); err != nil {
				return nil, err
			}
		}
		for name, mib := range map[string]string{tplParkC1: "1", tplParkC16: "16"} {
			if err := add(name, devkit.CounterCSpec(bin, true, "--init-ms", init, "--dirty-mib", mib)); err != nil {
				return nil, err
			}
		}
		k.ccVersion = firstLine(exec.Command(envOr("CC", "cc"), "--version"))
	}
	if py, err := devkit.PythonInterpreter(); err != nil {
		for _, n := range []string{tplWarmPy, tplColdPy} {
			k.missing[n] = "Python template: " + err.Error()
		}
	} else {
		// The files where an isolated grant reads them too (fiberd -dev
		// does the same), so the isolated rows run the same template.
		src, err := devkit.SharePythonExample(root)
		if err != nil {
			src = root
		}
		for _, zy := range []bool{true, false} {
			if err := add(devkit.ColdName(tplWarmPy, zy), devkit.CounterPySpec(src, py, zy, "--init-ms", init)); err != nil {
				return nil, err
			}
		}
		k.pyVersion = firstLine(exec.Command(py, "--version"))
	}
	if len(k.specs) == 0 {
		return nil, errors.New("no template could be prepared: need cc or python3")
	}
	if k.key, err = grant.GenerateKey("EdDSA", ""); err != nil {
		return nil, err
	}
	if k.signer, err = grant.NewSigner(k.key); err != nil {
		return nil, err
	}
	jwks, err := grant.PublicJWKS(k.key)
	if err != nil {
		return nil, err
	}
	if k.keys, err = grant.NewStaticKeys(jwks); err != nil {
		return nil, err
	}
	return k, nil
}

// mint signs a grant of template name for audience aud by issuer iss.
func (k *kit) mint(uid, iss, aud, name string, lease time.Duration) ([]byte, error) {
	return k.mintWarm(uid, iss, aud, name, lease, 0)
}

// mintWarm is mint with fibers.warm = warm: the grant keeps that many
// spare fibers.
func (k *kit) mintWarm(uid, iss, aud, name string, lease time.Duration, warm int) ([]byte, error) {
	now := time.Now().Truncate(time.Second)
	return k.signer.Mint(core.Grant{
		UID: uid, Issuer: iss, Audience: aud, Template: k.ref(name),
		Fibers: core.Fibers{Max: benchMax, Warm: warm}, IssuedAt: now, Expiry: now.Add(lease),
	})
}

// agentRig is an in-process fiberd and a client of its unix socket.
type agentRig struct {
	agent  *fiberd.Agent
	client *client.Client
	uids   map[string]string // template name -> grant UID
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	clean  func() // removes the agent's run directory; set once it runs
}

// benchCRIU is the criu the proc backend parks with (-criu), "" for none.
var benchCRIU = backend.DefaultCRIUPath()

// newAgent builds an agent on h with both backends, asked for isolation iso.
func newAgent(ctx context.Context, dir string, h fiberd.Config, iso backend.Isolation, log logr.Logger) (*fiberd.Agent, error) {
	ids, err := backend.NewIDPool(backend.DefaultIDFirst, backend.DefaultIDCount)
	if err != nil {
		h.Home.Close()
		return nil, err
	}
	warm, err := backend.NewProc(backend.Config{Logger: log.WithName("proc"), Isolation: iso, IDs: ids, CRIU: benchCRIU})
	if err != nil {
		h.Home.Close()
		return nil, fmt.Errorf("proc backend: %w", err)
	}
	basic, err := backend.NewExec(backend.Config{Logger: log.WithName("exec"), Isolation: iso, IDs: ids})
	if err != nil {
		warm.Close()
		h.Home.Close()
		return nil, fmt.Errorf("exec backend: %w", err)
	}
	h.Warm, h.Basic = warm, basic
	h.StateDir = filepath.Join(dir, "state")
	// The bench measures the clone path, not the thrash budget.
	h.ThrashRate, h.ThrashBurst = 1e6, 1_000_000
	h.Logger = log
	return fiberd.New(ctx, h)
}

// startAgent runs fiberd with the standalone home on the templates of k
// named in names (nil: every one), its backends asked for isolation iso,
// and waits until every zygote is warm.
func startAgent(ctx context.Context, dir string, k *kit, o options, iso backend.Isolation, names []string, log logr.Logger) (*agentRig, error) {
	var gs []benchGrant
	for name := range k.specs {
		if names == nil || slices.Contains(names, name) {
			gs = append(gs, benchGrant{key: name, template: name})
		}
	}
	return startAgentWith(ctx, dir, k, o, iso, gs, log)
}

// benchGrant is one grant an agent of the run is given: of template, with
// fibers.warm warm, known in agentRig.uids as key.
type benchGrant struct {
	key, template string
	warm          int
}

// startAgentWith is startAgent on the grants gs.
func startAgentWith(ctx context.Context, dir string, k *kit, o options, iso backend.Isolation, gs []benchGrant, log logr.Logger) (*agentRig, error) {
	grants := filepath.Join(dir, "grants")
	if err := os.MkdirAll(grants, 0o700); err != nil {
		return nil, err
	}
	r := &agentRig{uids: map[string]string{}, done: make(chan error, 1)}
	for _, g := range gs {
		uid := "bench-" + g.key
		tok, err := k.mintWarm(uid, benchIssuer, benchNode, g.template, 24*time.Hour, g.warm)
		if err != nil {
			return nil, err
		}
		if err := core.WriteFileAtomic(filepath.Join(grants, g.key+".jwt"), tok, 0o600); err != nil {
			return nil, err
		}
		r.uids[g.key] = uid
	}
	h, err := standalone.New(standalone.Config{GrantsDir: grants, NoCgroups: true, Logger: log.WithName("home")})
	if err != nil {
		return nil, err
	}
	fam, _ := endpoint.ParseFamily(o.endpoint)
	runDir, clean := benchRunDir(dir)
	a, err := newAgent(ctx, dir, fiberd.Config{
		Home: h, Issuer: benchIssuer, NodeID: benchNode, Keys: k.keys, Templates: k.dir, EndpointFamily: fam, RunDir: runDir,
	}, iso, log)
	if err != nil {
		clean()
		return nil, fmt.Errorf("fiberd: %w", err)
	}
	r.agent, r.clean = a, clean
	rctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- a.Run(rctx) }()
	r.client, err = client.New(client.Config{Addr: "unix://" + a.SocketPath()})
	if err != nil {
		r.stop()
		return nil, err
	}
	want := map[string]bool{}
	for _, g := range gs {
		if s, _ := template.Parse(k.specs[g.template]); s.Zygote {
			want[r.uids[g.key]] = true
		}
	}
	if err := waitWarm(ctx, r.client, want, 2*time.Minute); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// waitWarm polls the agent's status until every grant of want is admitted
// and, when want says so, warm.
func waitWarm(ctx context.Context, c *client.Client, want map[string]bool, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		st, err := c.Status(ctx)
		if err == nil {
			ok := 0
			for _, g := range st.Grants {
				if w, listed := want[g.UID]; listed && (g.Warm || !w) {
					ok++
				}
			}
			if ok == len(want) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("grants not admitted and warm in %s (status error: %v): see the log file named at the start", limit, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the agent: every fiber released, every zygote stopped.
func (r *agentRig) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
		if r.clean != nil {
			r.clean()
		}
	})
}

// benchRunDir is where an agent of the run binds its fibers' unix sockets
// (fiberd's -run-dir): a new directory under /run, a tmpfs on most hosts as
// it is for fiberd's default (/run/fiberd), so the bench does not time a
// disk's file creation (a socket took 140 us on this host's ext4 and 20 us
// on tmpfs); dir/run, beside the state, when /run cannot be used. The
// returned function removes it.
func benchRunDir(dir string) (string, func()) {
	if d, err := os.MkdirTemp("/run", "fiberd-bench-"); err == nil {
		return d, func() { _ = os.RemoveAll(d) }
	}
	return filepath.Join(dir, "run"), func() {}
}

var pidRE = regexp.MustCompile(`pid=(\d+)`)

// firstByte is one clone: Clone, dial, GET, first byte. It returns the
// time to the first byte and the fiber; with whole, it also reads the
// whole answer and returns the fiber's pid.
func firstByte(ctx context.Context, c *client.Client, uid string, whole bool) (time.Duration, string, int, error) {
	t0 := time.Now()
	resp, err := c.Clone(ctx, api.CloneRequest{GrantUID: uid})
	if err != nil {
		return 0, "", 0, err
	}
	network, addr, err := endpoint.Parse(resp.Endpoint)
	if err != nil {
		return 0, resp.FiberID, 0, err
	}
	conn, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return 0, resp.FiberID, 0, fmt.Errorf("fiber %s: %w", resp.FiberID, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\nHost: fiber\r\n\r\n"); err != nil {
		return 0, resp.FiberID, 0, fmt.Errorf("fiber %s: %w", resp.FiberID, err)
	}
	var one [1]byte
	if _, err := io.ReadFull(conn, one[:]); err != nil {
		return 0, resp.FiberID, 0, fmt.Errorf("fiber %s: first byte: %w", resp.FiberID, err)
	}
	d := time.Since(t0)
	pid := 0
	if whole {
		rest, _ := io.ReadAll(conn)
		m := pidRE.FindSubmatch(append(one[:], rest...))
		if m == nil {
			return d, resp.FiberID, 0, fmt.Errorf("fiber %s: no pid= in %q", resp.FiberID, bytes.TrimSpace(rest))
		}
		pid, _ = strconv.Atoi(string(m[1]))
	}
	return d, resp.FiberID, pid, nil
}

// release ends a fiber; a fiber already gone is fine.
func release(c *client.Client, id string) error {
	if id == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.Release(ctx, id)
	if e, ok := client.AsError(err); ok && e.IsNotFound() {
		return nil
	}
	return err
}

// latency takes n sequential samples of clone to first byte, releasing each
// fiber outside the timer.
func (r *agentRig) latency(ctx context.Context, uid string, n int, tick func()) ([]float64, error) {
	out := make([]float64, 0, n)
	for range n {
		ms, err := r.sample(ctx, uid)
		if err != nil {
			return nil, err
		}
		out = append(out, ms)
		tick()
	}
	return out, nil
}

// sample is one clone of uid to its first byte, in milliseconds; the
// fiber is released after the timer, also when the clone failed.
func (r *agentRig) sample(ctx context.Context, uid string) (float64, error) {
	d, id, _, err := firstByte(ctx, r.client, uid, false)
	if err != nil {
		_ = release(r.client, id)
		return 0, err
	}
	return Ms(d), release(r.client, id)
}

// burst runs rounds bursts of size concurrent clones.
func (r *agentRig) burst(ctx context.Context, uid, mode string, size, rounds int, tick func()) (BurstRow, error) {
	return r.burstAfter(ctx, uid, mode, size, rounds, tick, nil)
}

// burstAfter is burst calling before, when not nil, ahead of each round,
// outside the timer.
func (r *agentRig) burstAfter(ctx context.Context, uid, mode string, size, rounds int, tick func(), before func(context.Context) error) (BurstRow, error) {
	row := BurstRow{Mode: mode, Measured: true, Size: size, Rounds: rounds}
	var all, per []float64
	for range rounds {
		if before != nil {
			if err := before(ctx); err != nil {
				return row, err
			}
		}
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			ids   []string
			start = make(chan struct{})
		)
		for range size {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, id, _, err := firstByte(ctx, r.client, uid, false)
				mu.Lock()
				defer mu.Unlock()
				ids = append(ids, id)
				if err != nil {
					row.Errors++
					return
				}
				per = append(per, Ms(d))
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		all = append(all, Ms(time.Since(t0)))
		for _, id := range ids {
			if err := release(r.client, id); err != nil {
				return row, err
			}
		}
		if ctx.Err() != nil {
			return row, ctx.Err()
		}
		tick()
	}
	row.AllServed, row.PerFiber = Summarize(all), Summarize(per)
	return row, nil
}

// loop runs c callers, each cloning, reading the first byte and releasing
// in a loop, for d.
func (r *agentRig) loop(ctx context.Context, uid, mode string, c int, d time.Duration, tick func()) (LoopRow, error) {
	row := LoopRow{Mode: mode, Measured: true, Concurrency: c}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		cycles []float64
		fatal  error
	)
	t0 := time.Now()
	deadline := t0.Add(d)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				s := time.Now()
				_, id, _, err := firstByte(ctx, r.client, uid, false)
				rerr := release(r.client, id)
				e := time.Since(s)
				mu.Lock()
				switch {
				case rerr != nil:
					fatal = rerr
				case err != nil:
					row.Errors++
				default:
					cycles = append(cycles, Ms(e))
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
				} else {
					tick()
				}
			}
		}()
	}
	wg.Wait()
	row.Seconds = time.Since(t0).Seconds()
	row.Clones = len(cycles)
	row.PerSecond = float64(row.Clones) / row.Seconds
	row.Cycle = Summarize(cycles)
	if fatal == nil {
		fatal = ctx.Err()
	}
	return row, fatal
}

// density holds n fibers of the warm grant, sums their Pss and their
// zygote's, releases them, and does the same with n processes of the cold
// grant.
func (r *agentRig) density(ctx context.Context, name, warmUID, coldUID string, n int, tick func()) (DensityRow, error) {
	row := DensityRow{Template: name, Measured: true, N: n}
	var err error
	if row.WarmMiB, row.WarmProcs, err = r.holdAndMeasure(ctx, warmUID, n, tick); err != nil {
		return row, err
	}
	if row.ColdMiB, row.ColdProcs, err = r.holdAndMeasure(ctx, coldUID, n, tick); err != nil {
		return row, err
	}
	row.Ratio = row.ColdMiB / row.WarmMiB
	return row, nil
}

func (r *agentRig) holdAndMeasure(ctx context.Context, uid string, n int, tick func()) (float64, int, error) {
	var (
		mu   sync.Mutex
		ids  []string
		pids []int
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8)
	)
	defer func() {
		for _, id := range ids {
			_ = release(r.client, id)
		}
	}()
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, id, pid, err := firstByte(ctx, r.client, uid, true)
			mu.Lock()
			defer mu.Unlock()
			ids = append(ids, id)
			if err != nil {
				errs = append(errs, err)
				return
			}
			pids = append(pids, pid)
			tick()
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return 0, 0, errors.Join(errs...)
	}
	// Every fiber answered, so each has done its start-up work; their
	// parents other than this process (the zygote) count too.
	procs := map[int]bool{}
	for _, pid := range pids {
		procs[pid] = true
		if pp, err := PPid(pid); err == nil && pp != os.Getpid() && pp > 1 {
			procs[pp] = true
		}
	}
	var kib int64
	for pid := range procs {
		v, err := PssKiB(pid)
		if err != nil {
			return 0, 0, err
		}
		kib += v
	}
	return float64(kib) / 1024, len(procs), nil
}

func firstLine(cmd *exec.Cmd) string {
	b, err := cmd.CombinedOutput()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// isolationMissing says why the rig's WARM tier does not isolate every
// fiber, "" when it does.
func (r *agentRig) isolationMissing(ctx context.Context) string {
	st, err := r.client.Status(ctx)
	if err != nil {
		return err.Error()
	}
	for _, ti := range st.Isolation {
		if ti.Tier == core.TierWarm {
			if ti.Level == string(backend.IsolationFiber) {
				return ""
			}
			return ti.Missing
		}
	}
	return "the agent reports no WARM tier"
}

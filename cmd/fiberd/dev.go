package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/template"
)

// What -dev mints: grants of devFibersMax fibers for devLease, for templates
// that spend devInitMs initialising (the cost a warm zygote pays once and a
// cold exec pays per fiber); a zygote template's grant also keeps
// devFibersWarm spares forked ahead (fibers.warm), so a Clone is a
// hand-over, as a production grant would ask.
const (
	devFibersMax  = 64
	devFibersWarm = 4
	devLease      = 24 * time.Hour
	devInitMs     = "200"
	// devWarmWait bounds how long -dev waits for its templates to be warm
	// before it prints what to run next anyway.
	devWarmWait = 90 * time.Second
	// devWaitingEvery is how often -dev says which templates it still
	// waits for.
	devWaitingEvery = 10 * time.Second
)

// devSetup is what prepareDev made: the state directory, the issuer's keys,
// the example templates and one grant per template.
type devSetup struct {
	state  string
	temp   bool // state was made by -dev and is removed on exit
	grants []devGrant
}

// devSpec is one template -dev grants: the spec file's bytes, which the
// grant's digest is taken of, and whether it is served from a zygote.
type devSpec struct {
	raw    []byte
	zygote bool
}

// devGrant is one grant -dev minted.
type devGrant struct {
	UID      string
	Template string // the template's name
	Warm     bool   // the spec is a zygote (served WARM), else exec (BASIC)
}

// prepareDev fills o for -dev: the state and run directories, a local
// issuer key and its JWKS (kept in the state directory, so a restart with
// the same -state verifies the same grants), the example templates (built
// and specified under the state directory unless -templates names a
// directory of specs), and a grant per template in the grants directory.
// A -state it is given is judged as the agent judges it
// (fiberd.CheckStateDir) before anything is read or written there, and
// again once made: one another user could write in, or another agent
// runs on, is refused.
func prepareDev(o *options, log logr.Logger) (*devSetup, error) {
	d := &devSetup{}
	if o.stateSet {
		if !filepath.IsAbs(o.state) {
			return nil, bad("state", "%q is not an absolute path: give one", o.state)
		}
		if err := fiberd.CheckStateDir(o.state); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(o.state, 0o700); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		if err := fiberd.CheckStateDir(o.state); err != nil {
			return nil, err
		}
	} else {
		dir, err := os.MkdirTemp("", "fiberd-dev-")
		if err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		o.state, d.temp = dir, true
	}
	d.state = o.state
	fail := func(err error) (*devSetup, error) {
		d.cleanup(log)
		return nil, err
	}
	if !o.runDirSet {
		o.runDir = filepath.Join(o.state, "run")
	}
	devDir := filepath.Join(o.state, "dev")
	o.grantsDir = filepath.Join(o.state, "grants")
	for _, dir := range []string{devDir, o.grantsDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fail(err)
		}
	}

	key, err := devKey(devDir)
	if err != nil {
		return fail(err)
	}
	o.issuerKeys = filepath.Join(devDir, "jwks.json")

	var specs map[string]devSpec // by template name
	if o.templates != "" {
		specs, err = readSpecs(o.templates)
	} else {
		o.templates = filepath.Join(o.state, "templates")
		specs, err = writeExampleSpecs(o.templates, devDir, o.isolation != backend.IsolationNone, log)
	}
	if err != nil {
		return fail(err)
	}
	if len(specs) == 0 {
		return fail(fmt.Errorf("no template to grant in %s", o.templates))
	}

	d.grants, err = mintDevGrants(o.grantsDir, o.nodeID, key, specs, clock.RealClock{})
	if err != nil {
		return fail(err)
	}
	return d, nil
}

// devKey loads the -dev issuer's private key from dir, or makes one, and
// (re)writes its public JWKS beside it.
func devKey(dir string) (jose.JSONWebKey, error) {
	path := filepath.Join(dir, "issuer.jwk")
	key, err := grant.ReadKeyFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if key, err = grant.GenerateKey("EdDSA", ""); err == nil {
			err = grant.WriteKeyFile(path, key)
		}
	}
	if err != nil {
		return key, fmt.Errorf("issuer key %s: %w", path, err)
	}
	jwks, err := grant.PublicJWKS(key)
	if err != nil {
		return key, fmt.Errorf("issuer key %s: %w", path, err)
	}
	if err := core.WriteFileAtomic(filepath.Join(dir, "jwks.json"), jwks, 0o644); err != nil {
		return key, fmt.Errorf("issuer keys: %w", err)
	}
	return key, nil
}

// readSpecs reads and parses every <name>.json of dir.
func readSpecs(dir string) (map[string]devSpec, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("-templates: %w", err)
	}
	specs := map[string]devSpec{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("-templates: %w", err)
		}
		spec, err := template.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("-templates: %s: %w", e.Name(), err)
		}
		specs[name] = devSpec{raw: b, zygote: spec.Zygote}
	}
	return specs, nil
}

// writeExampleSpecs builds the example templates of this checkout and
// writes their specs into dir: counter-c and counter-py served WARM from a
// zygote, and counter-c-cold and counter-py-cold, the same programs served
// BASIC by fork+exec, for comparing the two. A language whose toolchain is
// missing (cc, python3) is skipped with a log line. The C counter is built
// under devDir (fiberd opens it itself, so an isolated grant runs it from
// there); the Python counter and its SDK are copied where an isolated
// grant can read them (pythonExample).
func writeExampleSpecs(dir, devDir string, isolated bool, log logr.Logger) (map[string]devSpec, error) {
	root, err := devkit.FindCheckout()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	specs := map[string]devSpec{}
	add := func(name string, s template.Spec) error {
		b, err := devkit.WriteSpec(dir, name, s)
		if err != nil {
			return err
		}
		specs[name] = devSpec{raw: b, zygote: s.Zygote}
		return nil
	}

	if bin, err := devkit.BuildCounterC(root, filepath.Join(devDir, "bin")); err != nil {
		log.Info("Skipping the C example templates", "reason", err.Error())
	} else {
		for _, zy := range []bool{true, false} {
			if err := add(devkit.ColdName("counter-c", zy), devkit.CounterCSpec(bin, zy, "--init-ms", devInitMs)); err != nil {
				return nil, err
			}
		}
	}

	if py, err := devkit.PythonInterpreter(); err != nil {
		log.Info("Skipping the Python example templates", "reason", err.Error())
	} else {
		src := pythonExample(root, devDir, isolated, log)
		for _, zy := range []bool{true, false} {
			if err := add(devkit.ColdName("counter-py", zy), devkit.CounterPySpec(src, py, zy, "--init-ms", devInitMs)); err != nil {
				return nil, err
			}
		}
	}
	return specs, nil
}

// pythonExample copies the Python counter and its SDK where an isolated
// grant can read them (devkit.SharePythonExample: not the state directory,
// which may lie under /tmp, nor the checkout, which may lie under /root)
// and returns the copy's root for devkit.CounterPySpec. Where that cannot
// be made (fiberd is not root, and cannot isolate grants anyway) the copy
// is kept under devDir, or, failing that, the checkout's own files are
// used; it logs which when grants are to be isolated.
func pythonExample(root, devDir string, isolated bool, log logr.Logger) string {
	src, err := devkit.SharePythonExample(root)
	if err == nil {
		return src
	}
	if isolated {
		log.Info("The Python example is kept where an isolated grant may not read it", "reason", err.Error())
	}
	src, err = devkit.CopyPythonExample(root, filepath.Join(devDir, "examples"))
	if err != nil {
		log.Info("Running the Python example from the checkout", "reason", err.Error())
		return root
	}
	return src
}

// mintDevGrants signs one grant per spec for audience nodeID, writes each as
// grantsDir/<name>.jwt, and removes the other grant files there. A grant's
// UID is "dev-<name>-<8 hex of the key id>": stable for a state directory,
// distinct between state directories, so two -dev instances on one host
// never share a grant's cgroup.
func mintDevGrants(grantsDir, nodeID string, key jose.JSONWebKey, specs map[string]devSpec, clk clock.PassiveClock) ([]devGrant, error) {
	signer, err := grant.NewSigner(key)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(key.KeyID))
	suffix := hex.EncodeToString(sum[:4])
	now := clk.Now().Truncate(time.Second)
	var out []devGrant
	keep := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(specs)) {
		prefix := "dev-" + name
		if max := 63 - len(suffix) - 1; len(prefix) > max {
			prefix = strings.TrimRight(prefix[:max], "-")
		}
		warm := 0
		if specs[name].zygote {
			warm = devFibersWarm
		}
		g := core.Grant{
			UID:      prefix + "-" + suffix,
			Issuer:   devIssuer,
			Audience: nodeID,
			Template: name + "@sha256:" + template.Digest(specs[name].raw),
			Fibers:   core.Fibers{Max: devFibersMax, Warm: warm},
			IssuedAt: now,
			Expiry:   now.Add(devLease),
		}
		tok, err := signer.Mint(g)
		if err != nil {
			return nil, fmt.Errorf("grant for template %q: %w", name, err)
		}
		file := name + ".jwt"
		if err := core.WriteFileAtomic(filepath.Join(grantsDir, file), tok, 0o600); err != nil {
			return nil, err
		}
		keep[file] = true
		out = append(out, devGrant{UID: g.UID, Template: name, Warm: specs[name].zygote})
	}
	entries, _ := os.ReadDir(grantsDir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".jwt") && !keep[e.Name()] {
			os.Remove(filepath.Join(grantsDir, e.Name()))
		}
	}
	return out, nil
}

// cleanup removes a temporary state directory once fiberd has stopped.
func (d *devSetup) cleanup(log logr.Logger) {
	if d.temp {
		if err := os.RemoveAll(d.state); err != nil {
			log.Error(err, "Cannot remove the -dev state directory", "dir", d.state)
		}
	}
}

// waitingLine names the -dev templates with a zygote not warm yet, after
// waited.
func (d *devSetup) waitingLine(warm map[string]bool, waited time.Duration) string {
	var names []string
	for _, g := range d.grants {
		if g.Warm && !warm[g.UID] {
			names = append(names, g.Template)
		}
	}
	return fmt.Sprintf("fiberd -dev: still waiting for %s to warm (%s so far)", strings.Join(names, ", "), waited.Round(time.Second))
}

// failures are the lines saying why a -dev template is not warm, for each
// grant whose status carries an error not yet told (told records them).
func (d *devSetup) failures(st api.Status, told map[string]string) []string {
	names := map[string]string{}
	for _, g := range d.grants {
		names[g.UID] = g.Template
	}
	var out []string
	for _, g := range st.Grants {
		name, ours := names[g.UID]
		if !ours || g.Warm || g.Error == "" || told[g.UID] == g.Error {
			continue
		}
		told[g.UID] = g.Error
		out = append(out, fmt.Sprintf("fiberd -dev: template %s is not warm: %s", name, g.Error))
	}
	return out
}

// isolationLine says in a few words what the agent of st isolates: the
// level (per tier when they differ) and, when less than asked, what is
// missing.
func isolationLine(st api.Status) string {
	var levels, missing []string
	for _, ti := range st.Isolation {
		levels = append(levels, string(ti.Tier)+" "+ti.Level)
		if ti.Missing != "" && !slices.Contains(missing, ti.Missing) {
			missing = append(missing, ti.Missing)
		}
	}
	line := strings.Join(levels, ", ")
	if len(st.Isolation) > 0 && slices.IndexFunc(st.Isolation, func(ti api.TierIsolation) bool { return ti.Level != st.Isolation[0].Level }) < 0 {
		line = st.Isolation[0].Level
	}
	switch line {
	case "fiber":
		line += " (each grant a user and namespaces of its own, each fiber its own PID namespace and /tmp)"
	case "grant":
		line += " (each grant a user and namespaces of its own)"
	case "none":
		line += " (fibers run as fiberd's user, in its namespaces)"
	}
	if len(missing) > 0 {
		line += "; less than asked: " + strings.Join(missing, "; ")
	}
	return line
}

// warmCount is how many -dev grants have a zygote to warm.
func (d *devSetup) warmCount() int {
	n := 0
	for _, g := range d.grants {
		if g.Warm {
			n++
		}
	}
	return n
}

// announce waits until every -dev grant with a zygote is warm (or
// devWarmWait passed, or the agent stopped) and prints what to run next.
func (d *devSetup) announce(ctx context.Context, agent *fiberd.Agent, stopped <-chan struct{}, stdout io.Writer, log logr.Logger) {
	addr := addrString(agent)
	if addr == "" && agent.SocketPath() != "" {
		addr = "unix://" + agent.SocketPath()
	}
	if addr == "" {
		return
	}
	c, err := client.New(client.Config{Addr: addr})
	if err != nil {
		log.Error(err, "Cannot watch the -dev grants warm up")
		return
	}
	zygotes := map[string]bool{} // by grant UID: served from a zygote
	for _, g := range d.grants {
		zygotes[g.UID] = g.Warm
	}
	warm := map[string]bool{}
	told := map[string]string{} // by grant UID: the failure last printed
	started := time.Now()
	wait := time.NewTimer(devWarmWait)
	defer wait.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	waiting := time.NewTicker(devWaitingEvery)
	defer waiting.Stop()
poll:
	for len(warm) < d.warmCount() {
		select {
		case <-ctx.Done():
			return
		case <-stopped:
			return
		case <-wait.C:
			log.Info("Not every -dev template is warm yet; printing the commands anyway", "warm", len(warm), "grants", len(d.grants))
			break poll
		case <-waiting.C:
			fmt.Fprintln(stdout, d.waitingLine(warm, time.Since(started)))
		case <-tick.C:
			st, err := c.Status(ctx)
			if err != nil {
				continue
			}
			for _, g := range st.Grants {
				if g.Warm && zygotes[g.UID] {
					warm[g.UID] = true
				}
			}
			for _, line := range d.failures(st, told) {
				fmt.Fprintln(stdout, line)
			}
		}
	}

	fmt.Fprintf(stdout, "\nfiberd -dev is serving (epoch %d).\n", agent.Epoch())
	fmt.Fprintf(stdout, "  state dir  %s", d.state)
	if d.temp {
		fmt.Fprint(stdout, " (removed on exit; pass -state DIR to keep it)")
	}
	fmt.Fprintln(stdout)
	if s := agent.SocketPath(); s != "" {
		fmt.Fprintf(stdout, "  socket     unix://%s\n", s)
	}
	if tcp := addrString(agent); tcp != "" {
		fmt.Fprintf(stdout, "  API        http://%s (plaintext, loopback only)\n", tcp)
	}
	warmLevel := ""
	if st, err := c.Status(ctx); err == nil {
		fmt.Fprintf(stdout, "  isolation  %s\n", isolationLine(st))
		for _, ti := range st.Isolation {
			if ti.Tier == core.TierWarm {
				warmLevel = ti.Level
			}
		}
	}
	fmt.Fprintln(stdout, "  grants:")
	ck := agent.Checkpoint()
	// A grant at "grant" is never parkable, one at "fiber" where CRIU has
	// fiberd's patches (ck.Isolated says why not).
	parkable := ck.Available && ck.Isolated == "" && warmLevel != string(backend.IsolationGrant)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	for _, g := range d.grants {
		tier, state := "BASIC (fork+exec per clone)", "ready"
		if g.Warm {
			tier = "WARM (forked from a zygote)"
			if parkable {
				tier = "CHECKPOINT (forked from a zygote, parkable)"
			}
			state = "warming"
			if warm[g.UID] {
				state = "warm"
			}
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\n", g.UID, g.Template, tier, state)
	}
	tw.Flush()
	switch {
	case parkable:
		fmt.Fprintln(stdout, "  parking    on: a fiber cloned with -session can be parked to disk (fiberctl park); a clone of its session resumes it")
	case ck.Available:
		why := ck.Isolated
		if why == "" {
			why = fmt.Sprintf("the grants run isolated (%s), where fibers share their zygote's PID namespace; fiberd -dev -isolation fiber or none parks", warmLevel)
		}
		fmt.Fprintf(stdout, "  parking    off: %s\n", why)
	default:
		fmt.Fprintf(stdout, "  parking    off: %s\n", ck.Reason)
	}
	fmt.Fprintln(stdout, "\nNext, from the checkout in another terminal:")
	first := d.grants[0]
	for _, g := range d.grants {
		if g.Warm {
			first = g
			break
		}
	}
	// The socket authenticates its callers: status shows every fiber and a
	// fiber id is enough to release. Plaintext TCP does not (docs/api.md).
	ctl := addr
	if s := agent.SocketPath(); s != "" {
		ctl = "unix://" + s
	}
	fmt.Fprintf(stdout, "  go run ./cmd/fiberctl -addr %s clone -grant-uid %s\n", ctl, first.UID)
	fmt.Fprintf(stdout, "  go run ./cmd/fiberctl -addr %s status\n", ctl)
	fmt.Fprintln(stdout, "  curl <the endpoint clone printed>")
	fmt.Fprintf(stdout, "  go run ./cmd/fiberctl -addr %s release <the fiber clone printed>\n", ctl)
	if ck.Available && first.Warm {
		fmt.Fprintf(stdout, "  go run ./cmd/fiberctl -addr %s clone -grant-uid %s -session demo   # then park <its fiber>, and clone -session demo again\n", ctl, first.UID)
	}
	if tcp := addrString(agent); tcp != "" && ctl != tcp {
		fmt.Fprintf(stdout, "Over %s (plaintext) status shows counts only, and release needs -key <the key clone printed>.\n", tcp)
	}
	fmt.Fprintln(stdout, "Stop with Ctrl-C: every fiber is released and every zygote stopped.")
}

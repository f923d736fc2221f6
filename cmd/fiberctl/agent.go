package main

// The agent commands: fiberctl [global flags] clone|release|park|status|watch.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
)

// defaultSocket is fiberd's unix socket under its default -state.
const defaultSocket = "/var/lib/fiberd/fiberd.sock"

// defaultTCP is fiberd's default -listen, plaintext on loopback under -dev.
const defaultTCP = "127.0.0.1:8484"

// global is the flags before the command.
type global struct {
	addr    string
	addrSet bool // -addr was given
	json    bool
	tlsCert string
	tlsKey  string
	ca      string
}

// isAgentCommand reports whether name is one of the agent commands.
func isAgentCommand(name string) bool {
	switch name {
	case "clone", "release", "park", "status", "watch":
		return true
	}
	return false
}

// parseGlobal reads the global flags before the command and returns them
// with the remaining arguments (the command first). ok is false when the
// caller must exit with status.
func parseGlobal(args []string, e env) (g global, rest []string, status int, ok bool) {
	fs := grantcli.NewFlags("fiberctl", e.stderr)
	fs.Usage = func() { usage(e.stderr) }
	fs.StringVar(&g.addr, "addr", "", "fiberd's address: unix:///path/fiberd.sock or host:port (default $FIBERD_ADDR, else "+defaultSocket+" when it exists, else "+defaultTCP+")")
	out := fs.String("o", "text", "output: text or json")
	fs.StringVar(&g.tlsCert, "tls-cert", "", "PEM client certificate for a TLS listener (with -tls-key)")
	fs.StringVar(&g.tlsKey, "tls-key", "", "PEM key of -tls-cert")
	fs.StringVar(&g.ca, "ca", "", "PEM CA bundle fiberd's server certificate chains to; any of -tls-cert or -ca turns TLS on")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return g, nil, grantcli.ExitOK, false
		}
		return g, nil, grantcli.ExitUsage, false
	}
	switch *out {
	case "text":
	case "json":
		g.json = true
	default:
		fmt.Fprintf(e.stderr, "fiberctl: -o %q: want text or json\n", *out)
		return g, nil, grantcli.ExitUsage, false
	}
	if (g.tlsCert == "") != (g.tlsKey == "") {
		fmt.Fprintln(e.stderr, "fiberctl: -tls-cert and -tls-key go together")
		return g, nil, grantcli.ExitUsage, false
	}
	g.addrSet = g.addr != ""
	if g.addr == "" {
		g.addr = defaultAddr()
	}
	return g, fs.Args(), grantcli.ExitOK, true
}

// defaultAddr is $FIBERD_ADDR, else fiberd's default socket when it
// exists, else its default TCP address.
func defaultAddr() string {
	if a := os.Getenv("FIBERD_ADDR"); a != "" {
		return a
	}
	if fi, err := os.Stat(defaultSocket); err == nil && fi.Mode()&os.ModeSocket != 0 {
		return "unix://" + defaultSocket
	}
	return defaultTCP
}

// newClient builds the client the global flags describe.
func (g global) newClient() (*client.Client, error) {
	cfg := client.Config{Addr: g.addr}
	if g.tlsCert != "" || g.ca != "" {
		tc, err := client.TLSConfig(g.tlsCert, g.tlsKey, g.ca)
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	return client.New(cfg)
}

// runAgent runs one agent command.
func runAgent(cmd string, args []string, g global, e env) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch cmd {
	case "clone":
		return cmdClone(ctx, args, g, e)
	case "release", "park":
		return cmdFiber(ctx, cmd, args, g, e)
	case "status":
		return cmdStatus(ctx, args, g, e)
	case "watch":
		return cmdWatch(ctx, args, g, e)
	}
	return grantcli.ExitUsage
}

// cmdClone: fiberctl clone [-grant-uid UID | -grant FILE] [-session S
// [-key KEY]] [-deadline D] [-payload S | -payload-file F] [UID], or
// fiberctl clone -pool NAME [-namespace NS] [-kubeconfig F] [-server-name
// N] with the same session, deadline and payload flags (clonePool).
func cmdClone(ctx context.Context, args []string, g global, e env) int {
	fs := newFlags("clone", e)
	uid := fs.String("grant-uid", "", "UID of an admitted grant")
	tokenFile := fs.String("grant", "", "grant token `FILE` to present (\"-\" for stdin)")
	session := fs.String("session", "", "session name: a running session is attached, not cloned twice, and a parked one resumed")
	key := fs.String("key", "", "the session's release key, printed by the clone that created it: needed on a plaintext TCP address to attach to or resume a session (with -session)")
	deadline := fs.Duration("deadline", 0, "bound of the clone (0: fiberd's default); with -pool, of the whole call, every Pod asked included")
	payload := fs.String("payload", "", "payload handed to the fiber (FIBERD_PAYLOAD)")
	payloadFile := fs.String("payload-file", "", "read the payload from `FILE`")
	var po poolOptions
	po.register(fs, "clone from a ready grant Pod of")
	// A bare UID after the flags is accepted as -grant-uid.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return grantcli.ExitOK
		}
		return grantcli.ExitUsage
	}
	switch {
	case fs.NArg() == 1 && *uid == "":
		*uid = fs.Arg(0)
	case fs.NArg() > 0:
		return grantcli.UsageError(fs, "unexpected argument %q", fs.Arg(0))
	}
	req := api.CloneRequest{GrantUID: *uid, Session: *session, ReleaseKey: *key}
	if *tokenFile != "" {
		tok, err := readInput(*tokenFile, e.stdin, api.MaxRequestBody)
		if err != nil {
			return grantcli.UsageError(fs, "-grant: %v", err)
		}
		req.Grant = strings.TrimSpace(string(tok))
	}
	switch {
	case po.check(g) != "":
		return grantcli.UsageError(fs, "%s", po.check(g))
	case po.name != "" && (req.Grant != "" || req.GrantUID != ""):
		return grantcli.UsageError(fs, "-pool picks a grant Pod and clones its grant: leave out -grant-uid and -grant")
	case po.name == "" && req.Grant == "" && req.GrantUID == "":
		return grantcli.UsageError(fs, "name the grant: -grant-uid UID or -grant FILE, or the pool: -pool NAME")
	}
	if err := api.ValidSession(*session); err != nil {
		return grantcli.UsageError(fs, "-session: %v", err)
	}
	if *key != "" && *session == "" {
		return grantcli.UsageError(fs, "-key is a session's release key: name the session with -session")
	}
	if *deadline < 0 {
		return grantcli.UsageError(fs, "-deadline %v is negative", *deadline)
	}
	req.DeadlineMs = deadline.Milliseconds()
	switch {
	case *payload != "" && *payloadFile != "":
		return grantcli.UsageError(fs, "-payload and -payload-file exclude each other")
	case *payload != "":
		req.Payload = []byte(*payload)
	case *payloadFile != "":
		b, err := readInput(*payloadFile, e.stdin, api.MaxPayload)
		if err != nil {
			return grantcli.UsageError(fs, "-payload-file: %v", err)
		}
		req.Payload = b
	}
	if len(req.Payload) > api.MaxPayload {
		return grantcli.UsageError(fs, "-payload is %d bytes, over the %d-byte limit", len(req.Payload), api.MaxPayload)
	}
	if po.name != "" {
		return clonePool(ctx, fs, req, *deadline, po, g, e)
	}

	c, err := g.newClient()
	if err != nil {
		return grantcli.UsageError(fs, "%v", err)
	}
	start := e.clock.Now()
	resp, err := c.Clone(ctx, req)
	took := e.clock.Since(start)
	if err != nil {
		code := callFailed(fs, g, e, err)
		if errors.Is(err, core.ErrUnauthenticated) && req.Session != "" && req.ReleaseKey == "" && req.Grant == "" {
			fmt.Fprintln(e.stderr, "fiberctl clone: this address does not authenticate callers, and the session is taken: pass -key KEY (the key the clone that created it printed) or -grant FILE, call fiberd on its unix socket, or use another -session")
		}
		return code
	}
	if g.json {
		return printJSON(e, resp)
	}
	printClone(e, resp, took, "")
	return grantcli.ExitOK
}

// printClone writes a served Clone for people; pod, when set, is the grant
// Pod that served it, already escaped.
func printClone(e env, resp api.CloneResponse, took time.Duration, pod string) {
	fmt.Fprintf(e.stdout, "fiber     %s\nendpoint  %s\nkind      %s\n", field(resp.FiberID), field(resp.Endpoint), field(resp.Kind))
	if resp.ReleaseKey != "" {
		fmt.Fprintf(e.stdout, "key       %s\n", field(resp.ReleaseKey))
	}
	if pod != "" {
		fmt.Fprintf(e.stdout, "pod       %s\n", pod)
	}
	fmt.Fprintf(e.stdout, "took      %s\n", took.Round(10*time.Microsecond))
}

// cmdFiber: fiberctl release|park [-key KEY | -grant FILE] [-pool NAME
// [-namespace NS] [-kubeconfig F] [-server-name N]] FIBER_ID
func cmdFiber(ctx context.Context, cmd string, args []string, g global, e env) int {
	fs := newFlags(cmd, e)
	key := fs.String("key", "", "the fiber's release key, printed by clone: needed on a plaintext TCP address")
	tokenFile := fs.String("grant", "", "grant token `FILE` of the fiber's grant (\"-\" for stdin), instead of -key")
	var po poolOptions
	po.register(fs, cmd+" the fiber on the grant Pod that served it, a Pod of")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return grantcli.ExitOK
		}
		return grantcli.ExitUsage
	}
	if msg := po.check(g); msg != "" {
		return grantcli.UsageError(fs, "%s", msg)
	}
	if fs.NArg() != 1 {
		return grantcli.UsageError(fs, "want exactly one fiber id (uid/epoch/seq), got %d arguments", fs.NArg())
	}
	id := fs.Arg(0)
	req := api.FiberRequest{FiberID: id, ReleaseKey: *key}
	if *tokenFile != "" {
		if *key != "" {
			return grantcli.UsageError(fs, "-key and -grant exclude each other")
		}
		tok, err := readInput(*tokenFile, e.stdin, api.MaxRequestBody)
		if err != nil {
			return grantcli.UsageError(fs, "-grant: %v", err)
		}
		req.Grant = strings.TrimSpace(string(tok))
	}
	var f fiberCaller
	if po.name != "" {
		p, _, code := po.open(ctx, fs, g, e)
		if p == nil {
			return code
		}
		defer p.Close()
		f = p
	} else {
		c, err := g.newClient()
		if err != nil {
			return grantcli.UsageError(fs, "%v", err)
		}
		f = c
	}
	var (
		parked api.ParkResponse
		err    error
	)
	if cmd == "park" {
		parked, err = f.ParkFiber(ctx, req)
	} else {
		err = f.ReleaseFiber(ctx, req)
	}
	if err != nil {
		code := callFailed(fs, g, e, err)
		if errors.Is(err, core.ErrUnauthenticated) && req.ReleaseKey == "" && req.Grant == "" {
			fmt.Fprintf(e.stderr, "fiberctl %s: this address does not authenticate callers: pass -key KEY (the key clone printed) or -grant FILE, or call fiberd on its unix socket\n", cmd)
		}
		return code
	}
	if cmd == "park" {
		if g.json {
			return printJSON(e, parked)
		}
		fmt.Fprintf(e.stdout, "parked %s: session %s, image %s (its own memory %s); clone the session to resume it, release %s to delete it\n",
			field(id), field(parked.Session), mibString(parked.ImageBytes), mibString(parked.OwnBytes), field(id))
		return grantcli.ExitOK
	}
	if g.json {
		return printJSON(e, api.FiberRequest{FiberID: id})
	}
	fmt.Fprintf(e.stdout, "released %s\n", id)
	return grantcli.ExitOK
}

// cmdStatus: fiberctl status [-ready]. With -ready it prints nothing on
// success and exits 1 while no grant's template is warm: the exec
// readiness probe of a grant Pod, so a restarted fiberd's Pod is not Ready
// on the readiness gate its previous run set.
func cmdStatus(ctx context.Context, args []string, g global, e env) int {
	fs := newFlags("status", e)
	ready := fs.Bool("ready", false, "print nothing; exit 1 unless a grant's template is warm (a grant Pod's readiness probe)")
	if st, ok := grantcli.ParseFlags(fs, args); !ok {
		return st
	}
	c, err := g.newClient()
	if err != nil {
		return grantcli.UsageError(fs, "%v", err)
	}
	s, err := c.Status(ctx)
	if err != nil {
		return callFailed(fs, g, e, err)
	}
	if *ready {
		if !s.Ready {
			fmt.Fprintf(e.stderr, "fiberctl status: not ready: no grant's template is warm yet (epoch %d)\n", s.Epoch)
			return grantcli.ExitFailure
		}
		return grantcli.ExitOK
	}
	if g.json {
		return printJSON(e, s)
	}
	printStatus(e.stdout, s, e)
	return grantcli.ExitOK
}

// cmdWatch: fiberctl watch — one status per change until interrupted.
func cmdWatch(ctx context.Context, args []string, g global, e env) int {
	fs := newFlags("watch", e)
	if st, ok := grantcli.ParseFlags(fs, args); !ok {
		return st
	}
	c, err := g.newClient()
	if err != nil {
		return grantcli.UsageError(fs, "%v", err)
	}
	w, err := c.Watch(ctx)
	if err != nil {
		return callFailed(fs, g, e, err)
	}
	defer w.Close()
	for {
		s, err := w.Next()
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return grantcli.ExitOK
			}
			return grantcli.Failure(fs, escapedError{err})
		}
		if g.json {
			if code := printJSON(e, s); code != grantcli.ExitOK {
				return code
			}
			continue
		}
		fmt.Fprintln(e.stdout, statusLine(s))
	}
}

// callFailed reports a failed call: the refusal body as JSON on stdout
// under -o json, and the error, escaped, on stderr. The status is
// grantcli.ExitFailure.
func callFailed(fs *flag.FlagSet, g global, e env, err error) int {
	if ce, ok := client.AsError(err); ok && g.json {
		printJSON(e, ce.Body)
	}
	return grantcli.Failure(fs, escapedError{err})
}

// printJSON writes v as one JSON line to e.stdout, every character that
// is not printable escaped (jsonSafe); a failure is reported on e.stderr.
func printJSON(e env, v any) int {
	b, err := json.Marshal(v)
	if err == nil {
		_, err = e.stdout.Write(append(jsonSafe(b), '\n'))
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "fiberctl: %v\n", err)
		return grantcli.ExitFailure
	}
	return grantcli.ExitOK
}

// printStatus writes the status for people: the agent's line, then one row
// per grant and one per running fiber. Every string the agent sent is
// printed through field.
func printStatus(w io.Writer, s api.Status, e env) {
	lane := "healthy"
	if !s.Lane.Healthy {
		lane = "STALE"
	}
	fmt.Fprintf(w, "home %s  epoch %d  lane %s (last sync %s ago)  ready %v\n",
		field(s.Home), s.Epoch, lane, e.clock.Since(s.Lane.LastSync).Round(time.Second), s.Ready)
	if s.Checkpoint.Available {
		fmt.Fprintln(w, "  checkpoint: available (fibers with a session can be parked)")
	} else if s.Checkpoint.Reason != "" {
		fmt.Fprintf(w, "  checkpoint: absent (%s)\n", field(s.Checkpoint.Reason))
	}
	for _, c := range s.Scope {
		fmt.Fprintf(w, "  scope %s=%s\n", field(c.Name), field(c.Value))
	}
	printIsolation(w, s)
	printLimits(w, s.Limits)
	if len(s.Grants) == 0 {
		fmt.Fprintln(w, "no grants admitted")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GRANT\tTEMPLATE\tTIER\tISOLATION\tWARM\tRUNNING\tSPARES\tLEASE LEFT\tLATEST FENCE")
	for _, gs := range s.Grants {
		latest := "-"
		if gs.LatestFence != nil {
			latest = field(gs.LatestFence.String())
		}
		name, _, _ := strings.Cut(gs.Template, "@")
		iso := "-"
		if gs.Isolation != "" {
			iso = field(gs.Isolation)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%d/%d\t%s\t%s\t%s\n", field(gs.UID), field(name), field(string(gs.Tier)), iso, gs.Warm, gs.Running, gs.Max,
			sparesColumn(gs.Spares), gs.LeaseExpiry.Sub(e.clock.Now()).Round(time.Second), latest)
	}
	tw.Flush()
	for _, gs := range s.Grants {
		if sp := gs.Spares; sp != nil && sp.HandOver {
			fmt.Fprintf(w, "spares of %s: %d ready of %d wanted (fibers.warm %d), %d Clones handed over, holding %s\n",
				field(gs.UID), sp.Ready, sp.Wanted, sp.Warm, sp.Taken, mibString(sp.Bytes))
		}
	}
	if s.Redacted {
		fmt.Fprintln(w, "fibers: not shown (this address does not authenticate callers; use the unix socket or TLS)")
		parked := 0
		for _, gs := range s.Grants {
			parked += gs.Parked
		}
		if parked > 0 {
			fmt.Fprintf(w, "parked sessions: %d, not shown\n", parked)
		}
		return
	}
	var fibers []string
	for _, gs := range s.Grants {
		for _, f := range gs.Fibers {
			line := "  " + field(f.FiberID) + "  " + field(f.Endpoint)
			if f.Session != "" {
				line += "  session " + field(f.Session)
			}
			if f.Isolation != "" && f.Isolation != gs.Isolation {
				line += "  isolation " + field(f.Isolation)
			}
			fibers = append(fibers, line)
		}
	}
	if len(fibers) > 0 {
		fmt.Fprintln(w, "fibers:")
		fmt.Fprintln(w, strings.Join(fibers, "\n"))
	}
	var parked []string
	for _, gs := range s.Grants {
		for _, p := range gs.ParkedSessions {
			parked = append(parked, fmt.Sprintf("  %s  session %s  image %s  by %s  %s ago",
				field(p.FiberID), field(p.Session), mibString(p.ImageBytes), field(p.By), e.clock.Since(p.ParkedAt).Round(time.Second)))
		}
	}
	if len(parked) > 0 {
		fmt.Fprintln(w, "parked:")
		fmt.Fprintln(w, strings.Join(parked, "\n"))
	}
}

// mibString formats bytes as MiB with one decimal.
func mibString(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB" }

// printIsolation writes the agent's isolation: one line with each tier's
// level and the least a grant must get, and one line per thing missing.
func printIsolation(w io.Writer, s api.Status) {
	if len(s.Isolation) == 0 {
		return
	}
	var levels, missing []string
	for _, ti := range s.Isolation {
		l := field(string(ti.Tier)) + " " + field(ti.Level)
		if ti.NetworkNone {
			l += " (network none)"
		}
		if ti.EndpointsApart {
			l += " (endpoints apart)"
		}
		levels = append(levels, l)
		if ti.Missing != "" && !slices.Contains(missing, ti.Missing) {
			missing = append(missing, ti.Missing)
		}
	}
	line := "isolation " + strings.Join(levels, ", ")
	if s.MinIsolation != "" {
		line += "  at least " + field(s.MinIsolation) + " (less is TIER_GAP)"
	}
	fmt.Fprintln(w, line)
	for _, m := range missing {
		fmt.Fprintln(w, "  less than asked: "+field(m))
	}
}

// printLimits writes the kernel limits the agent sets: a line of what it
// sets, and one of what it cannot for want of a controller.
func printLimits(w io.Writer, l *api.Limits) {
	if l == nil {
		return
	}
	if !l.Cgroups {
		fmt.Fprintln(w, "limits: none (no cgroups: W budgets measured)")
		return
	}
	var set []string
	if l.FiberPidsMax > 0 {
		set = append(set, "pids.max "+strconv.FormatInt(l.FiberPidsMax, 10)+" a fiber")
	}
	if l.GrantCPUWeight > 0 {
		set = append(set, "cpu.weight "+strconv.Itoa(l.GrantCPUWeight)+" a grant")
	}
	if l.WBudgetByCgroup {
		set = append(set, "W budgets by memory.max")
	} else {
		set = append(set, "W budgets measured")
	}
	fmt.Fprintln(w, "limits: "+strings.Join(set, ", "))
	if len(l.Missing) > 0 {
		fmt.Fprintln(w, "  missing cgroup controllers: "+field(strings.Join(l.Missing, ", ")))
	}
}

// statusLine is one status on one line, for watch.
func statusLine(s api.Status) string {
	lane := "healthy"
	if !s.Lane.Healthy {
		lane = "stale"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "epoch=%d lane=%s ready=%v", s.Epoch, lane, s.Ready)
	for _, gs := range s.Grants {
		fmt.Fprintf(&b, " %s:%d/%d", field(gs.UID), gs.Running, gs.Max)
		if !gs.Warm {
			b.WriteString("(cold)")
		}
		if gs.Parked > 0 {
			fmt.Fprintf(&b, "+%dparked", gs.Parked)
		}
	}
	return b.String()
}

// readInput reads at most limit bytes of path, or of stdin for "-".
func readInput(path string, stdin io.Reader, limit int64) ([]byte, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("over %d bytes", limit)
	}
	return b, nil
}

// sparesColumn is a grant's SPARES column: "-" when it asks for none,
// "ready/wanted", "fork" when its template does not hand spares over, and
// "failed" when they kept failing.
func sparesColumn(sp *api.SpareStatus) string {
	switch {
	case sp == nil:
		return "-"
	case !sp.HandOver:
		return "fork"
	case sp.Failed:
		return "failed"
	}
	return strconv.Itoa(sp.Ready) + "/" + strconv.Itoa(sp.Wanted)
}

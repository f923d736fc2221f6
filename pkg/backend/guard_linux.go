package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
)

// The endpoint guard keeps the TCP endpoints of different isolated grants
// apart on a host whose network they share (design decision 102).
//
// Receiver side: the backend marks each isolated fiber's listener with
// SO_MARK = GuardMark(the grant's id) at Clone and Resume. A connection a
// listener accepts inherits the mark, so the fiber's answers carry it too.
//
// Sender side: an nftables table of the backend's own (inet
// fiberd_<pidns>_<pid>_<n>) sets the conntrack mark of every new connection a
// grant's user opens (map uids: uid -> mark), and, in its input chain,
// refuses with a TCP reset a new connection whose conntrack mark is a grant
// mark and whose destination socket's mark is a mark of one of this
// table's grants (set own) but not the same one (set same holds m . m for
// each of them: nft compares no two values it reads, so equality is a
// lookup). Everything else passes: host processes and non-isolated grants
// (no conntrack mark) reach every fiber, a grant's fibers reach each
// other, and a fiber reaches the host's services and sockets of its own.
//
// A table per backend: each backend adds and deletes only its own
// elements, so two backends (fiberd's two, or several test binaries) never
// remove each other's. A connection is judged by the table of the backend
// whose grant listens; the conntrack mark may be set by any table that
// knows the sender's uid, and marks are a function of the uid alone, so
// all tables agree. Leftovers of a crashed process (tables named by a dead
// pid of this PID namespace) are deleted when the next backend starts; one kept by a reused pid
// is harmless for the same reason (it can only refuse what the live tables
// refuse, or mark what they mark alike).

// GuardMarkBase is the first of the socket and conntrack marks fiberd
// gives isolated grants: GuardMark(id) is GuardMarkBase plus 15 bits of
// the grant's id. The range never sets kube-proxy's drop bit 0x8000; it
// sets its masquerade bit 0x4000 for half the ids, which kube-proxy reads
// only on a connection's first packet (a fiber's server sends none: its
// connections are its peers'). The high half, 0x0fd1, is no value
// Tailscale (0x80000/0xff0000) or wg-quick (51820) route by. A host whose
// own firewall or routing reads these bits of a socket's mark should run
// fiberd with -isolation none, or give fibers a network of their own (see
// docs/operations.md).
const (
	GuardMarkBase uint32 = 0x0fd10000
	// GuardMarkMask selects the bits that say a mark is a grant's.
	GuardMarkMask uint32 = 0xffff8000
)

// GuardMark is the mark of the grant running as id: GuardMarkBase and the
// id's pair number (ids come in pairs, IDPool) modulo 2^15, so the 32768
// pairs of the default id range have a mark each; a larger range gives
// grants 32768 pairs apart the same mark, which lets their fibers reach
// each other's endpoints.
func GuardMark(id uint32) uint32 { return GuardMarkBase | (id>>1)&^GuardMarkMask }

// nftTimeout bounds one run of nft.
const nftTimeout = 10 * time.Second

// guardSeq numbers the guards of this process, for their table names.
var guardSeq atomic.Uint32

// guardTablePrefix starts the name of every table a guard makes:
// fiberd_<pid namespace inode>_<pid>_<n>.
const guardTablePrefix = "fiberd_"

// guard is one backend's endpoint guard: its nftables table and which
// grants' elements it holds.
type guard struct {
	log   logr.Logger
	clk   clock.WithDelayedExecution
	nft   string
	table string
	pidNS uint64 // the inode of this process's PID namespace

	// sem lets one nft run at a time change elements, so that the last
	// to run sets what holds says; no mutex is held while nft runs.
	sem chan struct{}

	mu    sync.Mutex
	holds map[uint32]int  // id -> Warms holding its elements
	have  map[uint32]bool // ids whose elements are in the table
}

// nftPath finds the nft command: on PATH, else where Debian puts it. A
// variable for the tests of a host without it.
var nftPath = func() (string, error) {
	if p, err := exec.LookPath("nft"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/nft", "/sbin/nft"} {
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	return "", errors.New("the nft command is not installed")
}

// guardFix says how to give a host what the guard needs.
const guardFix = "install nftables (Debian: apt-get install nftables) on a kernel with nf_tables, conntrack and the socket expression (CONFIG_NFT_SOCKET)"

// newGuard sweeps the tables crashed processes left, and makes this
// backend's. On failure nothing is made, and the error says what to fix.
func newGuard(clk clock.WithDelayedExecution, log logr.Logger) (*guard, error) {
	nft, err := nftPath()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, guardFix)
	}
	pidNS, err := pidNamespace()
	if err != nil {
		return nil, err
	}
	g := &guard{
		log: log, clk: clk, nft: nft, pidNS: pidNS,
		table: fmt.Sprintf("%s%d_%d_%d", guardTablePrefix, pidNS, os.Getpid(), guardSeq.Add(1)-1),
		sem:   make(chan struct{}, 1),
		holds: map[uint32]int{}, have: map[uint32]bool{},
	}
	ctx, cancel := core.WithTimeout(context.Background(), clk, nftTimeout)
	defer cancel()
	g.sweep(ctx)
	if err := g.run(ctx, g.tableScript()); err != nil {
		return nil, fmt.Errorf("making the nftables table %s: %v: %s", g.table, err, guardFix)
	}
	return g, nil
}

// tableScript makes the table afresh (an add, a delete and the
// definition, in one transaction, so a table of the name left before is
// replaced whole).
func (g *guard) tableScript() string {
	var b strings.Builder
	fmt.Fprintf(&b, "add table inet %s\ndelete table inet %s\n", g.table, g.table)
	fmt.Fprintf(&b, "table inet %s {\n", g.table)
	b.WriteString("\tcomment \"fiberd: TCP endpoints of isolated grants apart (docs/design.md, decision 102)\"\n")
	b.WriteString("\tmap uids { type uid : mark; }\n")
	b.WriteString("\tset own { type mark; }\n")
	b.WriteString("\tset same { type mark . mark; }\n")
	b.WriteString("\tchain output {\n\t\ttype filter hook output priority filter; policy accept;\n")
	b.WriteString("\t\tct state new ct mark set meta skuid map @uids\n\t}\n")
	b.WriteString("\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n")
	fmt.Fprintf(&b, "\t\tmeta l4proto tcp ct state new socket mark @own ct mark & 0x%08x == 0x%08x ct mark . socket mark != @same reject with tcp reset\n",
		GuardMarkMask, GuardMarkBase)
	b.WriteString("\t}\n}\n")
	return b.String()
}

// sweep deletes the tables of processes that are gone. What it cannot
// list or delete it leaves, at V(1): another process may sweep the same
// table at once.
func (g *guard) sweep(ctx context.Context) {
	out, err := g.output(ctx, "list", "tables", "inet")
	if err != nil {
		g.log.V(1).Info("Endpoint guard: tables not listed; leftovers of crashed processes stay", "err", err.Error())
		return
	}
	for _, name := range staleGuardTables(out, g.pidNS, pidAlive) {
		if err := g.run(ctx, "delete table inet "+name+"\n"); err != nil {
			g.log.V(1).Info("Endpoint guard: leftover table not deleted", "table", name, "err", err.Error())
			continue
		}
		g.log.V(1).Info("Endpoint guard: leftover table of a dead process deleted", "table", name)
	}
}

// staleGuardTables reads `nft list tables inet` and returns the guard
// tables (fiberd_<pidns>_<pid>_<n>) of PID namespace pidNS whose process
// is not alive. A table of another PID namespace (a fiberd in a container
// sharing the host's network) is never judged: its pid means nothing here.
func staleGuardTables(list string, pidNS uint64, alive func(int) bool) []string {
	var stale []string
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "table" || f[1] != "inet" || !strings.HasPrefix(f[2], guardTablePrefix) {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(f[2], guardTablePrefix), "_")
		if len(parts) != 3 {
			continue
		}
		ns, err1 := strconv.ParseUint(parts[0], 10, 64)
		pid, err2 := strconv.Atoi(parts[1])
		_, err3 := strconv.ParseUint(parts[2], 10, 32)
		if err1 != nil || err2 != nil || err3 != nil || pid <= 0 || ns != pidNS {
			continue
		}
		if !alive(pid) {
			stale = append(stale, f[2])
		}
	}
	return stale
}

// pidNamespace is the inode of this process's PID namespace.
func pidNamespace() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0, fmt.Errorf("reading fiberd's PID namespace (/proc/self/ns/pid), which names its nftables table: %w", err)
	}
	return st.Ino, nil
}

// pidAlive reports whether a process of that pid exists (in fiberd's PID
// namespace).
func pidAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// add holds the elements of the grant running as id in the table, adding
// them when this is the first hold. On error the hold is dropped again.
func (g *guard) add(ctx context.Context, id uint32) error {
	g.mu.Lock()
	g.holds[id]++
	g.mu.Unlock()
	if err := g.sync(ctx, id); err != nil {
		g.drop(id)
		return fmt.Errorf("keeping its endpoints apart from other grants' (nftables table %s): %w", g.table, err)
	}
	return nil
}

// remove drops a hold of add's, and deletes the grant's elements with the
// last. A failure is logged: what stays is the grant's own mark, which
// keeps its endpoints apart as before and no other grant's (marks are a
// function of the id).
func (g *guard) remove(id uint32) {
	ctx, cancel := core.WithTimeout(context.Background(), g.clk, 2*nftTimeout)
	defer cancel()
	g.drop(id)
	if err := g.sync(ctx, id); err != nil {
		g.log.Error(err, "Endpoint guard: a stopped grant's elements stay in the table", "table", g.table, "uid", id)
	}
}

func (g *guard) drop(id uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holds[id]--; g.holds[id] <= 0 {
		delete(g.holds, id)
	}
}

// sync makes the table hold id's elements when holds says so and not
// otherwise. One sync runs nft at a time; each reads holds once it runs.
func (g *guard) sync(ctx context.Context, id uint32) error {
	select {
	case g.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for another nft run: %w", ctx.Err())
	}
	defer func() { <-g.sem }()
	g.mu.Lock()
	want, have := g.holds[id] > 0, g.have[id]
	g.mu.Unlock()
	if want == have {
		return nil
	}
	verb := "add"
	if !want {
		verb = "delete"
	}
	m := GuardMark(id)
	script := fmt.Sprintf("%[1]s element inet %[2]s uids { %[3]d : 0x%08[4]x }\n%[1]s element inet %[2]s own { 0x%08[4]x }\n%[1]s element inet %[2]s same { 0x%08[4]x . 0x%08[4]x }\n",
		verb, g.table, id, m)
	rctx, cancel := core.WithTimeout(ctx, g.clk, nftTimeout)
	defer cancel()
	if err := g.run(rctx, script); err != nil {
		return err
	}
	g.mu.Lock()
	if want {
		g.have[id] = true
	} else {
		delete(g.have, id)
	}
	g.mu.Unlock()
	return nil
}

// close deletes the table.
func (g *guard) close() {
	ctx, cancel := core.WithTimeout(context.Background(), g.clk, nftTimeout)
	defer cancel()
	if err := g.run(ctx, "delete table inet "+g.table+"\n"); err != nil {
		g.log.Error(err, "Endpoint guard: table not deleted; the next fiberd deletes it", "table", g.table)
	}
}

// run feeds script to nft -f -.
func (g *guard) run(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, g.nft, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	return g.exec(ctx, cmd, nil)
}

// output runs nft with args and returns what it wrote.
func (g *guard) output(ctx context.Context, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, g.nft, args...)
	err := g.exec(ctx, cmd, &out)
	return out.String(), err
}

func (g *guard) exec(ctx context.Context, cmd *exec.Cmd, out *bytes.Buffer) error {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out != nil {
		cmd.Stdout = out
	}
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 400 {
			msg = msg[:400] + "..."
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", g.nft, ctx.Err())
		}
		return fmt.Errorf("%s: %v: %s", g.nft, err, msg)
	}
	return nil
}

// markListener gives an isolated grant's listener its mark.
func markListener(f *os.File, id uint32) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("marking the listener for the endpoint guard: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(GuardMark(id)))
	}); err != nil {
		serr = err
	}
	if serr != nil {
		return fmt.Errorf("marking the listener for the endpoint guard (SO_MARK): %w", serr)
	}
	return nil
}

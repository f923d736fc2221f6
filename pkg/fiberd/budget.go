package fiberd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
)

// The W budget (a grant's wBudget): the memory, in bytes, each fiber of the
// grant may dirty. Where the grant's cgroup has the memory controller for
// its fibers' leaves, each leaf gets memory.max = wBudget and memory.high
// = 7/8 of it (cgroup.Leaf.SetMemoryLimit), and the kernel ends a fiber at
// its memory.max (the backend reports it, ExitReason.MemoryMax). Elsewhere
// (no cgroups, or cgroup v2 without the memory controller, as on a host
// whose hierarchy is hybrid) the agent measures: every
// Config.BudgetInterval it sums the Private_Dirty of
// /proc/<pid>/smaps_rollup over each fiber's processes (its leaf's
// cgroup.procs, or without a leaf the members of its session) and ends a
// fiber over its budget. Either way the fiber's end reads "over wBudget:
// ..." in the grant's status (GrantStatus.Exits, OverBudget) and counts in
// fiberd_fiber_exits_total{reason="over_wbudget"}.
//
// Private_Dirty counts the pages the fiber wrote that no other process
// shares: pages it copied from its zygote on write, and memory it
// allocated. Pages swapped out are not counted; a fiber between two
// measurements may go over briefly.
//
// Files a fiber writes into its scratch directories (/tmp, /var/tmp,
// /dev/shm) take memory too. Each is a tmpfs the backend sizes to the
// wBudget (backend.Config.ScratchSize without one), and where the leaf
// enforces, the kernel charges those pages to the writer's leaf. Where the
// agent measures, it adds what the fiber's own scratch file systems hold
// (scratchUsed) when the fiber has them (isolation fiber); at isolation
// grant they are the grant's, shared by its fibers, and bounded by their
// size alone.

// memoryHigh is the memory.high set below a budget's memory.max.
func memoryHigh(budget int64) int64 { return max(budget-budget/8, 1) }

// budgetLoop measures, every BudgetInterval, the fibers whose budget is
// measured, until ctx ends.
func (a *Agent) budgetLoop(ctx context.Context) {
	a.every(ctx, a.cfg.BudgetInterval, func() { a.budgetRound(ctx) })
}

// every calls round each interval on the agent's clock, until ctx ends;
// a round that overruns delays the next, never runs beside it.
func (a *Agent) every(ctx context.Context, interval time.Duration, round func()) {
	t := a.cfg.Clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			round()
		}
	}
}

// budgetRound measures each running fiber of a grant with a budget that
// its leaf does not enforce, and ends those over it.
func (a *Agent) budgetRound(ctx context.Context) {
	type target struct {
		f      core.Fiber
		h      *fiberHandle
		budget int64
	}
	var targets []target
	for _, gs := range a.ledger.Snapshot() {
		if gs.Grant.WBudget <= 0 {
			continue
		}
		for _, f := range gs.Running {
			if h := handleOf(f); h != nil && h.measured && h.pid > 0 {
				targets = append(targets, target{f, h, gs.Grant.WBudget})
			}
		}
	}
	var sessions map[int][]int // session id -> pids, read once a round when needed
	for _, tg := range targets {
		if ctx.Err() != nil {
			return
		}
		var pids []int
		if tg.h.leaf != "" {
			pids, _ = cgroup.At(tg.h.leaf).Procs()
		} else {
			if sessions == nil {
				sessions = sessionMembers()
			}
			pids = sessions[tg.h.pid]
		}
		used, err := a.measure(pids)
		if err != nil {
			a.log.V(1).Info("Cannot measure a fiber's memory", "fiber", tg.f.Fence.String(), "err", err.Error())
			continue
		}
		var held int64
		if tg.h.iso == backend.IsolationFiber {
			held = a.scratch(tg.h.pid)
		}
		if used+held <= tg.budget {
			continue
		}
		reason := fmt.Sprintf("over wBudget: dirtied %s of memory, the grant allows %s", mib(used), mib(tg.budget))
		if held > 0 {
			reason = fmt.Sprintf("over wBudget: dirtied %s of memory and holds %s in its scratch directories, the grant allows %s", mib(used), mib(held), mib(tg.budget))
		}
		if !tg.h.over.CompareAndSwap(nil, &reason) {
			continue // being ended already
		}
		a.log.Info("Ending a fiber over its W budget", "fiber", tg.f.Fence.String(), "dirtied", used, "scratch", held, "wBudget", tg.budget)
		kctx, cancel := core.WithTimeout(ctx, a.cfg.Clock, drainTimeout)
		if err := tg.h.backend.Kill(kctx, tg.f.Fence); err != nil && !errors.Is(err, core.ErrNotFound) {
			a.log.Error(err, "Ending a fiber over its W budget", "fiber", tg.f.Fence.String())
		}
		cancel()
	}
}

// mib formats bytes as MiB with one decimal.
func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB" }

// sessionMembers maps each session id to its live processes.
func sessionMembers() map[int][]int {
	out := map[int][]int{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procrec.ReadStat(pid); err == nil && !st.Zombie {
			out[st.Session] = append(out[st.Session], pid)
		}
	}
	return out
}

// scratchDirs are the directories an isolated fiber has a tmpfs of its own
// on (backend's list).
var scratchDirs = []string{"tmp", "var/tmp", "dev/shm"}

// scratchUsed is what the tmpfs file systems on the scratch directories of
// process pid's mount namespace hold, in bytes, each counted once; a
// directory that is not a tmpfs of its own (the host's root file system)
// or cannot be read counts nothing. The paths are resolved through
// /proc/<pid>/root, where the process's mounts are; the fiber cannot
// change them (it has no capability to mount).
func scratchUsed(pid int) int64 {
	root := "/proc/" + strconv.Itoa(pid) + "/root/"
	var rootSt unix.Stat_t
	if unix.Stat(root, &rootSt) != nil {
		return 0
	}
	seen := map[uint64]bool{rootSt.Dev: true}
	var sum int64
	for _, d := range scratchDirs {
		var st unix.Stat_t
		var sfs unix.Statfs_t
		if unix.Stat(root+d, &st) != nil || seen[st.Dev] || unix.Statfs(root+d, &sfs) != nil || sfs.Type != unix.TMPFS_MAGIC {
			continue
		}
		seen[st.Dev] = true
		sum += int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize
	}
	return sum
}

// privateDirty is the agent's measure: the sum of Private_Dirty in
// /proc/<pid>/smaps_rollup over pids, in bytes. A process gone meanwhile
// counts nothing; a file that cannot be read or parsed otherwise fails.
func privateDirty(pids []int) (int64, error) {
	var sum int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrProcessDone) {
			continue
		}
		if err != nil {
			return 0, err
		}
		n, err := parseSmapsField(b, "Private_Dirty")
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/smaps_rollup: %w", pid, err)
		}
		sum += n
	}
	return sum, nil
}

// parseSmapsField returns field ("Private_Dirty") of smaps_rollup text, a
// line "Private_Dirty:   1234 kB", in bytes. An empty file (a process
// without memory, such as a zombie's) is 0.
func parseSmapsField(b []byte, field string) (int64, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return 0, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	prefix := []byte(field + ":")
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := bytes.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("%s: malformed line %q", field, line)
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || kb < 0 || kb > 1<<53 {
			return 0, fmt.Errorf("%s: %q is not a size in kB", field, f[0])
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s line", field)
}

// exitRecord is a fiber's end as the grant's status lists it.
func (s *slot) recordExit(e api.FiberExit, overBudget bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exits = append(s.exits, e)
	if len(s.exits) > api.MaxExits {
		s.exits = append(s.exits[:0], s.exits[len(s.exits)-api.MaxExits:]...)
	}
	if overBudget {
		s.overBudget++
	}
}

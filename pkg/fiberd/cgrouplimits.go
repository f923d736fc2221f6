package fiberd

import (
	"strings"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/cgroup"
)

// cgroupLimits is what the agent's cgroup root lets it enforce, read once
// at New: which controllers the root enables for its children, the
// grants' cgroups (pkg/cgroup enables what the root offers). A controller
// bound to cgroup v1, or not delegated to fiberd, is missing.
type cgroupLimits struct {
	Cgroups           bool // the agent carves cgroups at all
	Memory, Pids, CPU bool
}

// readCgroupLimits reads t's root; the zero cgroupLimits without a tree.
// A root whose cgroup.subtree_control cannot be read counts as enabling
// nothing.
func readCgroupLimits(t *cgroup.Tree) cgroupLimits {
	if t == nil {
		return cgroupLimits{}
	}
	root := cgroup.At(t.Root())
	has := func(c string) bool { ok, _ := root.Enabled(c); return ok }
	return cgroupLimits{Cgroups: true, Memory: has("memory"), Pids: has("pids"), CPU: has("cpu")}
}

// missing names the controllers fiberd uses that are not there, in order.
func (l cgroupLimits) missing() []string {
	var out []string
	for _, c := range []struct {
		name string
		ok   bool
	}{{"memory", l.Memory}, {"pids", l.Pids}, {"cpu", l.CPU}} {
		if !c.ok {
			out = append(out, c.name)
		}
	}
	return out
}

// limitsStatus is Status.Limits.
func (a *Agent) limitsStatus() *api.Limits {
	l := a.limits
	out := &api.Limits{Cgroups: l.Cgroups, WBudgetByCgroup: l.Memory, Missing: l.missing()}
	if l.Pids && a.cfg.FiberPidsMax > 0 {
		out.FiberPidsMax = a.cfg.FiberPidsMax
	}
	if l.CPU {
		out.GrantCPUWeight = a.cfg.GrantCPUWeight
	}
	return out
}

// logLimits says once, at start, which limits fiberd enforces on this
// host and which it cannot, and why.
func (a *Agent) logLimits() {
	st := a.limitsStatus()
	if !st.Cgroups {
		a.log.Info("Limits: no cgroups, so no per-fiber pids.max, no per-grant cpu.weight, and W budgets are measured, not enforced by the kernel; give fiberd a delegated cgroup v2 subtree (-cgroup-root) for them")
		return
	}
	kv := []any{"root", a.tree.Root(), "fiberPidsMax", st.FiberPidsMax, "grantCpuWeight", st.GrantCPUWeight, "wBudget", "measured"}
	if st.WBudgetByCgroup {
		kv[len(kv)-1] = "memory.max"
	}
	if len(st.Missing) == 0 {
		a.log.Info("Limits: every cgroup controller fiberd uses is there", kv...)
		return
	}
	a.log.Info("Limits: the cgroup root does not offer "+strings.Join(st.Missing, ", ")+", so what needs them is not enforced (enable the controllers in the parent's cgroup.subtree_control, on a cgroup v2 host)",
		append(kv, "missing", strings.Join(st.Missing, ","))...)
}

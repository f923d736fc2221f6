package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
)

// Spare fibers (a grant's fibers.warm): the same warm C and Python
// templates as the W=0 rows, on an agent of their own whose grants keep W
// spares forked ahead, so a Clone hands one over instead of forking.
const (
	spareW      = 8  // spares of the single-clone and closed-loop rows
	spareBurstW = 50 // spares of the burst rows: one per fiber of the burst
)

// The spare modes, beside modeWarmC and modeWarmPy (W=0).
var (
	modeSpareC   = fmt.Sprintf("fiberd warm C, W=%d spares", spareW)
	modeSparePy  = fmt.Sprintf("fiberd warm Python, W=%d spares", spareW)
	modeSpareBC  = fmt.Sprintf("fiberd warm C, W=%d spares", spareBurstW)
	modeSpareBPy = fmt.Sprintf("fiberd warm Python, W=%d spares", spareBurstW)
	// The W=spareW rows again with every grant isolated (-isolation
	// fiber), paired with the rows without isolation.
	modeSpareCIso  = modeSpareC + ", isolated"
	modeSparePyIso = modeSparePy + ", isolated"
	spareTemplate  = map[string]string{modeSpareC: tplWarmC, modeSparePy: tplWarmPy, modeSpareBC: tplWarmC, modeSpareBPy: tplWarmPy,
		modeSpareCIso: tplWarmC, modeSparePyIso: tplWarmPy}
)

// spareRows are what measureSpares measured, for the caller to place.
type spareRows struct {
	burst []BurstRow
	loop  []LoopRow
}

// measureSpares runs the spare rows: clone to first byte with W=spareW
// (into latency), a burst of o.burst with W=spareBurstW, the closed loop at
// each concurrency with W=spareW, and the memory the spares hold (into
// res.Spares). Each phase, and each burst round, starts once every
// grant's spares are ready again (outside the timer).
func measureSpares(ctx context.Context, work string, k *kit, o options, p *progress, log logr.Logger, latency map[string]LatencyRow, res *Result) (spareRows, error) {
	var out spareRows
	var gs []benchGrant
	for _, m := range []struct {
		mode string
		w    int
	}{{modeSpareC, spareW}, {modeSparePy, spareW}, {modeSpareBC, spareBurstW}, {modeSpareBPy, spareBurstW}} {
		if _, ok := k.specs[spareTemplate[m.mode]]; ok {
			gs = append(gs, benchGrant{key: fmt.Sprintf("%s-w%d", spareTemplate[m.mode], m.w), template: spareTemplate[m.mode], warm: m.w})
		}
	}
	key := func(mode string, w int) string { return fmt.Sprintf("%s-w%d", spareTemplate[mode], w) }
	p.Phasef("starting a second fiberd whose grants keep spares (fibers.warm %d and %d)", spareW, spareBurstW)
	ag, err := startAgentWith(ctx, filepath.Join(work, "spares"), k, o, backend.IsolationNone, gs, log)
	if err != nil {
		return out, err
	}
	defer ag.stop()
	// Every phase starts once every grant's spares are back: refilling
	// another grant's (50 Python forks after a burst) would load the
	// machine under the phase measured.
	quiet := func(ctx context.Context) error {
		for _, g := range gs {
			if _, err := ag.sparesReady(ctx, ag.uids[g.key], g.warm); err != nil {
				return err
			}
		}
		return nil
	}
	if err := quiet(ctx); err != nil {
		return out, err
	}

	for _, mode := range []string{modeSpareC, modeSparePy} {
		row := LatencyRow{Mode: mode, What: "Clone over the agent's socket, dial, GET, first byte"}
		uid, ok := ag.uids[key(mode, spareW)]
		if !ok {
			row.Note = k.missing[spareTemplate[mode]]
			latency[mode] = row
			continue
		}
		if err := quiet(ctx); err != nil {
			return out, err
		}
		p.Phasef("clone to first byte: %s (%d samples)", mode, o.n)
		before := ag.spares(ctx, uid)
		samples, err := ag.latency(ctx, uid, o.n, p.Counter(o.n))
		if err != nil {
			return out, fmt.Errorf("%s: %w", mode, err)
		}
		row.Measured, row.SamplesMs, row.Summary = true, samples, Summarize(samples)
		row.Note = handedOver(before, ag.spares(ctx, uid), len(samples))
		latency[mode] = row
	}

	if err := measureIsolatedSpares(ctx, work, ag, key, k, o, p, log, latency, quiet); err != nil {
		return out, err
	}

	for _, mode := range []string{modeSpareBC, modeSpareBPy} {
		row := BurstRow{Mode: mode, Size: o.burst, Rounds: o.rounds}
		uid, ok := ag.uids[key(mode, spareBurstW)]
		if !ok {
			row.Note = k.missing[spareTemplate[mode]]
			out.burst = append(out.burst, row)
			continue
		}
		p.Phasef("burst of %d: %s (%d rounds, each once the spares are ready)", o.burst, mode, o.rounds)
		before := ag.spares(ctx, uid)
		row, err = ag.burstAfter(ctx, uid, mode, o.burst, o.rounds, p.Counter(o.rounds), quiet)
		if err != nil {
			return out, fmt.Errorf("burst %s: %w", mode, err)
		}
		row.Note = handedOver(before, ag.spares(ctx, uid), o.burst*o.rounds)
		out.burst = append(out.burst, row)
	}

	for _, mode := range []string{modeSpareC, modeSparePy} {
		for _, c := range res.Settings.Concurrency {
			uid, ok := ag.uids[key(mode, spareW)]
			if !ok {
				out.loop = append(out.loop, LoopRow{Mode: mode, Concurrency: c, Note: k.missing[spareTemplate[mode]]})
				continue
			}
			if err := quiet(ctx); err != nil {
				return out, err
			}
			p.Phasef("closed loop: %s, %d callers, %s", mode, c, o.loop)
			before := ag.spares(ctx, uid)
			row, err := ag.loop(ctx, uid, mode, c, o.loop, p.Ticker())
			if err != nil {
				return out, fmt.Errorf("closed loop %s: %w", mode, err)
			}
			row.Note = handedOver(before, ag.spares(ctx, uid), row.Clones)
			out.loop = append(out.loop, row)
		}
	}

	for _, g := range gs {
		uid := ag.uids[g.key]
		st, err := ag.sparesReady(ctx, uid, g.warm)
		if err != nil {
			return out, err
		}
		name := "counter C"
		if g.template == tplWarmPy {
			name = "counter Python"
		}
		row := SpareRow{Template: name, Warm: g.warm, Ready: st.Ready, MiB: float64(st.Bytes) / (1 << 20)}
		if st.Ready > 0 {
			row.PerSpareMiB = row.MiB / float64(st.Ready)
		}
		res.Spares = append(res.Spares, row)
	}
	return out, nil
}

// spares is uid's spare status, zero when it cannot be read.
func (r *agentRig) spares(ctx context.Context, uid string) api.SpareStatus {
	st, err := r.client.Status(ctx)
	if err != nil {
		return api.SpareStatus{}
	}
	for _, g := range st.Grants {
		if g.UID == uid && g.Spares != nil {
			return *g.Spares
		}
	}
	return api.SpareStatus{}
}

// measureIsolatedSpares measures the W=spareW single-clone rows again on
// an agent with -isolation fiber whose grants keep spareW spares too, each
// sample paired with one of the same template on plain (the spare agent
// without isolation), the spares of both ready before each pair: what
// isolation adds to a Clone a spare serves, whose isolation was set up
// before it was taken (docs/design.md decision 88). quiet waits for plain's
// spares.
func measureIsolatedSpares(ctx context.Context, work string, plain *agentRig, key func(string, int) string, k *kit, o options, p *progress, log logr.Logger, latency map[string]LatencyRow, quiet func(context.Context) error) error {
	modes := []struct{ mode, plain string }{{modeSpareCIso, modeSpareC}, {modeSparePyIso, modeSparePy}}
	what := fmt.Sprintf("as with W=%d spares; each grant isolated as in the isolated rows, each spare before it is taken", spareW)
	var gs []benchGrant
	for _, m := range modes {
		if _, ok := k.specs[spareTemplate[m.mode]]; ok {
			gs = append(gs, benchGrant{key: key(m.mode, spareW), template: spareTemplate[m.mode], warm: spareW})
		} else {
			latency[m.mode] = LatencyRow{Mode: m.mode, What: what, Note: k.missing[spareTemplate[m.mode]]}
		}
	}
	if len(gs) == 0 {
		return nil
	}
	p.Phasef("starting a fiberd with -isolation fiber whose grants keep %d spares", spareW)
	ag, err := startAgentWith(ctx, filepath.Join(work, "spares-isolated"), k, o, backend.IsolationFiber, gs, log)
	if err != nil {
		return fmt.Errorf("isolated spare agent: %w", err)
	}
	defer ag.stop()
	missing := ag.isolationMissing(ctx)
	for _, m := range modes {
		uid, ok := ag.uids[key(m.mode, spareW)]
		if !ok {
			continue
		}
		plainUID, ok := plain.uids[key(m.plain, spareW)]
		if !ok {
			return fmt.Errorf("%s: the spare agent without isolation has no grant of %s", m.mode, spareTemplate[m.mode])
		}
		ready := func(ctx context.Context) error {
			if err := quiet(ctx); err != nil {
				return err
			}
			_, err := ag.sparesReady(ctx, uid, spareW)
			return err
		}
		before := ag.spares(ctx, uid)
		row, err := pairedIsolatedRow(ctx, plain, plainUID, ag, uid, m.mode, what, "the same template and spares", missing, o, p, ready)
		if err != nil {
			return err
		}
		if row.Measured {
			row.Note += "; " + handedOver(before, ag.spares(ctx, uid), len(row.SamplesMs))
		}
		latency[m.mode] = row
	}
	return nil
}

// sparesReady waits until grant uid has w spares ready, for up to a minute.
func (r *agentRig) sparesReady(ctx context.Context, uid string, w int) (api.SpareStatus, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		st := r.spares(ctx, uid)
		if st.Ready >= w {
			return st, nil
		}
		if !st.HandOver && st.Warm > 0 {
			return st, fmt.Errorf("grant %s: its template does not hand spares over", uid)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return st, fmt.Errorf("grant %s: %d of %d spares ready after a minute (status %+v)", uid, st.Ready, w, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// handedOver says how many of n Clones a spare served, between two spare
// statuses of one grant.
func handedOver(before, after api.SpareStatus, n int) string {
	return fmt.Sprintf("%d of %d Clones handed a spare", after.Taken-before.Taken, n)
}

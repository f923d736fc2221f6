package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// nodeRow is the measured row of mode, if there is one.
func nodeRow(r NodeResult, mode string) (NodeRow, bool) {
	for _, x := range r.Rows {
		if x.Mode == mode && x.Measured && x.Single.N > 0 {
			return x, true
		}
	}
	return NodeRow{}, false
}

// NodeRatios are fiberd's single-start p50 and p99 over another row's; ok is false when either
// row was not measured.
func NodeRatios(r NodeResult, other string) (p50, p99 float64, ok bool) {
	f, ok1 := nodeRow(r, modeNodeFiberd)
	o, ok2 := nodeRow(r, other)
	if !ok1 || !ok2 || o.Single.P50 <= 0 || o.Single.P99 <= 0 {
		return 0, 0, false
	}
	return f.Single.P50 / o.Single.P50, f.Single.P99 / o.Single.P99, true
}

func mib(kib float64) string { return num(kib / 1024) }

// nodeMarkdown writes the real-node comparison: start latency, burst, cost per worker, the
// ratios, the versions of every part, and the plot.
func nodeMarkdown(b *strings.Builder, r NodeResult, plotDir string) {
	b.WriteString("#### Side by side on a real node (fiberd grant Pod, Pod per worker, agent-sandbox warm pool)\n\n")
	if !r.Measured {
		table(b, []string{"mode", "value"}, [][]string{{"fiberd grant Pod, Pod per worker, agent-sandbox warm pool", notMeasured}, {"note", r.Note}})
		return
	}
	var lat, cost [][]string
	for _, x := range r.Rows {
		if !x.Measured {
			lat = append(lat, []string{x.Mode, x.What, notMeasured, "", "", "", "", "", x.Note})
			cost = append(cost, []string{x.Mode, notMeasured, "", "", "", "", x.Note})
			continue
		}
		s, bu := x.Single, x.Burst
		lat = append(lat, []string{x.Mode, x.What, fmt.Sprint(s.N), num(s.P50), num(s.P90), num(s.P99),
			num(bu.AllServedMs), num(bu.PerWorker.P50) + " / " + num(bu.PerWorker.P99), errNote(bu.Errors, x.Note)})
		m := x.Memory
		cost = append(cost, []string{x.Mode, num(x.Writes.PerWorker), mib(m.WorkerKiB), mib(m.PodKiB), mib(m.NodeKiB),
			"**" + mib(m.TotalKiB()) + "**", m.Note})
	}
	table(b, []string{"mode", "what is timed", "n", "p50 ms", "p90 ms", "p99 ms",
		fmt.Sprintf("burst of %d: all served ms", r.BurstSize), "burst: per worker p50 / p99 ms", "note"}, lat)
	if plotDir != "" {
		fmt.Fprintf(b, "![real node CDF](%s/node-cdf.png)\n\n", plotDir)
	}
	b.WriteString("Cost per worker: API server writes (`apiserver_request_total`, every resource, over the single starts' whole cycles, less the same cluster's idle rate), and Pss in MiB read while the burst's workers were all alive.\n\n")
	table(b, []string{"mode", "API writes per worker", "worker's processes MiB", "its Pod (pause, shim) MiB",
		"kubelet + containerd growth MiB", "total MiB", "memory note"}, cost)
	for _, x := range r.Rows {
		if x.Measured && x.Writes.Workers > 0 {
			fmt.Fprintf(b, "Writes of %s per worker: %s.\n\n", x.Mode, writeCounts(x.Writes))
		}
	}
	var lines []string
	for _, other := range []string{modePodNode, modeNodeWarmPool} {
		if p50, p99, ok := NodeRatios(r, other); ok {
			lines = append(lines, fmt.Sprintf("- fiberd / %s: p50 %s, p99 %s (the other is %s and %s slower).",
				other, fmt.Sprintf("%.4f", p50), fmt.Sprintf("%.4f", p99), ratio(1/p50), ratio(1/p99)))
		} else {
			lines = append(lines, "- fiberd / "+other+": "+notMeasured+".")
		}
	}
	b.WriteString(strings.Join(lines, "\n") + "\n\n")
	var vs [][]string
	for _, v := range r.Versions {
		vs = append(vs, []string{v.Part, v.Version, v.From})
	}
	table(b, []string{"part", "version", "from"}, vs)
}

// writeCounts lists a row's writes per worker by "VERB resource", the largest first, with the
// idle rate's share; "none" when there were none.
func writeCounts(w NodeWrites) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for k, v := range w.Delta {
		if verb, _, _ := strings.Cut(k, " "); IsWrite(verb) && v > 0 {
			all = append(all, kv{k, v / float64(w.Workers)})
		}
	}
	if len(all) == 0 {
		return "none"
	}
	slices.SortFunc(all, func(a, b kv) int {
		if c := cmp.Compare(b.v, a.v); c != 0 {
			return c
		}
		return strings.Compare(a.k, b.k)
	})
	parts := make([]string, len(all))
	for i, x := range all {
		parts[i] = fmt.Sprintf("`%s` %s", x.k, num(x.v))
	}
	return fmt.Sprintf("%s (the idle rate's share, subtracted: %s)", strings.Join(parts, ", "), num(w.IdlePerSecond*w.Seconds/float64(w.Workers)))
}

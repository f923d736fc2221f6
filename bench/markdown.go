package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Published figures the numbers are set against (docs/benchmarks.md names
// their sources).
const (
	publishedForkMs     = 4.0    // a fork-based warm clone
	publishedWarmPoolMs = 92.0   // a Kubernetes warm-pool claim, p50
	publishedPodSLOMs   = 5000.0 // Kubernetes Pod start-up SLO, p99
)

// notMeasured is what a table cell says for a row that was not measured.
const notMeasured = "not measured"

// num prints a measurement with precision to match its size; NaN, zero
// samples and infinities print "-".
func num(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "-"
	case math.Abs(v) < 10:
		return fmt.Sprintf("%.2f", v)
	case math.Abs(v) < 1000:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func ratio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) || v == 0 {
		return "-"
	}
	return num(v) + "x"
}

// table writes a Markdown table.
func table(b *strings.Builder, header []string, rows [][]string) {
	b.WriteString("| " + strings.Join(header, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat(" --- |", len(header)) + "\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	b.WriteString("\n")
}

// Markdown renders r as the tables of docs/benchmarks.md: the host floor
// (when the run measured it or said why not), latency,
// then burst, closed loop, density, API server load, Kubernetes home
// timings, the published comparisons and the machine. plotDir, when not
// empty, is the path the plots are linked under.
func Markdown(r Result, plotDir string) string {
	var b strings.Builder
	if r.Quick {
		b.WriteString("> **-quick smoke run**: few samples, not for quoting.\n\n")
	}
	for _, w := range r.Warnings {
		b.WriteString("> **Warning:** " + w + "\n\n")
	}

	if r.Floor.Measured || r.Floor.Note != "" {
		floorMarkdown(&b, r.Floor)
	}

	b.WriteString("#### Clone to first HTTP byte\n\n")
	var rows [][]string
	for _, l := range r.Latency {
		if !l.Measured {
			rows = append(rows, []string{l.Mode, l.What, notMeasured, "", "", "", "", l.Note})
			continue
		}
		s := l.Summary
		rows = append(rows, []string{l.Mode, l.What, fmt.Sprint(s.N), num(s.P50), num(s.P90), num(s.P99),
			ratio(l.RatioP50) + " / " + ratio(l.RatioP90) + " / " + ratio(l.RatioP99), l.Note})
	}
	table(&b, []string{"mode", "what is timed", "n", "p50 ms", "p90 ms", "p99 ms", "vs warm C (p50 / p90 / p99)", "note"}, rows)
	if plotDir != "" {
		fmt.Fprintf(&b, "![latency CDF](%s/latency-cdf.png) ![latency box plot](%s/latency-box.png)\n\n", plotDir, plotDir)
	}

	b.WriteString("#### Burst\n\n")
	rows = nil
	for _, x := range r.Burst {
		if !x.Measured {
			rows = append(rows, []string{x.Mode, notMeasured, "", "", "", "", "", x.Note})
			continue
		}
		rows = append(rows, []string{x.Mode, fmt.Sprint(x.Size), fmt.Sprint(x.Rounds), num(x.AllServed.P50),
			num(x.PerFiber.P50), num(x.PerFiber.P90), num(x.PerFiber.P99), errNote(x.Errors, x.Note)})
	}
	table(&b, []string{"mode", "burst", "rounds", "all served ms (p50 of rounds)", "per fiber p50 ms", "p90 ms", "p99 ms", "note"}, rows)

	b.WriteString("#### Sustained closed loop (clone, first byte, release)\n\n")
	rows = nil
	for _, x := range r.Loop {
		if !x.Measured {
			rows = append(rows, []string{x.Mode, fmt.Sprint(x.Concurrency), notMeasured, "", "", x.Note})
			continue
		}
		rows = append(rows, []string{x.Mode, fmt.Sprint(x.Concurrency), num(x.PerSecond), num(x.Cycle.P50), num(x.Cycle.P99),
			errNote(x.Errors, x.Note)})
	}
	table(&b, []string{"mode", "callers", "clones/s", "cycle p50 ms", "cycle p99 ms", "note"}, rows)
	if plotDir != "" {
		fmt.Fprintf(&b, "![closed loop](%s/loop.png)\n\n", plotDir)
	}

	b.WriteString("#### Density (proportional set size, `smaps_rollup` Pss)\n\n")
	rows = nil
	for _, x := range r.Density {
		if !x.Measured {
			rows = append(rows, []string{x.Template, notMeasured, "", "", "", "", x.Note})
			continue
		}
		rows = append(rows, []string{x.Template, fmt.Sprint(x.N),
			fmt.Sprintf("%s (%s / fiber, %d procs)", num(x.WarmMiB), num(x.WarmMiB/float64(x.N)), x.WarmProcs),
			fmt.Sprintf("%s (%s / process)", num(x.ColdMiB), num(x.ColdMiB/float64(x.N))),
			ratio(x.Ratio), x.Note})
	}
	table(&b, []string{"template", "N", "N fibers + zygote, MiB", "N processes (cold exec), MiB", "cold / warm", "note"}, rows)

	if len(r.Spares) > 0 {
		b.WriteString("#### Memory the spare fibers hold (fibers.warm, their own pages: summed `Private_Dirty`)\n\n")
		rows = nil
		for _, x := range r.Spares {
			rows = append(rows, []string{x.Template, fmt.Sprint(x.Warm), fmt.Sprint(x.Ready), num(x.MiB), num(x.PerSpareMiB), x.Note})
		}
		table(&b, []string{"template", "fibers.warm", "spares ready", "MiB", "MiB / spare", "note"}, rows)
	}

	parkMarkdown(&b, r.Park)

	b.WriteString("#### API server load (`apiserver_request_total` on the real API server)\n\n")
	a := r.APIServer
	if !a.Measured {
		table(&b, []string{"what", "value"}, [][]string{{"requests per fiber", notMeasured}, {"requests per poll period", notMeasured}, {"note", a.Note}})
	} else {
		table(&b, []string{"what", "value"}, [][]string{
			{"requests per fiber (fiberd clone)", fmt.Sprintf("**%s** (%s writes)", num(a.PerFiber), num(a.WritesPerFiber))},
			{fmt.Sprintf("clone window: %d clones in %s s", a.Clones, num(a.CloneSeconds)),
				fmt.Sprintf("%s requests (%s writes); home poll rounds in the window: %s; counted: %s", num(a.CloneRequests), num(a.CloneWrites), num(a.PollRounds), counts(a.CloneDelta))},
			{fmt.Sprintf("requests per poll period of the home (poll %s)", a.Poll), fmt.Sprintf("%s (%s writes)", num(a.PerPollPeriod), num(a.WritesPerPeriod))},
			{fmt.Sprintf("idle window, %s s", num(a.IdleSeconds)), counts(a.IdleDelta)},
		})
		if a.Note != "" {
			b.WriteString(a.Note + "\n\n")
		}
	}

	b.WriteString("#### Kubernetes home\n\n")
	k := r.KubeHome
	if !k.Measured {
		table(&b, []string{"timing", "value"}, [][]string{{"grant fetch, readiness patch, scope loss", notMeasured}, {"note", k.Note}})
	} else {
		krow := func(name string, s Summary) []string {
			return []string{name, fmt.Sprint(s.N), num(s.P50), num(s.P90), num(s.Max)}
		}
		table(&b, []string{"timing", "n", "p50 ms", "p90 ms", "max ms"}, [][]string{
			krow("grant fetch at start (kubernetes.New with a token file)", k.GrantFetch),
			krow("  of which the issuer (TokenReview + mint)", k.IssuerServe),
			krow("readiness patch (PublishReady, one status patch)", k.ReadinessPatch),
			krow("agent start to Pod condition True (template warm-up included)", k.StartToReady),
			krow(fmt.Sprintf("scope loss: Pod deleted to OnScopeLost (poll %s)", k.Poll), k.ScopeLoss),
		})
		if k.Note != "" {
			b.WriteString(k.Note + "\n\n")
		}
	}

	nodeMarkdown(&b, r.Node, plotDir)

	b.WriteString("#### Against published figures\n\n")
	b.WriteString(Comparisons(r))
	b.WriteString("\n#### Machine\n\n")
	m := r.Machine
	cg := "no (fibers run in no cgroup of their own)"
	if m.CgroupsUsed {
		cg = "yes"
	}
	table(&b, []string{"fact", "value"}, [][]string{
		{"`nproc`", fmt.Sprint(m.NProc)},
		{"CPU", m.CPU},
		{"memory", fmt.Sprintf("%d MiB", m.MemTotalMiB)},
		{"kernel", m.Kernel},
		{"Go / cc / Python", strings.Join(nonEmpty(m.GoVersion, m.CC, m.Python), " / ")},
		{"kube-apiserver", orDash(m.KubeAPI)},
		{"load average at start / end", m.LoadStart + " / " + m.LoadEnd},
		{"cgroups per fiber", cg},
	})
	fmt.Fprintf(&b, "Command: `%s` (%s s, started %s)\n", r.Command, num(r.Seconds), r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	return b.String()
}

// Comparisons is one line per published figure, saying how the run's
// numbers compare.
func Comparisons(r Result) string {
	var b strings.Builder
	row := func(mode string) (LatencyRow, bool) {
		for _, l := range r.Latency {
			if l.Mode == mode && l.Measured && l.Summary.N > 0 {
				return l, true
			}
		}
		return LatencyRow{}, false
	}
	warm, okWarm := row(modeWarmC)
	pod, okPod := row(modePod)
	if okWarm {
		fmt.Fprintf(&b, "- Fork-based warm clone, about %s ms: fiberd warm C p50 is %s ms through the whole agent (API call, fork, first HTTP byte), %s the figure.\n",
			num(publishedForkMs), num(warm.Summary.P50), times(publishedForkMs, warm.Summary.P50))
		fmt.Fprintf(&b, "- Kubernetes warm-pool claim, %s ms p50: fiberd warm C p50 %s ms is %s it.\n",
			num(publishedWarmPoolMs), num(warm.Summary.P50), times(publishedWarmPoolMs, warm.Summary.P50))
	} else {
		b.WriteString("- Fork-based warm clone and warm-pool claim: warm C " + notMeasured + ".\n")
	}
	if okPod {
		fmt.Fprintf(&b, "- Pod start-up SLO, %s ms p99: a Pod per worker on the API server alone (no kubelet, no image, no sandbox: a lower bound) has p99 %s ms, %s the SLO; fiberd warm C p99 is %s ms.\n",
			num(publishedPodSLOMs), num(pod.Summary.P99), times(publishedPodSLOMs, pod.Summary.P99), num(warm.Summary.P99))
	} else {
		b.WriteString("- Pod start-up SLO (5 s p99): a Pod per worker on the API server alone " + notMeasured + ".\n")
	}
	if claim, ok := nodeRow(r.Node, modeNodeWarmPool); ok {
		fmt.Fprintf(&b, "- Kubernetes warm-pool claim, %s ms p50: the agent-sandbox warm pool claim measured on the real node here has p50 %s ms (%s the figure) and p99 %s ms.\n",
			num(publishedWarmPoolMs), num(claim.Single.P50), times(publishedWarmPoolMs, claim.Single.P50), num(claim.Single.P99))
	}
	if node, ok := row(modePodNode); ok {
		fmt.Fprintf(&b, "- Pod start-up SLO, %s ms p99: a Pod per worker on a real node (scheduled, sandbox, container, first HTTP byte) has p50 %s ms and p99 %s ms, %s the SLO; its p50 is %s fiberd warm C's.\n",
			num(publishedPodSLOMs), num(node.Summary.P50), num(node.Summary.P99), times(publishedPodSLOMs, node.Summary.P99), ratio(node.RatioP50))
	} else {
		b.WriteString("- Pod start-up SLO (5 s p99): a Pod per worker on a real node " + notMeasured + ".\n")
	}
	return b.String()
}

// times says how measured compares to published: "12.3x below" or "2.0x
// above".
func times(published, measured float64) string {
	if measured <= 0 || math.IsNaN(measured) {
		return "not comparable to"
	}
	if measured <= published {
		return ratio(published/measured) + " below"
	}
	return ratio(measured/published) + " above"
}

func errNote(n int, note string) string {
	if n == 0 {
		return note
	}
	return strings.TrimSpace(fmt.Sprintf("%d errors. %s", n, note))
}

func counts(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("`%s` %s", k, num(m[k])))
	}
	return strings.Join(parts, ", ")
}

func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

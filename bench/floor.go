package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// HostFloor is what the machine charges any design of fibers, measured by
// bench/testdata/hostfloor.c before fiberd starts: how many processes it
// can make a second, what a copy-on-write fault costs, what waking a
// blocked process costs, and how cold the caches are after it idled. The
// rows of the run are bounded by it: every Clone makes one process (forked
// on its path or, with spares, as a replacement), so no closed loop runs
// faster than ForksPerSecondAll.
type HostFloor struct {
	Measured bool   `json:"measured"`
	Note     string `json:"note,omitempty"`
	// IdleMs is the sleep before each idle sample.
	IdleMs int `json:"idleMs"`
	// ForksPerSecond1 is fork, _exit and waitpid of a small process in
	// one loop; ForksPerSecondAll the sum of one such loop per CPU at once.
	ForksPerSecond1   float64 `json:"forksPerSecond1"`
	ForksPerSecondAll float64 `json:"forksPerSecondAll"`
	// COWFaultUs is a forked child's first write to a page it shares with
	// its parent, in microseconds.
	COWFaultUs float64 `json:"cowFaultUs"`
	// WakeUs and WakeIdleUs are round trips to a process blocked in read,
	// back to back and after IdleMs of idleness.
	WakeUs     float64 `json:"wakeUs"`
	WakeIdleUs float64 `json:"wakeIdleUs"`
	// ChaseUs and ChaseIdleUs are one walk through 256 KiB, a cache line a
	// step in random order, right after the previous walk and after IdleMs
	// of idleness.
	ChaseUs     float64 `json:"chaseUs"`
	ChaseIdleUs float64 `json:"chaseIdleUs"`
}

// floorKeys maps hostfloor's output keys to the fields they fill.
func floorKeys(f *HostFloor) map[string]*float64 {
	return map[string]*float64{
		"forks_per_s_1":   &f.ForksPerSecond1,
		"forks_per_s_all": &f.ForksPerSecondAll,
		"cow_fault_us":    &f.COWFaultUs,
		"wake_us":         &f.WakeUs,
		"wake_idle_us":    &f.WakeIdleUs,
		"chase_us":        &f.ChaseUs,
		"chase_idle_us":   &f.ChaseIdleUs,
	}
}

// parseFloor reads hostfloor's "key value" lines into f. Every key must
// come exactly once with a finite, non-negative value; anything else is an
// error naming the line.
func parseFloor(out []byte, f *HostFloor) error {
	keys := floorKeys(f)
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, " ")
		dst, known := keys[k]
		if !ok || !known {
			return fmt.Errorf("hostfloor line %d: %q: want one of its keys and a value", n, line)
		}
		if seen[k] {
			return fmt.Errorf("hostfloor line %d: %s given twice", n, k)
		}
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			return fmt.Errorf("hostfloor line %d: %s: %q is not a non-negative number", n, k, v)
		}
		*dst, seen[k] = x, true
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("hostfloor output: %w", err)
	}
	for k := range keys {
		if !seen[k] {
			return fmt.Errorf("hostfloor output lacks %s", k)
		}
	}
	return nil
}

// measureFloor builds bench/testdata/hostfloor.c of the checkout at root
// into dir with $CC (default cc) and runs it for secs a fork loop, samples
// samples of the rest, idle apart. Without a compiler the floor is not
// measured and its Note says why; a probe that fails or prints something
// else is an error.
func measureFloor(ctx context.Context, root, dir string, secs float64, samples int, idle time.Duration) (HostFloor, error) {
	f := HostFloor{IdleMs: int(idle / time.Millisecond)}
	cc := envOr("CC", "cc")
	if _, err := exec.LookPath(cc); err != nil {
		f.Note = fmt.Sprintf("no C compiler (%s) to build bench/testdata/hostfloor.c", cc)
		return f, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return f, err
	}
	bin := filepath.Join(dir, "hostfloor")
	src := filepath.Join(root, "bench", "testdata", "hostfloor.c")
	if !newer(bin, src) {
		if b, err := exec.CommandContext(ctx, cc, "-O2", "-Wall", "-o", bin, src).CombinedOutput(); err != nil {
			return f, fmt.Errorf("building %s: %v: %s", src, err, bytes.TrimSpace(b))
		}
	}
	// The probe's own bound: its fork loops twice, its samples idle apart
	// (a wake and a chase each), a minute of slack for a slow machine.
	limit := time.Duration(2*secs*float64(time.Second)) + 2*time.Duration(samples)*idle + time.Minute
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(rctx, bin, strconv.FormatFloat(secs, 'f', -1, 64), strconv.Itoa(samples), strconv.Itoa(f.IdleMs))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second // a killed probe's children may hold its stdout
	out, err := cmd.Output()
	if err != nil {
		return f, fmt.Errorf("hostfloor: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := parseFloor(out, &f); err != nil {
		return f, err
	}
	f.Measured = true
	return f, nil
}

// newer reports whether file a exists and was modified after file b.
func newer(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && sa.ModTime().After(sb.ModTime())
}

// floorMarkdown writes the floor's table and the ceilings it puts on the
// rows above it.
func floorMarkdown(b *strings.Builder, f HostFloor) {
	b.WriteString("#### Host floor (what this machine charges any design, measured without fiberd)\n\n")
	if !f.Measured {
		table(b, []string{"what", "value"}, [][]string{{"host floor", notMeasured}, {"note", f.Note}})
		return
	}
	idle := fmt.Sprintf("after %d ms idle", f.IdleMs)
	table(b, []string{"what", "value"}, [][]string{
		{"fork, exit and wait of a small process, one loop", num(f.ForksPerSecond1) + " /s"},
		{"the same, one loop per CPU at once (summed)", num(f.ForksPerSecondAll) + " /s"},
		{"copy-on-write fault (a forked child's first write to a shared page)", num(f.COWFaultUs) + " us"},
		{"wake a process blocked in read: round trip, back to back / " + idle, num(f.WakeUs) + " / " + num(f.WakeIdleUs) + " us"},
		{"walk 256 KiB a cache line at a time, random order: back to back / " + idle, num(f.ChaseUs) + " / " + num(f.ChaseIdleUs) + " us"},
	})
	ceiling := math.Max(f.ForksPerSecond1, f.ForksPerSecondAll)
	fmt.Fprintf(b, "Every Clone makes one process (forked on its path or, with spares, as the replacement of the "+
		"one it took), so no closed loop here can run faster than about %s clones/s, whatever fiberd does. "+
		"A fiber's first touch of each page it shares with its zygote costs one fault of %s us. "+
		"After %d ms of idleness the same walk through memory takes %s times as long: a spare woken on an "+
		"idle machine runs from cold caches.\n\n",
		num(ceiling), num(f.COWFaultUs), f.IdleMs, num(f.ChaseIdleUs/f.ChaseUs))
}

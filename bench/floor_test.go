package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/devkit"
)

const floorOut = `forks_per_s_1 1562.5
forks_per_s_all 1524.5
cow_fault_us 14.689
wake_us 14.3
wake_idle_us 65.0
chase_us 16.7
chase_idle_us 413.6
`

func TestParseFloor(t *testing.T) {
	var f HostFloor
	if err := parseFloor([]byte(floorOut), &f); err != nil {
		t.Fatal(err)
	}
	want := HostFloor{ForksPerSecond1: 1562.5, ForksPerSecondAll: 1524.5, COWFaultUs: 14.689, WakeUs: 14.3,
		WakeIdleUs: 65, ChaseUs: 16.7, ChaseIdleUs: 413.6}
	if f != want {
		t.Fatalf("parseFloor = %+v, want %+v", f, want)
	}
}

// A probe that prints something else is refused with the line named, not
// read as zeros.
func TestParseFloorRefuses(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"a key missing", strings.Replace(floorOut, "wake_us 14.3\n", "", 1), "lacks wake_us"},
		{"a key twice", floorOut + "chase_us 1\n", "line 8: chase_us given twice"},
		{"an unknown key", "speed 3\n" + floorOut, `line 1: "speed 3"`},
		{"no value", "forks_per_s_1\n", `line 1: "forks_per_s_1"`},
		{"not a number", strings.Replace(floorOut, "14.689", "fast", 1), `cow_fault_us: "fast"`},
		{"negative", strings.Replace(floorOut, "16.7", "-16.7", 1), "chase_us"},
		{"NaN", strings.Replace(floorOut, "65.0", "NaN", 1), "wake_idle_us"},
		{"infinite", strings.Replace(floorOut, "1524.5", "+Inf", 1), "forks_per_s_all"},
		{"empty", "", "lacks"},
		{"a line too long to scan", strings.Repeat("x", 1<<17), "hostfloor output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f HostFloor
			err := parseFloor([]byte(tc.out), &f)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseFloor error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestFloorMarkdown(t *testing.T) {
	f := HostFloor{Measured: true, IdleMs: 200}
	if err := parseFloor([]byte(floorOut), &f); err != nil {
		t.Fatal(err)
	}
	r := sampleResult()
	r.Floor = f
	md := Markdown(r, "")
	for _, want := range []string{
		"#### Host floor",
		"| fork, exit and wait of a small process, one loop | 1562 /s |",
		"| the same, one loop per CPU at once (summed) | 1524 /s |",
		"| copy-on-write fault (a forked child's first write to a shared page) | 14.7 us |",
		"back to back / after 200 ms idle | 14.3 / 65.0 us |",
		"| 16.7 / 413.6 us |",
		// The ceiling is the faster of the two fork rates.
		"faster than about 1562 clones/s",
		"takes 24.8 times as long",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the floor section lacks %q:\n%s", want, md)
		}
	}
	if strings.Index(md, "#### Host floor") > strings.Index(md, "#### Clone to first HTTP byte") {
		t.Error("the host floor does not come before the rows it bounds")
	}

	r.Floor = HostFloor{Note: "no C compiler (cc) to build bench/testdata/hostfloor.c"}
	md = Markdown(r, "")
	if !strings.Contains(md, "| host floor | not measured |") || !strings.Contains(md, "| note | no C compiler (cc)") {
		t.Errorf("an unmeasured floor does not say so and why:\n%s", md)
	}
	r.Floor = HostFloor{}
	if md = Markdown(r, ""); strings.Contains(md, "Host floor") {
		t.Error("a run that never tried the floor (-only-node) shows a floor section")
	}
}

// probeCheckout is the checkout whose bench/testdata/hostfloor.c the tests
// build; it skips the test without a C compiler.
func probeCheckout(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath(envOr("CC", "cc")); err != nil {
		t.Skip("cc not found: bench/testdata/hostfloor.c cannot be built")
	}
	root, err := devkit.FindCheckout()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// The probe builds with the system compiler and measures this machine:
// every number positive, a fork loop making processes, idle samples slept.
func TestMeasureFloor(t *testing.T) {
	root := probeCheckout(t)
	start := time.Now()
	f, err := measureFloor(context.Background(), root, t.TempDir(), 0.1, 2, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Measured || f.IdleMs != 20 {
		t.Fatalf("floor = %+v, want measured with IdleMs 20", f)
	}
	for name, v := range map[string]float64{"forks/s": f.ForksPerSecond1, "forks/s (all)": f.ForksPerSecondAll,
		"fault": f.COWFaultUs, "wake": f.WakeUs, "idle wake": f.WakeIdleUs, "chase": f.ChaseUs, "idle chase": f.ChaseIdleUs} {
		if v <= 0 {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	// Two 0.1 s fork loops and two sets of two 20 ms sleeps at least.
	if d := time.Since(start); d < 280*time.Millisecond {
		t.Errorf("the probe ran %v: it did not run its loops and sleeps", d)
	}
}

// A cancelled run ends the probe rather than waiting for it.
func TestMeasureFloorCancelled(t *testing.T) {
	root := probeCheckout(t)
	dir := t.TempDir()
	if _, err := measureFloor(context.Background(), root, dir, 0.01, 1, 0); err != nil {
		t.Fatal(err) // builds the probe outside the timed part
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := measureFloor(ctx, root, dir, 60, 1, 0); err == nil {
		t.Fatal("a probe asked for 60 s fork loops under a 300 ms context returned no error")
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("a cancelled probe took %v to end", d)
	}
}

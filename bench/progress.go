package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress writes a line per phase and a counter to w (stderr). On a
// terminal the counter is rewritten in place; otherwise it is printed at
// every quarter of its total.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	mu    sync.Mutex
	open  bool // a counter line is being rewritten
}

func newProgress(w io.Writer) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progress{w: w, tty: tty, start: time.Now()}
}

// Phasef starts a phase.
func (p *progress) Phasef(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
	el := time.Since(p.start).Round(time.Second)
	fmt.Fprintf(p.w, "[%6s] %s\n", el, fmt.Sprintf(format, args...))
}

// Counter returns a function to call once per finished item of total.
func (p *progress) Counter(total int) func() {
	var n int
	step := max(1, total/4)
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		n++
		switch {
		case p.tty:
			fmt.Fprintf(p.w, "\r         %d/%d", n, total)
			p.open = n < total
			if n == total {
				fmt.Fprintln(p.w)
			}
		case n%step == 0 || n == total:
			fmt.Fprintf(p.w, "         %d/%d\n", n, total)
		}
	}
}

// Ticker returns a function to call once per finished item when the total
// is not known in advance; it shows the count so far.
func (p *progress) Ticker() func() {
	var n int
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		n++
		switch {
		case p.tty && n%10 == 0:
			fmt.Fprintf(p.w, "\r         %d done", n)
			p.open = true
		case !p.tty && n%500 == 0:
			fmt.Fprintf(p.w, "         %d done\n", n)
		}
	}
}

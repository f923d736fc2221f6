package logtest

import (
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Recorder keeps every line its loggers write, in order. The zero value
// records V(0) lines; it is safe for concurrent use.
type Recorder struct {
	// Verbosity is the highest V-level recorded; lines of a higher level
	// are dropped. Default 0. Set it before calling Logger: a logger
	// already made keeps the level it was made with.
	Verbosity int

	mu    sync.Mutex
	lines []string
}

// Logger returns a logger writing to r. Each line is recorded as funcr
// formats it: the logger's name (if any) and a space, then the message, the
// error and the key/value pairs, e.g. `"msg"="skipping" "file"="a.jwt"`.
func (r *Recorder) Logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		line := args
		if prefix != "" {
			line = prefix + " " + args
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.lines = append(r.lines, line)
	}, funcr.Options{Verbosity: r.Verbosity})
}

// Lines returns a copy of the lines recorded so far.
func (r *Recorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// Matching returns the recorded lines that contain every one of subs, in
// order (all lines when subs is empty; nil when none matches).
func (r *Recorder) Matching(subs ...string) []string {
	var out []string
next:
	for _, line := range r.Lines() {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// Count is the number of recorded lines that contain every one of subs.
func (r *Recorder) Count(subs ...string) int { return len(r.Matching(subs...)) }

// String returns the recorded lines joined by newlines, for substring
// checks over the whole log and for failure messages.
func (r *Recorder) String() string { return strings.Join(r.Lines(), "\n") }

package backend

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
)

// capLog is a template's log file: it keeps the first max bytes written and
// then one marker line, dropping the rest, so a chatty template cannot fill
// the run directory. Opening it keeps the previous file as <path>.1.
type capLog struct {
	mu      sync.Mutex
	f       *os.File
	max     int64
	written int64
	full    bool
}

func openCapLog(path string, max int64) (*capLog, error) {
	if _, err := os.Stat(path); err == nil {
		_ = os.Rename(path, path+".1")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("log file: %w", err)
	}
	return &capLog{f: f, max: max}, nil
}

// Write never fails to its caller: the copier must keep draining the pipe.
func (l *capLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.full {
		return len(b), nil
	}
	keep := b
	if room := l.max - l.written; int64(len(keep)) > room {
		keep = keep[:room]
		l.full = true
	}
	n, _ := l.f.Write(keep)
	l.written += int64(n)
	if l.full {
		_, _ = fmt.Fprintf(l.f, "\n[fiberd: log reached %d bytes; further output dropped]\n", l.max)
	}
	return len(b), nil
}

func (l *capLog) Close() error { return l.f.Close() }

// logPipe is a template's log as its processes see it: they write to w,
// copy drains r into the capped file. Proc gives w to its zygote, Exec to
// every fiber of the grant.
type logPipe struct {
	path string
	file *capLog
	r, w *os.File
	done chan struct{} // closed when copy has returned
}

// openLogPipe opens the log file at path (see openCapLog) and the pipe. On
// failure nothing is left open.
func openLogPipe(path string, max int64) (*logPipe, error) {
	file, err := openCapLog(path, max)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		_ = file.Close()
		return nil, fmt.Errorf("log pipe: %w", err)
	}
	return &logPipe{path: path, file: file, r: r, w: w, done: make(chan struct{})}, nil
}

// copy drains the pipe into the file until the pipe ends or r is closed,
// then closes done. The backend runs it in a goroutine of its wait group.
func (l *logPipe) copy() {
	defer close(l.done)
	buf := make([]byte, 32<<10)
	_, _ = io.CopyBuffer(l.file, l.r, buf)
}

// abort closes everything of a pipe whose copy never ran.
func (l *logPipe) abort() error {
	_ = l.r.Close()
	_ = l.w.Close()
	return l.file.Close()
}

// drain closes the log once every writer is gone: it closes w (if the
// backend still holds it), gives copy up to a second (or until ctx ends) to
// take what is left in the pipe, then closes r and the file.
func (l *logPipe) drain(ctx context.Context, clk clock.WithDelayedExecution) {
	_ = l.w.Close()
	dctx, cancel := core.WithTimeout(ctx, clk, time.Second)
	select {
	case <-l.done:
	case <-dctx.Done():
	}
	cancel()
	_ = l.r.Close()
	<-l.done
	_ = l.file.Close()
}

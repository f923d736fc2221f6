package backend

import (
	"fmt"
	"io"
	"os"
	"sync"
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

// copyLog drains r into l until r ends or is closed, then closes done.
func copyLog(r io.Reader, l *capLog, done chan<- struct{}) {
	defer close(done)
	buf := make([]byte, 32<<10)
	_, _ = io.CopyBuffer(l, r, buf)
}

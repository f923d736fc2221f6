package backend

import (
	"os/exec"
	"runtime"
	"sync"
)

// threadSpawner starts processes from one OS thread that no other goroutine
// runs on while the spawner lives: criu restore, so the fibers it brings
// back (with --restore-sibling their parent is the thread that started
// criu) keep a parent thread that does not end before the backend closes.
//
// Why it matters: a parent-death signal (PR_SET_PDEATHSIG, which the SDKs
// set in every fiber and CRIU restores) fires when the parent *thread*
// ends, not the process. The Go runtime ends a thread only when a goroutine
// that locked it (runtime.LockOSThread) returns without unlocking it; a
// thread that once started a process from no particular goroutine could
// later be locked that way by another goroutine (an isolation spawner of a
// backend made later, which ends its thread at its Close), and the fiber
// would be killed then. The spawner's thread is locked while it serves and
// unlocked, not ended, at close: it returns to the runtime's pool and is
// never ended, and by then every fiber it started has been ended anyway.
//
// The goroutine starts on the first call and ends at close.
type threadSpawner struct {
	mu      sync.Mutex
	started bool
	closed  bool
	reqs    chan func()
	quit    chan struct{} // closed by close
	done    chan struct{} // closed when the goroutine has returned
}

// start runs cmd.Start on the spawner's thread. It fails with errClosed
// once close has run.
func (s *threadSpawner) start(cmd *exec.Cmd) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	if !s.started {
		s.started = true
		s.reqs = make(chan func())
		s.quit = make(chan struct{})
		s.done = make(chan struct{})
		go s.serve()
	}
	reqs, done := s.reqs, s.done
	s.mu.Unlock()
	errc := make(chan error, 1)
	select {
	case reqs <- func() { errc <- cmd.Start() }:
	case <-done:
		return errClosed
	}
	return <-errc
}

func (s *threadSpawner) serve() {
	runtime.LockOSThread()
	// Unlocked rather than ended with the goroutine: see the type's doc.
	defer runtime.UnlockOSThread()
	defer close(s.done)
	for {
		select {
		case f := <-s.reqs:
			f()
		case <-s.quit:
			return
		}
	}
}

// close ends the spawner's goroutine once no start is under way. It is
// idempotent; the backend calls it from Close, after every fiber it
// resumed has ended.
func (s *threadSpawner) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	started := s.started
	s.mu.Unlock()
	if !started {
		return
	}
	close(s.quit)
	<-s.done
}

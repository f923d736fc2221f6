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
//
// A spawner with a setup function runs it on its thread before anything
// else, for a thread that must differ from the others (the shelf's mount
// namespace, shelf_linux.go); that thread is never handed back to the
// runtime, which ends it with the goroutine at close.
type threadSpawner struct {
	// setup, if set, prepares the thread; its error fails every start.
	setup func() error

	mu       sync.Mutex
	started  bool
	closed   bool
	reqs     chan func()
	quit     chan struct{} // closed by close
	done     chan struct{} // closed when the goroutine has returned
	ready    chan struct{} // closed once setup has run
	setupErr error         // setup's error; read after ready is closed
}

// start runs cmd.Start on the spawner's thread. It fails with errClosed
// once close has run, and with setup's error when that failed.
func (s *threadSpawner) start(cmd *exec.Cmd) error {
	reqs, done, err := s.serving()
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	select {
	case reqs <- func() { errc <- cmd.Start() }:
	case <-done:
		return errClosed
	}
	return <-errc
}

// serving starts the goroutine when it has not started yet and waits for
// its setup; it fails with errClosed once close has run, and with setup's
// error.
func (s *threadSpawner) serving() (chan func(), chan struct{}, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, errClosed
	}
	if !s.started {
		s.started = true
		s.reqs = make(chan func())
		s.quit = make(chan struct{})
		s.done = make(chan struct{})
		s.ready = make(chan struct{})
		go s.serve()
	}
	reqs, done, ready := s.reqs, s.done, s.ready
	s.mu.Unlock()
	<-ready
	if s.setupErr != nil {
		return nil, nil, s.setupErr
	}
	return reqs, done, nil
}

func (s *threadSpawner) serve() {
	runtime.LockOSThread()
	defer close(s.done)
	if s.setup != nil {
		// The thread is set apart for good: it ends with the goroutine.
		s.setupErr = s.setup()
		close(s.ready)
		if s.setupErr != nil {
			return
		}
	} else {
		// Unlocked rather than ended with the goroutine: see the type's doc.
		defer runtime.UnlockOSThread()
		close(s.ready)
	}
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

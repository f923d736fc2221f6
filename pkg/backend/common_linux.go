package backend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// common is what both backends share: configuration, the exit queue, and
// the wait group of every goroutine they start.
type common struct {
	cfg   Config
	log   logr.Logger
	exits *exitQueue
	iso   *sandbox
	wg    sync.WaitGroup
}

// init validates cfg, fills its defaults, finds the isolation the host
// allows (perFiber: see newSandbox) and starts the exit queue.
func (c *common) init(cfg Config, name string, perFiber bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c.cfg = cfg.withDefaults()
	c.log = c.cfg.Logger.WithName(name)
	if c.cfg.IDs == nil {
		ids, err := NewIDPool(DefaultIDFirst, DefaultIDCount)
		if err != nil {
			return err
		}
		c.cfg.IDs = ids
	}
	c.iso = newSandbox(c.cfg, c.log, perFiber)
	c.exits = newExitQueue()
	return nil
}

// Exits implements Backend.
func (c *common) Exits() <-chan Exit { return c.exits.out }

// Isolation implements Backend.
func (c *common) Isolation() IsolationSupport { return c.iso.support }

// shutdown is the shared half of Close: it runs every grant's stop under
// one KillTimeout, waits for every goroutine the backend started, closes
// Exits, and returns the stops' errors joined.
func (c *common) shutdown(stops []func(context.Context) error) error {
	ctx, cancel := core.WithTimeout(context.Background(), c.cfg.Clock, c.cfg.KillTimeout)
	var errs []error
	for _, stop := range stops {
		if err := stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	cancel()
	c.wg.Wait()
	c.iso.close()
	c.exits.close()
	return errors.Join(errs...)
}

// lookPath resolves a spec's command: an absolute path is used as is, a
// bare name is searched in path (Config.Path). It fails when nothing
// executable is found.
func lookPath(command, path string) (string, error) {
	if filepath.IsAbs(command) {
		if err := isExecutable(command); err != nil {
			return "", fmt.Errorf("command %s: %w", command, err)
		}
		return command, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, command)
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in PATH %s: %w", command, path, exec.ErrNotFound)
}

func isExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file: %w", p, fs.ErrPermission)
	}
	return nil
}

// prepare is what Warm does on both backends before anything starts: it
// makes the run directory, resolves the spec's command (lookPath) and opens
// the template's log, RunDir/<logName>, with the pipe its processes write
// to. It fails, leaving nothing open, when any of these fails.
func (c *common) prepare(req WarmRequest, logName string) (path string, lp *logPipe, err error) {
	if err := os.MkdirAll(req.RunDir, 0o700); err != nil {
		return "", nil, err
	}
	if path, err = lookPath(req.Spec.Command, c.cfg.Path); err != nil {
		return "", nil, err
	}
	if lp, err = openLogPipe(filepath.Join(req.RunDir, logName), c.cfg.LogMaxBytes); err != nil {
		return "", nil, err
	}
	return path, lp, nil
}

// workdir is the spec's workdir or the run directory.
func workdir(spec template.Spec, runDir string) string {
	if spec.Workdir != "" {
		return spec.Workdir
	}
	return runDir
}

// statusReason turns a reaped process's status into an ExitReason.
func statusReason(ps *os.ProcessState) ExitReason {
	if ps == nil {
		return ExitReason{Code: -1}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = fmt.Sprintf("SIG%d", int(ws.Signal()))
		}
		return ExitReason{Signal: name}
	}
	return ExitReason{Code: ps.ExitCode()}
}

// logTail returns the last lines of a log file for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return strings.TrimSpace(string(b))
}

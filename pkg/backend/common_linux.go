package backend

import (
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

	"fiberd.io/fiberd/pkg/template"
)

// common is what both backends share: configuration, the exit queue, and
// the wait group of every goroutine they start.
type common struct {
	cfg   Config
	log   logr.Logger
	exits *exitQueue
	wg    sync.WaitGroup
}

// init validates cfg, fills its defaults and starts the exit queue.
func (c *common) init(cfg Config, name string) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c.cfg = cfg.withDefaults()
	c.log = c.cfg.Logger.WithName(name)
	c.exits = newExitQueue()
	return nil
}

// Exits implements Backend.
func (c *common) Exits() <-chan Exit { return c.exits.out }

// errClosed is returned by calls after Close.
var errClosed = fmt.Errorf("backend closed: %w", ErrCold)

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

// isNotExist reports a cgroup or file that is already gone.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

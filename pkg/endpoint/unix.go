package endpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
)

// ListenUnix binds a unix stream socket at path, sets its mode to 0600 and
// returns the listener with its endpoint URL (UnixURL). path must be
// absolute and at most MaxUnixPath bytes. A socket file already at path is
// taken to be stale (left by an earlier fiberd) and removed first; anything
// else there, a regular file, a directory or a symlink, is refused and left
// alone.
//
// The mode is set right after bind, so the directory holding the socket
// should itself be private (fiberd's run directory is 0700). Closing the
// listener removes the socket file, so the runtime keeps its copy open for
// as long as the fiber is reachable. The runtime calls it for fibers of the
// unix family, and the agent for its own API socket.
func ListenUnix(path string) (net.Listener, string, error) {
	if err := checkUnixPath(path); err != nil {
		return nil, "", fmt.Errorf("unix socket %q: %w", path, err)
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().Type() == fs.ModeSocket:
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("unix socket %q: remove stale socket: %w", path, err)
		}
	case err == nil:
		return nil, "", fmt.Errorf("unix socket %q: path exists and is not a socket (%s)", path, fi.Mode().Type())
	case !errors.Is(err, fs.ErrNotExist):
		return nil, "", fmt.Errorf("unix socket %q: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, "", fmt.Errorf("unix socket %q: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, "", fmt.Errorf("unix socket %q: chmod 0600: %w", path, err)
	}
	return l, UnixURL(path), nil
}

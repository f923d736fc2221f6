package fiberd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The agent's directories are its own: New judges the state directory, the
// run directory and the API socket's directory before it reads, sweeps or
// binds anything there (checkPlace), and holds the state directory's lock
// (lockState) from before its sweep until Run ends or Close. Whoever else
// could write there could plant the records the sweep kills by, the
// revocations, the -dev issuer key, or a socket in place of the API's.

// lockFile is the state directory's lock, under private/.
const lockFile = "lock"

// place is a directory New judges: its path (absolute, clean), what it is
// and the flag that names it, for the messages.
type place struct {
	dir  string
	what string
	flag string
}

// places are the directories of cfg (after defaults) that New judges: the
// state directory, the run directory and the API socket's directory
// (unless Socket is "-"), each once.
func places(cfg Config) []place {
	ps := []place{{filepath.Clean(cfg.StateDir), "state directory", "-state"}}
	add := func(p place) {
		for _, q := range ps {
			if q.dir == p.dir {
				return
			}
		}
		ps = append(ps, p)
	}
	add(place{filepath.Clean(cfg.RunDir), "run directory", "-run-dir"})
	if cfg.Socket != "-" {
		add(place{filepath.Dir(filepath.Clean(cfg.Socket)), "API socket's directory", "-socket"})
	}
	return ps
}

// checkPlace judges p.dir for fiberd running as effective uid euid. It
// passes when:
//
//   - p.dir is a directory owned by euid and writable by neither its group
//     nor others (a sticky bit does not help here);
//   - every directory above it, up to /, is owned by root or by euid and is
//     writable by neither group nor others unless its sticky bit is set (as
//     /tmp's is: nobody else may then remove or rename what fiberd made
//     there);
//   - a symbolic link, as p.dir or as any directory above it, is owned by
//     root or by euid, and what it leads to passes the same rules, the
//     directories above the target included.
//
// When p.dir does not exist and missingOK is set, the nearest directory
// above it that exists is judged as a parent instead: New then creates
// p.dir (0700) and judges it again. The error names the path at fault, says
// what is wrong with it and how to fix it; it wraps the stat's error when
// a path cannot be read.
func checkPlace(p place, euid int, missingOK bool) error {
	path, own := p.dir, true
	if missingOK {
		for {
			_, err := os.Lstat(path)
			if err == nil || !errors.Is(err, fs.ErrNotExist) || path == "/" {
				break
			}
			path, own = filepath.Dir(path), false
		}
	}
	linked, err := walkPlace(p, path, euid, own, false)
	if err != nil || !linked {
		return err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("fiberd: %s %s (%s): %w", p.what, p.dir, p.flag, err)
	}
	_, err = walkPlace(p, real, euid, own, true)
	return err
}

// walkPlace applies checkPlace's rules to path and each directory above it,
// top down: the rules of p.dir to path itself when own is set, a parent's
// otherwise. It reports whether it met a symbolic link; resolved says path
// was resolved already, so a link met now is one that appeared meanwhile.
func walkPlace(p place, path string, euid int, own, resolved bool) (linked bool, err error) {
	head := fmt.Sprintf("fiberd: %s %s (%s)", p.what, p.dir, p.flag)
	elems := strings.Split(strings.TrimPrefix(path, "/"), "/")
	cur := "/"
	for i := -1; i < len(elems); i++ {
		if i >= 0 {
			if elems[i] == "" {
				continue
			}
			cur = filepath.Join(cur, elems[i])
		}
		last := cur == path
		fi, err := os.Lstat(cur)
		if err != nil {
			return linked, fmt.Errorf("%s: %w", head, err)
		}
		// What is wrong is said of p.dir itself, or of the path at fault.
		subject := head
		if cur != p.dir {
			subject += ": " + cur
		}
		uid, known := fileUID(fi)
		trusted := !known || uid == 0 || uid == euid
		mode := fi.Mode()
		switch {
		case mode&fs.ModeSymlink != 0 && resolved:
			return linked, fmt.Errorf("%s became a symbolic link while fiberd checked it: start fiberd again, and find out who changes it", subject)
		case mode&fs.ModeSymlink != 0 && !trusted:
			return linked, fmt.Errorf("%s is a symbolic link owned by uid %d, neither root nor fiberd's uid %d, who could point it anywhere: replace it, or choose another %s", subject, uid, euid, p.flag)
		case mode&fs.ModeSymlink != 0:
			linked = true
		case !mode.IsDir():
			return linked, fmt.Errorf("%s is not a directory: choose another %s", subject, p.flag)
		case last && own && known && uid != euid:
			return linked, fmt.Errorf("%s is owned by uid %d, not by fiberd's uid %d: another user could plant what fiberd reads there or replace its sockets; remove it (fiberd creates it itself) or chown it to uid %d, or choose another %s", subject, uid, euid, euid, p.flag)
		case last && own && mode.Perm()&0o022 != 0:
			return linked, fmt.Errorf("%s has mode %s, writable by group or others: chmod go-w %s, or choose another %s", subject, modeString(mode), cur, p.flag)
		case !trusted:
			return linked, fmt.Errorf("%s: its parent %s is owned by uid %d, neither root nor fiberd's uid %d, who could replace what lies below it: choose another %s, below directories only root or uid %d can write", head, cur, uid, euid, p.flag, euid)
		case mode.Perm()&0o022 != 0 && mode&fs.ModeSticky == 0 && !podVolume(fi, euid):
			return linked, fmt.Errorf("%s: its parent %s has mode %s, writable by group or others without the sticky bit, who could replace what lies below it: chmod go-w (or +t) %s, or choose another %s", head, cur, modeString(mode), cur, p.flag)
		}
	}
	return linked, nil
}

// podVolumeGID is fiberd's effective gid, for podVolume; a variable so
// the tests can say which gid fiberd has.
var podVolumeGID = os.Getegid

// podVolume reports whether fi, a directory above a place, is a grant
// Pod's own volume as the kubelet makes it under the Pod's fsGroup: owned
// by root, its group fiberd's effective gid, set-group-id, writable by all
// (an emptyDir is 0777), for a fiberd that does not run as root. Only the
// Pod's containers reach such a volume, and fiberd is the grant Pod's one
// container, so those who could write in it are fiberd and the fibers it
// starts; unisolated, they run as fiberd's own user, who may write its
// state anyway (docs/security.md says what isolation in a Pod will need).
// Such a parent is accepted although it has no sticky bit: the kubelet
// cannot be told to set one.
func podVolume(fi fs.FileInfo, euid int) bool {
	uid, known := fileUID(fi)
	gid, gknown := fileGID(fi)
	return euid != 0 && known && gknown && uid == 0 && gid == podVolumeGID() && fi.Mode()&fs.ModeSetgid != 0
}

// modeString is mode's permission bits in octal, the sticky bit included.
func modeString(mode fs.FileMode) string {
	m := uint32(mode.Perm())
	if mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	if mode&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if mode&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	return fmt.Sprintf("%04o", m)
}

// CheckStateDir judges dir as New judges its StateDir before anything is
// read or written there (see New: dir and every directory above it belong
// to fiberd's effective uid or root, and nobody else can write in them),
// and fails with ErrStateInUse when an agent holds it. A dir that does not
// exist yet passes when the nearest directory above it that exists does.
// cmd/fiberd -dev calls it on a -state it was given before it reads or
// writes its issuer key and grants there; New judges again, and takes the
// lock, itself. Its probe of the lock holds it for a moment, shared: an
// agent starting on dir at that moment fails as if dir were in use.
func CheckStateDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("fiberd: state directory %q is not an absolute path: set -state to one", dir)
	}
	if err := checkPlace(place{filepath.Clean(dir), "state directory", "-state"}, os.Geteuid(), true); err != nil {
		return err
	}
	return probeState(filepath.Clean(dir))
}

// inUseError is New's error when another process holds the state
// directory's lock.
type inUseError struct {
	dir  string
	pid  int    // what the holder wrote in the lock file; 0 when nothing yet
	comm string // /proc/<pid>/comm, "" when unknown
}

func (e *inUseError) Error() string {
	who := "another process"
	if e.pid > 0 {
		who = "process " + strconv.Itoa(e.pid)
		if e.comm != "" {
			who += " (" + e.comm + ")"
		}
	}
	return "fiberd: state directory " + e.dir + " is in use by " + who + "; stop it or choose another -state"
}

func (e *inUseError) Unwrap() error { return ErrStateInUse }

// inUse is the error for dir whose lock file f another process holds: it
// names the pid the holder wrote there, and its command.
func inUse(dir string, f *os.File) error {
	e := &inUseError{dir: dir}
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n]))); err == nil && pid > 0 {
		e.pid = pid
		if c, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); err == nil {
			e.comm = strings.TrimSpace(string(c))
		}
	}
	return e
}

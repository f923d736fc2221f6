package procrec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"fiberd.io/fiberd/pkg/core"
)

// Dir is a directory of records. Open makes one; the zero Dir and a nil
// *Dir record nothing, so callers need no check. A Dir is safe for
// concurrent use: every record is a file of its own.
type Dir struct {
	path string
}

// Open returns the records directory at path, creating it (0700) when
// missing. It fails when the directory cannot be made.
func Open(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("process records %s: %w", path, err)
	}
	return &Dir{path: path}, nil
}

// Path is the directory.
func (d *Dir) Path() string {
	if d == nil {
		return ""
	}
	return d.path
}

// Record is one record; the zero Record is none, and removing it does
// nothing.
type Record struct {
	path string
}

// Remove deletes the record. A record already gone is not an error.
func (r Record) Remove() error {
	if r.path == "" {
		return nil
	}
	if err := os.Remove(r.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// AddProcess records process pid, whose start time (see StartTime) is
// start. On a nil Dir it records nothing and returns the zero Record.
func (d *Dir) AddProcess(pid int, start uint64) (Record, error) {
	if d == nil {
		return Record{}, nil
	}
	p := filepath.Join(d.path, "p-"+strconv.Itoa(pid)+"-"+strconv.FormatUint(start, 10))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return Record{}, fmt.Errorf("process record: %w", err)
	}
	if err := f.Close(); err != nil {
		return Record{}, fmt.Errorf("process record: %w", err)
	}
	return Record{path: p}, nil
}

// AddRestoring records a process that does not exist yet: the one a
// restore (CRIU) started at start time after (clock ticks after boot, as
// Stat.Start) will bring back at pid, leading its own session. Sweep ends
// the process at pid when it leads its own session and started at or
// after after, and the members of that session started at or after it.
// The caller replaces it with AddProcess once the restore is done, and
// removes it either way: it names no one process for good, so it must not
// outlive the restore. On a nil Dir it records nothing.
func (d *Dir) AddRestoring(pid int, after uint64) (Record, error) {
	if d == nil {
		return Record{}, nil
	}
	p := filepath.Join(d.path, "r-"+strconv.Itoa(pid)+"-"+strconv.FormatUint(after, 10))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return Record{}, fmt.Errorf("restore record: %w", err)
	}
	if err := f.Close(); err != nil {
		return Record{}, fmt.Errorf("restore record: %w", err)
	}
	return Record{path: p}, nil
}

// AddCgroup records the cgroup directory dir under name (a grant UID: a
// single path element). On a nil Dir it records nothing.
func (d *Dir) AddCgroup(name, dir string) (Record, error) {
	if d == nil {
		return Record{}, nil
	}
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return Record{}, fmt.Errorf("cgroup record %q: not a file name: %w", name, core.ErrInvalid)
	}
	if !filepath.IsAbs(dir) {
		return Record{}, fmt.Errorf("cgroup record %q: %q is not absolute: %w", name, dir, core.ErrInvalid)
	}
	p := filepath.Join(d.path, "c-"+name)
	if err := core.WriteFileAtomic(p, []byte(dir+"\n"), 0o600); err != nil {
		return Record{}, fmt.Errorf("cgroup record: %w", err)
	}
	return Record{path: p}, nil
}

package procrec

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// Stat is what Sweep and the backends read of a process in
// /proc/<pid>/stat.
type Stat struct {
	// PPid is the parent's pid (field 4).
	PPid int
	// Session is the session id (field 6): the pid of the session's
	// leader.
	Session int
	// Start is the start time in clock ticks after boot (field 22): with
	// the pid, it names the process for good.
	Start uint64
	// Zombie is set when the process has ended and waits to be reaped
	// (state Z, field 3).
	Zombie bool
}

// ReadStat reads /proc/<pid>/stat. It fails when the process is gone or
// the file is malformed.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(b)
}

// ParseStat parses the content of a /proc/<pid>/stat file.
func ParseStat(b []byte) (Stat, error) {
	// "pid (comm) state ppid pgrp session ...": comm may hold spaces and
	// parentheses, so the fields are counted from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc stat: no command field")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("/proc stat: %d fields after the command, want at least 20", len(f))
	}
	var st Stat
	var err error
	if st.PPid, err = strconv.Atoi(string(f[1])); err != nil {
		return Stat{}, fmt.Errorf("/proc stat: ppid: %w", err)
	}
	if st.Session, err = strconv.Atoi(string(f[3])); err != nil {
		return Stat{}, fmt.Errorf("/proc stat: session: %w", err)
	}
	if st.Start, err = strconv.ParseUint(string(f[19]), 10, 64); err != nil {
		return Stat{}, fmt.Errorf("/proc stat: starttime: %w", err)
	}
	st.Zombie = string(f[0]) == "Z"
	return st, nil
}

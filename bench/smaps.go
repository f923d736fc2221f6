package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ParsePss reads the "Pss:" line of a /proc/<pid>/smaps_rollup document and
// returns it in KiB. It fails when the line is missing or malformed.
func ParsePss(doc []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "Pss:" {
			continue
		}
		if len(f) != 3 || f[2] != "kB" {
			return 0, fmt.Errorf("smaps_rollup: malformed Pss line %q", sc.Text())
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("smaps_rollup: malformed Pss line %q", sc.Text())
		}
		return v, nil
	}
	return 0, fmt.Errorf("smaps_rollup: no Pss line")
}

// PssKiB is the proportional set size of process pid, in KiB.
func PssKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	v, err := ParsePss(b)
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return v, nil
}

// ParsePPid reads the parent PID from a /proc/<pid>/stat document, whose
// second field (the command) may hold spaces and parentheses.
func ParsePPid(stat []byte) (int, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no command field")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("stat: too few fields")
	}
	return strconv.Atoi(f[1])
}

// PPid is the parent PID of process pid.
func PPid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParsePPid(b)
}

package main

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// readMachine reads the machine facts from /proc.
func readMachine() Machine {
	m := Machine{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), LoadStart: loadAvg()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.MemTotalMiB = memTotalKiB() / 1024
	m.CPU = cpuModel()
	if f := strings.Fields(m.LoadStart); len(f) > 0 && m.NProc > 0 {
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			m.LoadPerCPU = v / float64(m.NProc)
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func memTotalKiB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "MemTotal:" {
			v, _ := strconv.ParseInt(fs[1], 10, 64)
			return v
		}
	}
	return 0
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

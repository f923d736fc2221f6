package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PodUIDOfCgroup is the UID of the Pod whose cgroup a /proc/<pid>/cgroup
// document names, "" when it names none. The kubelet's cgroupfs driver
// names a Pod's cgroup pod<UID> (.../kubepods/besteffort/pod<UID>/<ctr>);
// the systemd driver kubepods-<qos>-pod<UID with _ for ->.slice.
func PodUIDOfCgroup(doc string) string {
	for line := range strings.SplitSeq(doc, "\n") {
		_, path, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		_, path, _ = strings.Cut(path, ":")
		for seg := range strings.SplitSeq(path, "/") {
			i := strings.LastIndex(seg, "pod")
			if i < 0 {
				continue
			}
			uid := strings.TrimSuffix(seg[i+3:], ".slice")
			uid = strings.ReplaceAll(uid, "_", "-")
			if len(uid) == 36 && strings.Count(uid, "-") == 4 {
				return uid
			}
		}
	}
	return ""
}

// hostProc is a process of the machine as the node comparison reads it.
type hostProc struct {
	pid     int
	exe     string // base name of /proc/<pid>/exe
	cmdline string
	podUID  string
}

// hostProcs lists the machine's live processes with the Pod each runs in.
func hostProcs() ([]hostProc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []hostProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			continue // a kernel thread, a zombie or gone
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, hostProc{pid: pid, exe: filepath.Base(strings.TrimSuffix(exe, " (deleted)")),
			cmdline: strings.ReplaceAll(string(cl), "\x00", " "), podUID: PodUIDOfCgroup(string(cg))})
	}
	return out, nil
}

// PodPss is the proportional set size of one Pod's processes, in KiB.
type PodPss struct {
	// Worker is every process in the Pod's cgroup but the pause process.
	Worker int64
	// Pause is the sandbox's pause process, Shim its parent (containerd's
	// runc shim, one per Pod).
	Pause, Shim int64
	Procs       int
}

// podPss reads the Pss of the processes of each Pod of uids. A Pod with no
// process, or no pause process, is an error: its workers are not running.
func podPss(uids []string) (map[string]PodPss, error) {
	procs, err := hostProcs()
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, u := range uids {
		want[u] = true
	}
	out := map[string]PodPss{}
	pause := map[string]int{}
	for _, p := range procs {
		if !want[p.podUID] {
			continue
		}
		v, err := PssKiB(p.pid)
		if err != nil {
			continue // ended meanwhile
		}
		m := out[p.podUID]
		m.Procs++
		if p.exe == "pause" {
			m.Pause += v
			pause[p.podUID] = p.pid
		} else {
			m.Worker += v
		}
		out[p.podUID] = m
	}
	for _, u := range uids {
		pid, ok := pause[u]
		if !ok {
			return nil, fmt.Errorf("Pod %s: no pause process among the machine's processes", u)
		}
		shim, err := PPid(pid)
		if err != nil {
			return nil, fmt.Errorf("Pod %s: the pause process's parent: %w", u, err)
		}
		v, err := PssKiB(shim)
		if err != nil {
			return nil, fmt.Errorf("Pod %s: its shim: %w", u, err)
		}
		m := out[u]
		m.Shim = v
		out[u] = m
	}
	return out, nil
}

// nodeDaemonsPss is the summed Pss of the node's kubelet and containerd:
// the processes of those names whose command line names the node's
// directory dir.
func nodeDaemonsPss(dir string) (int64, error) {
	procs, err := hostProcs()
	if err != nil {
		return 0, err
	}
	var sum int64
	found := map[string]bool{}
	for _, p := range procs {
		if (p.exe == "kubelet" || p.exe == "containerd") && strings.Contains(p.cmdline, dir) {
			v, err := PssKiB(p.pid)
			if err != nil {
				return 0, err
			}
			sum += v
			found[p.exe] = true
		}
	}
	if !found["kubelet"] || !found["containerd"] {
		return 0, fmt.Errorf("no kubelet and containerd of the node in %s among the machine's processes (found %v)", dir, found)
	}
	return sum, nil
}

package kubenode

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// HostState is what a node could leave on the machine outside its
// directory, read at one moment: processes, mount points, network
// interfaces, nftables tables, cgroups, files in the places a kubelet,
// containerd or CNI write to, and the kernel settings a node changes.
type HostState struct {
	procs   map[string]proc // by "pid/starttime", so a recycled pid is another process
	mounts  map[string]bool
	links   map[string]bool
	tables  map[string]bool
	cgroups map[string]bool
	files   map[string]bool
	sysctls map[string]string
}

type proc struct {
	pid     int
	zombie  bool
	exe     string
	cmdline string
	root    string
	cgroup  string
}

// FileRoots are the trees HostState lists files of: where kubelet,
// containerd, runc, CNI plugins and kube-proxy put files by default.
var FileRoots = []string{"/etc", "/opt", "/run", "/usr/libexec", "/var/lib", "/var/log"}

// skipFiles are subtrees of FileRoots that change on their own (logs and
// databases of the machine's services, package managers).
var skipFiles = []string{"/run/systemd", "/run/user", "/run/postgresql", "/run/lock", "/var/lib/apt", "/var/lib/dpkg",
	"/var/lib/systemd", "/var/lib/postgresql", "/var/lib/PackageKit", "/var/log/journal", "/var/log/postgresql",
	"/var/log/apt", "/var/lib/ucf", "/var/lib/man-db", "/var/lib/private"}

// Sysctls are the kernel settings a node changes (node-up.sh puts them
// back).
var Sysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet"}

// nodePrograms are the programs only a node runs here.
var nodePrograms = []string{"kubelet", "containerd", "containerd-shim-runc-v2", "runc", "kube-proxy", "coredns",
	"kube-scheduler", "kube-controller-manager", "pause"}

// ReadHost reads the machine's state. It fails only when /proc cannot be
// read; a tree that vanishes while it is walked is skipped.
func ReadHost() (HostState, error) {
	h := HostState{procs: map[string]proc{}, mounts: map[string]bool{}, links: map[string]bool{}, tables: map[string]bool{},
		cgroups: map[string]bool{}, files: map[string]bool{}, sysctls: map[string]string{}}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return h, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 20 {
			continue
		}
		p := proc{pid: pid, zombie: f[0] == "Z"}
		p.exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		p.cmdline = strings.TrimSpace(string(bytes.ReplaceAll(cl, []byte{0}, []byte{' '})))
		p.root, _ = os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		p.cgroup = string(cg)
		h.procs[e.Name()+"/"+f[19]] = p
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(line); len(f) > 4 {
				h.mounts[f[4]] = true
			}
		}
	}
	if ls, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, l := range ls {
			h.links[l.Name()] = true
		}
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if t := strings.TrimSpace(strings.TrimPrefix(line, "table ")); t != "" {
				h.tables[t] = true
			}
		}
	}
	for _, m := range cgroupMounts() {
		_ = filepath.WalkDir(m, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				h.cgroups[p] = true
			}
			return nil
		})
	}
	for _, r := range FileRoots {
		_ = filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && slices.Contains(skipFiles, p) {
				return filepath.SkipDir
			}
			h.files[p] = true
			return nil
		})
	}
	for _, s := range Sysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			h.sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	return h, nil
}

// cgroupMounts are the mount points of every cgroup hierarchy.
func cgroupMounts() []string {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(mi))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if fs := strings.Fields(post); len(fs) > 0 && (fs[0] == "cgroup" || fs[0] == "cgroup2") {
			if f := strings.Fields(pre); len(f) > 4 {
				out = append(out, f[4])
			}
		}
	}
	return out
}

// Leftovers lists what after has that before had not and that is the
// node's: the node whose directory is dir and whose name is name. Things
// other users of the machine create meanwhile are told apart as follows.
//   - processes: alive (zombies awaiting their reaper are not counted),
//     new, and the node's: their command line or root names dir, their
//     cgroup lies under /name, or they run a program only a node runs here
//     (nodePrograms);
//   - mount points: new, or under dir;
//   - network interfaces and nftables tables: new;
//   - cgroups: new directories whose path holds name or "kubepods";
//   - files: new paths under FileRoots (skipFiles excepted);
//   - kernel settings: changed.
func Leftovers(before, after HostState, dir, name string) []string {
	var out []string
	for k, p := range after.procs {
		if _, ok := before.procs[k]; ok || p.zombie {
			continue
		}
		ours := strings.Contains(p.cmdline, dir) || strings.HasPrefix(p.root, dir) ||
			strings.Contains(p.cgroup, ":/"+name+"/") || strings.Contains(p.cgroup, ":/"+name+"\n") ||
			slices.Contains(nodePrograms, filepath.Base(strings.TrimSuffix(p.exe, " (deleted)")))
		if ours {
			out = append(out, fmt.Sprintf("process %d (%s) %q", p.pid, p.exe, p.cmdline))
		}
	}
	for m := range after.mounts {
		if !before.mounts[m] || strings.HasPrefix(m, dir+"/") {
			out = append(out, "mount "+m)
		}
	}
	for l := range after.links {
		if !before.links[l] {
			out = append(out, "network interface "+l)
		}
	}
	for t := range after.tables {
		if !before.tables[t] {
			out = append(out, "nftables table "+t)
		}
	}
	for c := range after.cgroups {
		if !before.cgroups[c] && (strings.Contains(c, "/"+name) || strings.Contains(c, "kubepods")) {
			out = append(out, "cgroup "+c)
		}
	}
	for f := range after.files {
		if !before.files[f] {
			out = append(out, "file "+f)
		}
	}
	for s, v := range after.sysctls {
		if b, ok := before.sysctls[s]; ok && b != v {
			out = append(out, fmt.Sprintf("kernel setting %s is %s, was %s", s, v, b))
		}
	}
	slices.Sort(out)
	return out
}

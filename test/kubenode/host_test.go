package kubenode

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func state() HostState {
	return HostState{procs: map[string]proc{}, mounts: map[string]bool{}, links: map[string]bool{}, tables: map[string]bool{},
		cgroups: map[string]bool{}, files: map[string]bool{}, sysctls: map[string]string{}}
}

// Leftovers names what the node left, and only that: what was there before, what other users of
// the machine made meanwhile, and zombies awaiting their reaper are not the node's.
func TestLeftovers(t *testing.T) {
	const dir, name = "/tmp/node-123", "fiberd-node"
	before, after := state(), state()
	for _, h := range []HostState{before, after} {
		h.procs["1/10"] = proc{pid: 1, exe: "/sbin/init"}
		h.mounts["/proc"] = true
		h.links["eth0"] = true
		h.tables["ip filter"] = true
		h.cgroups["/sys/fs/cgroup/memory/user.slice"] = true
		h.files["/var/lib/dpkg"] = true
	}
	before.sysctls["net/ipv4/ip_forward"] = "0"
	after.sysctls["net/ipv4/ip_forward"] = "1"
	after.procs["200/5"] = proc{pid: 200, exe: "/usr/bin/containerd-shim-runc-v2", cmdline: "containerd-shim-runc-v2 -address /x"}
	after.procs["201/5"] = proc{pid: 201, exe: "/opt/fiberd/templates/counter", root: dir + "/containerd/state/x/rootfs"}
	after.procs["202/5"] = proc{pid: 202, exe: "/usr/local/bin/fiberd", cgroup: "4:memory:/" + name + "/kubepods/pod1/c1\n"}
	after.procs["203/5"] = proc{pid: 203, exe: "/usr/bin/bash", cmdline: "bash -c watch " + dir + "/"}
	after.procs["204/5"] = proc{pid: 204, exe: "/usr/bin/kubelet", zombie: true}                // awaiting its reaper
	after.procs["205/5"] = proc{pid: 205, exe: "/usr/local/bin/fiberd", cmdline: "fiberd -dev"} // another user's
	after.mounts[dir+"/kubelet"] = true
	after.mounts["/mnt/other"] = true
	after.links["fiberd0"] = true
	after.tables["ip kube-proxy"] = true
	after.cgroups["/sys/fs/cgroup/memory/"+name] = true
	after.cgroups["/sys/fs/cgroup/cpu/kubepods"] = true
	after.cgroups["/sys/fs/cgroup/unified/fiberd-e2e/TestX"] = true // another test's
	after.files["/var/lib/kubelet/device-plugins/kubelet.sock"] = true

	got := Leftovers(before, after, dir, name)
	want := []string{
		"cgroup /sys/fs/cgroup/cpu/kubepods",
		"cgroup /sys/fs/cgroup/memory/" + name,
		"file /var/lib/kubelet/device-plugins/kubelet.sock",
		"kernel setting net/ipv4/ip_forward is 1, was 0",
		"mount " + dir + "/kubelet",
		"mount /mnt/other",
		"network interface fiberd0",
		"nftables table ip kube-proxy",
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("Leftovers lacks %q", w)
		}
	}
	for _, pid := range []string{"process 200 ", "process 201 ", "process 202 ", "process 203 "} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, pid) }) {
			t.Errorf("Leftovers lacks %s: %q", pid, got)
		}
	}
	if len(got) != len(want)+4 {
		t.Errorf("Leftovers = %q, want exactly the node's %d things", got, len(want)+4)
	}
	if l := Leftovers(before, before, dir, name); len(l) != 0 {
		t.Errorf("Leftovers of an unchanged machine = %q", l)
	}
}

// ReadHost sees this process's machine: itself excluded, its parent, its mounts, its cgroups.
func TestReadHost(t *testing.T) {
	h, err := ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	if !h.mounts["/proc"] || len(h.links) == 0 || len(h.files) == 0 || len(h.sysctls) == 0 {
		t.Errorf("ReadHost saw mounts %d (/proc %v), links %d, files %d, sysctls %d", len(h.mounts), h.mounts["/proc"], len(h.links), len(h.files), len(h.sysctls))
	}
	ppid := os.Getppid()
	found := false
	for _, p := range h.procs {
		if p.pid == os.Getpid() {
			t.Error("ReadHost lists the process that reads")
		}
		found = found || p.pid == ppid
	}
	if !found {
		t.Errorf("ReadHost misses the parent process %d", ppid)
	}
}

package kubenode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of Options, node-up.sh's own.
const (
	DefaultName   = "fiberd-node"
	DefaultCIDR   = "10.244.0.0/24"
	DefaultBridge = "fiberd0"
	// DefaultAddress is the default node's address, its CIDR's .1: give it
	// to the control plane (test/kubeapi Options.NodeAddress) the primary
	// node joins.
	DefaultAddress = "10.244.0.1"
)

// scriptTimeout bounds one run of node-up.sh: a start takes a few seconds,
// a stop of a node with Pods about ten.
const scriptTimeout = 3 * time.Minute

// Options shapes a node. The zero value is the default primary node.
type Options struct {
	// Name is the Node's name and its cgroup root. Empty means DefaultName.
	Name string
	// CIDR is the node's Pod network, an IPv4 /24; the node's address is
	// its .1. Empty means DefaultCIDR.
	CIDR string
	// Bridge is the bridge's name, at most 15 characters. Empty means
	// DefaultBridge.
	Bridge string
	// Secondary leaves kube-scheduler, kube-controller-manager and
	// kube-proxy to the control plane's primary node (one per machine).
	// Default false: this node runs them.
	Secondary bool
	// Images is a directory with pause.tar (BuildImages). Empty means
	// node-up.sh builds the images into the node's directory.
	Images string
}

// Node is a running node. Its methods are safe for concurrent use.
type Node struct {
	dir    string
	script string
	bin    string
	name   string
	ip     string

	mu     sync.Mutex
	closed bool
}

// Root is the checkout's root: $FIBERD_ROOT, else the nearest directory
// from the working directory up that holds hack/node-up.sh.
func Root() (string, error) {
	if r := os.Getenv("FIBERD_ROOT"); r != "" {
		return filepath.Abs(r)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "hack", "node-up.sh")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no hack/node-up.sh in %s or above; set FIBERD_ROOT to the checkout", wd)
		}
	}
}

// Binaries is where the node's binaries are: $FIBERD_NODE_BIN, else
// $FIBERD_KUBE_BIN, else ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin.
func Binaries() string {
	for _, v := range []string{"FIBERD_NODE_BIN", "FIBERD_KUBE_BIN"} {
		if d := os.Getenv(v); d != "" {
			return d
		}
	}
	cache := os.Getenv("FIBERD_KUBE_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache", "fiberd", "kube")
	}
	return filepath.Join(cache, "bin")
}

// RuntimeBinaries is where the node's container runtime is (hack/node-up.sh's
// FIBERD_NODE_RUNTIME): $FIBERD_NODE_RUNTIME, else
// ${FIBERD_RUNTIME_CACHE:-$HOME/.cache/fiberd/runtime}/bin.
func RuntimeBinaries() string {
	if d := os.Getenv("FIBERD_NODE_RUNTIME"); d != "" {
		return d
	}
	cache := os.Getenv("FIBERD_RUNTIME_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache", "fiberd", "runtime")
	}
	return filepath.Join(cache, "bin")
}

// Missing says what this machine lacks to run a node, and how to get it;
// nil when nothing is missing.
func Missing() error {
	var miss []string
	if os.Geteuid() != 0 {
		miss = append(miss, "root (containerd, runc, the bridge, cgroups and mounts need it)")
	}
	bin := Binaries()
	var tools []string
	for _, t := range []string{"kube-apiserver", "etcd", "kubectl", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-proxy", "coredns"} {
		if fi, err := os.Stat(filepath.Join(bin, t)); err != nil || fi.Mode()&0o111 == 0 {
			tools = append(tools, t)
		}
	}
	if len(tools) > 0 {
		miss = append(miss, fmt.Sprintf("%s in %s (`make node-tools`)", strings.Join(tools, ", "), bin))
	}
	// The grant Pod runs in a user namespace of its own (hostUsers: false), which Debian's
	// containerd 1.6 cannot give: hack/runtime.sh's containerd 2.x and runc 1.5 run the node.
	rt := RuntimeBinaries()
	var rts []string
	for _, t := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
		if rt == "system" {
			break // Debian's, below
		}
		if fi, err := os.Stat(filepath.Join(rt, t)); err != nil || fi.Mode()&0o111 == 0 {
			rts = append(rts, t)
		}
	}
	if len(rts) > 0 {
		miss = append(miss, fmt.Sprintf("%s in %s (`make node-tools`: hack/runtime.sh)", strings.Join(rts, ", "), rt))
	}
	var pkgs []string
	for _, p := range []struct{ file, pkg string }{
		{"/usr/bin/containerd", "containerd"}, {"/usr/sbin/runc", "runc"}, {"/usr/lib/cni/bridge", "containernetworking-plugins"},
		{"/usr/sbin/nft", "nftables"}, {"/usr/bin/ip", "iproute2"}, {"/usr/bin/openssl", "openssl"},
	} {
		if _, err := exec.LookPath(filepath.Base(p.file)); err != nil {
			if _, err := os.Stat(p.file); err != nil {
				pkgs = append(pkgs, p.pkg)
			}
		}
	}
	if len(pkgs) > 0 {
		miss = append(miss, "the Debian packages "+strings.Join(pkgs, " ")+" (apt-get install)")
	}
	if len(miss) == 0 {
		return nil
	}
	return fmt.Errorf("a node needs %s", strings.Join(miss, "; "))
}

// Start starts a node joined to the control plane in kubeDir (a kube-up.sh
// directory started for nodes) and returns once the Node is Ready. Its
// directory is a fresh one under os.TempDir (short: containerd's socket
// path must stay under 100 bytes). A failed start leaves nothing running.
func Start(ctx context.Context, kubeDir string, o Options) (*Node, error) {
	if err := Missing(); err != nil {
		return nil, err
	}
	root, err := Root()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "node-")
	if err != nil {
		return nil, err
	}
	n := &Node{dir: dir, script: filepath.Join(root, "hack", "node-up.sh"), bin: Binaries()}
	env := []string{"FIBERD_NODE_BIN=" + n.bin, "FIBERD_NODE_WATCH_PID=" + strconv.Itoa(os.Getpid())}
	for k, v := range map[string]string{"FIBERD_NODE_NAME": o.Name, "FIBERD_NODE_CIDR": o.CIDR, "FIBERD_NODE_BRIDGE": o.Bridge, "FIBERD_NODE_IMAGES": o.Images} {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	if o.Secondary {
		env = append(env, "FIBERD_NODE_PRIMARY=0")
	}
	out, err := n.run(ctx, env, "start", kubeDir, dir)
	if err != nil {
		_, cerr := n.run(context.Background(), nil, "clean", dir)
		return nil, errors.Join(err, cerr)
	}
	n.name = strings.TrimSpace(out)
	cidr := o.CIDR
	if cidr == "" {
		cidr = DefaultCIDR
	}
	n.ip = strings.TrimSuffix(cidr, ".0/24") + ".1"
	return n, nil
}

// Dir is the node's state directory: its logs (kubelet.log,
// containerd.log, ...), the kubelet's root directory kubelet/.
func (n *Node) Dir() string { return n.dir }

// Name is the Node's name.
func (n *Node) Name() string { return n.name }

// IP is the node's address, on its bridge.
func (n *Node) IP() string { return n.ip }

// Bin is the directory of the node's binaries, kubectl among them.
func (n *Node) Bin() string { return n.bin }

// Import imports image tarballs into the node's containerd.
func (n *Node) Import(ctx context.Context, tars ...string) error {
	_, err := n.run(ctx, nil, append([]string{"import", n.dir}, tars...)...)
	return err
}

// Status is node-up.sh status: the node's processes.
func (n *Node) Status(ctx context.Context) (string, error) {
	return n.run(ctx, nil, "status", n.dir)
}

// Close stops the node, Pods still running included, and removes its
// directory. It is idempotent.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	_, err := n.run(context.Background(), nil, "clean", n.dir)
	return err
}

// run runs node-up.sh with args and returns its stdout.
func (n *Node) run(ctx context.Context, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.script, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("node-up.sh %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// BuildImages runs hack/images.sh into out and returns each image's
// reference and digest, as digests.txt lists them.
func BuildImages(ctx context.Context, out string) (map[string]string, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "images.sh"), out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("hack/images.sh: %w\n%s", err, strings.TrimSpace(stderr.String()))
	}
	f, err := os.Open(filepath.Join(out, "digests.txt"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	digests := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if ref, d, ok := strings.Cut(sc.Text(), " "); ok {
			digests[ref] = d
		}
	}
	return digests, sc.Err()
}

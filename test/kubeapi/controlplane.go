package kubeapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultRuntimeConfig is the kube-apiserver --runtime-config a control plane gets when
// Options.RuntimeConfig is empty: the resource.k8s.io/v1 API served.
const DefaultRuntimeConfig = "resource.k8s.io/v1=true"

// scriptTimeout bounds one run of kube-up.sh. Start takes about 3 s and a graceful stop about 3 s
// on an idle machine; the margin covers a loaded CI machine.
const scriptTimeout = 2 * time.Minute

// Options shapes a control plane. The zero value is the default control plane.
type Options struct {
	// RuntimeConfig is kube-apiserver's --runtime-config, which API groups and versions are
	// served. Empty means DefaultRuntimeConfig. "resource.k8s.io/v1=false" switches the
	// resource.k8s.io group off (its beta versions are off by default);
	// "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true" serves v1beta2 only.
	RuntimeConfig string
	// APIServerArgs are more kube-apiserver flags, each "--name=value". Empty means none. A flag
	// holding white space is refused by Start and Restart, since kube-up.sh splits them on it.
	APIServerArgs []string
	// NodeAddress, when set, makes a control plane real nodes join (hack/node-up.sh, test/kubenode):
	// the address of the first node, which the API server advertises for the "kubernetes"
	// Service; it then listens on every address, authorizes with Node and RBAC, and admits with
	// NodeRestriction and ServiceAccount (kube-up.sh's FIBERD_KUBE_NODE_ADDRESS). Empty means a
	// control plane on loopback alone, without ServiceAccount admission.
	NodeAddress string
}

func (o Options) validate() error {
	for _, a := range o.APIServerArgs {
		if a == "" || strings.ContainsAny(a, " \t\n") {
			return fmt.Errorf("kubeapi: Options.APIServerArgs: %q is empty or holds white space; pass one \"--name=value\" per element", a)
		}
	}
	if o.NodeAddress != "" && net.ParseIP(o.NodeAddress).To4() == nil {
		return fmt.Errorf("kubeapi: Options.NodeAddress %q is not an IPv4 address; give the node's, e.g. 10.244.0.1", o.NodeAddress)
	}
	if strings.ContainsAny(o.RuntimeConfig, " \t\n") {
		return fmt.Errorf("kubeapi: Options.RuntimeConfig %q holds white space; separate entries with commas", o.RuntimeConfig)
	}
	return nil
}

func (o Options) env() []string {
	rc := o.RuntimeConfig
	if rc == "" {
		rc = DefaultRuntimeConfig
	}
	return []string{
		"FIBERD_KUBE_RUNTIME_CONFIG=" + rc,
		"FIBERD_KUBE_APISERVER_ARGS=" + strings.Join(o.APIServerArgs, " "),
		"FIBERD_KUBE_NODE_ADDRESS=" + o.NodeAddress,
	}
}

// ControlPlane is one etcd and one kube-apiserver run by kube-up.sh, with their state in Dir. Its
// methods are safe for concurrent use; Stop and Restart are meant for tests that own the control
// plane (from Start), never for the shared one, which other tests are using.
type ControlPlane struct {
	dir    string
	script string
	bin    string

	mu      sync.Mutex
	opts    Options
	running bool
	closed  bool
	cfg     *rest.Config
	client  kubernetes.Interface
}

// Start starts a control plane for t alone and removes it (processes and directory) in
// t.Cleanup. It takes about 3 s and 350 MB of memory; tests that only need an API server use
// Shared or NewEnv instead. It skips t when the binaries are missing (see the package
// documentation) and fails t when the control plane does not become ready.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	bin, script := requireTools(t)
	cp, err := launch(bin, script, opts)
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Close(); err != nil {
			t.Errorf("kubeapi: %v", err)
		}
	})
	return cp
}

// New starts a control plane owned by the caller, who must Close it; for a TestMain or a
// package-level fixture that outlives one test (tests use Start). Its watchdog removes it once
// this process is gone. It fails when the binaries are missing (naming `make kube-tools`) or the
// control plane does not become ready.
func New(opts Options) (*ControlPlane, error) {
	bin, script, err := findTools()
	if err != nil {
		return nil, fmt.Errorf("kubeapi: %w", err)
	}
	return launch(bin, script, opts)
}

// launch makes a directory and starts a control plane in it. The directory is short, under
// os.TempDir, because etcd's unix socket path must stay under about 100 bytes.
func launch(bin, script string, opts Options) (*ControlPlane, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubeapi-")
	if err != nil {
		return nil, fmt.Errorf("control plane directory: %w", err)
	}
	cp := &ControlPlane{dir: dir, script: script, bin: bin, opts: opts}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if err := cp.startLocked(); err != nil {
		_, cerr := cp.run("clean", nil)
		return nil, errors.Join(err, cerr)
	}
	return cp, nil
}

// Dir is the control plane's state directory: kubeconfig, pki/, the logs apiserver.log and
// etcd.log, which are worth reading when a test fails.
func (cp *ControlPlane) Dir() string { return cp.dir }

// Kubeconfig is the path of an admin kubeconfig (client certificate with O=system:masters), for
// kubectl and other programs.
func (cp *ControlPlane) Kubeconfig() string { return filepath.Join(cp.dir, "kubeconfig") }

// Options is what the control plane runs with now.
func (cp *ControlPlane) Options() Options {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.opts
}

// Config is a fresh copy of the admin client configuration (cluster-admin through the
// system:masters group). It stays valid across Stop and Restart, which keep the port and the PKI.
func (cp *ControlPlane) Config() *rest.Config {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return rest.CopyConfig(cp.cfg)
}

// Client is an admin clientset of Config.
func (cp *ControlPlane) Client() kubernetes.Interface {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.client
}

// URL is the API server's https URL on 127.0.0.1.
func (cp *ControlPlane) URL() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.cfg.Host
}

// CAData is the PEM certificate of the CA that signed the API server's serving certificate.
func (cp *ControlPlane) CAData() []byte {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return bytes.Clone(cp.cfg.CAData)
}

// Running reports whether the control plane was started and not stopped since.
func (cp *ControlPlane) Running() bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.running
}

// Stop stops kube-apiserver and etcd gracefully and returns once both are gone; clients then get
// "connection refused". The state is kept for Restart. Stopping a stopped control plane does
// nothing.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.closed {
		return errors.New("kubeapi: Stop after Close")
	}
	if _, err := cp.run("stop", nil); err != nil {
		return err
	}
	cp.running = false
	return nil
}

// Restart stops the control plane if it runs and starts it again with opts and the same data,
// PKI and port, so configurations and clients made before keep working (their connections are
// re-dialled). It returns once /readyz answers 200.
func (cp *ControlPlane) Restart(opts Options) error {
	if err := opts.validate(); err != nil {
		return err
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.closed {
		return errors.New("kubeapi: Restart after Close")
	}
	if cp.running {
		if _, err := cp.run("stop", nil); err != nil {
			return err
		}
		cp.running = false
	}
	cp.opts = opts
	return cp.startLocked()
}

// Close stops the control plane at once and removes its directory. It is idempotent.
func (cp *ControlPlane) Close() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.closed {
		return nil
	}
	cp.closed = true
	cp.running = false
	_, err := cp.run("clean", nil)
	return err
}

func (cp *ControlPlane) startLocked() error {
	out, err := cp.run("start", cp.opts.env())
	if err != nil {
		return err
	}
	if got, want := strings.TrimSpace(out), cp.Kubeconfig(); got != want {
		return fmt.Errorf("kube-up.sh start printed %q, want %q", got, want)
	}
	cfg, err := cp.readConfig()
	if err != nil {
		return err
	}
	if cp.cfg != nil && cp.cfg.Host != cfg.Host {
		// The earlier port was taken by someone else meanwhile; configurations handed out
		// before point at the old one. Rare, and a test that sees it gets this log line.
		fmt.Fprintf(os.Stderr, "kubeapi: control plane in %s moved from %s to %s\n", cp.dir, cp.cfg.Host, cfg.Host)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	cp.cfg, cp.client, cp.running = cfg, client, true
	return nil
}

// readConfig builds the admin configuration from the files kube-up.sh wrote.
func (cp *ControlPlane) readConfig() (*rest.Config, error) {
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(cp.dir, name))
		if err != nil {
			return nil, fmt.Errorf("control plane in %s: %w", cp.dir, err)
		}
		return b, nil
	}
	url, err := read("api.url")
	if err != nil {
		return nil, err
	}
	ca, err := read("pki/ca.crt")
	if err != nil {
		return nil, err
	}
	crt, err := read("pki/admin.crt")
	if err != nil {
		return nil, err
	}
	key, err := read("pki/admin.key")
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            strings.TrimSpace(string(url)),
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: crt, KeyData: key},
		// Tests create objects in bursts; the client-side default of 5 QPS only slows them.
		WarningHandler: rest.NoWarnings{},
		QPS:            200,
		Burst:          400,
	}, nil
}

// run runs kube-up.sh ACTION DIR and returns its stdout. The watchdog watches this process.
func (cp *ControlPlane) run(action string, env []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cp.script, action, cp.dir)
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env,
		"FIBERD_KUBE_BIN="+cp.bin,
		"FIBERD_KUBE_WATCH_PID="+strconv.Itoa(os.Getpid()),
		// A test binary that dies leaves no directory behind either.
		"FIBERD_KUBE_WATCH_ACTION=clean",
	)
	// On timeout, SIGTERM lets the script's trap stop what it started (SIGKILL follows WaitDelay later).
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The processes it starts write to their own log files, never to these pipes, so Wait
	// returns when the script does. WaitDelay bounds the wait after a cancel.
	cmd.WaitDelay = 20 * time.Second
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s %s: %w\n%s", cp.script, action, cp.dir, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ------------------------------------------------------------------------------ shared instance

// shared is the control plane of this test binary, started by the first Shared call.
var shared struct {
	mu     sync.Mutex
	inMain bool
	tried  bool
	cp     *ControlPlane
	err    error
}

// Main is the body of a TestMain that uses Shared or NewEnv:
//
//	func TestMain(m *testing.M) { os.Exit(kubeapi.Main(m)) }
//
// It runs the tests, then stops and removes the shared control plane if one was started. A
// failure to remove it makes the exit code 1. When the test binary dies before that (a panic, a
// timeout), the control plane's watchdog stops it within a second or two.
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()

	code := m.Run()

	shared.mu.Lock()
	cp := shared.cp
	shared.cp, shared.err = nil, errors.New("kubeapi: the shared control plane is closed")
	shared.mu.Unlock()
	if cp != nil {
		if err := cp.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "kubeapi: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Shared is the test binary's control plane, with Options{}; the first call starts it (about
// 3 s) and later calls, from any test, return the same one. It needs TestMain to call Main, and
// fails t otherwise, since nothing would stop the control plane. It skips t when the binaries
// are missing. Tests must not Stop or Restart it.
func Shared(t testing.TB) *ControlPlane {
	t.Helper()
	bin, script := requireTools(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		t.Fatal("kubeapi: Shared needs the package's TestMain to call kubeapi.Main(m)")
	}
	if !shared.tried {
		shared.tried = true
		shared.cp, shared.err = launch(bin, script, Options{})
	}
	if shared.err != nil {
		t.Fatalf("kubeapi: shared control plane: %v", shared.err)
	}
	return shared.cp
}

// ------------------------------------------------------------------------------ locating tools

// Binaries is the directory kube-apiserver and etcd are taken from: $FIBERD_KUBE_BIN, else
// ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin.
func Binaries() string {
	if d := os.Getenv("FIBERD_KUBE_BIN"); d != "" {
		return d
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

// requireTools finds the binaries and kube-up.sh, or skips t (fails it under
// FIBERD_KUBE_REQUIRED=1) naming what is missing and how to make it.
func requireTools(t testing.TB) (bin, script string) {
	t.Helper()
	bin, script, err := findTools()
	if err == nil {
		return bin, script
	}
	if os.Getenv("FIBERD_KUBE_REQUIRED") == "1" {
		t.Fatalf("kubeapi: %v (FIBERD_KUBE_REQUIRED=1 forbids skipping)", err)
	}
	t.Skipf("kubeapi: %v", err)
	return "", ""
}

func findTools() (bin, script string, err error) {
	bin, err = filepath.Abs(Binaries())
	if err != nil {
		return "", "", err
	}
	var missing []string
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(bin, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return "", "", fmt.Errorf("no %s in %s: run `make kube-tools` (hack/kube-tools.sh) to build them, or point FIBERD_KUBE_BIN at them",
			strings.Join(missing, " or "), bin)
	}
	script, err = findScript()
	if err != nil {
		return "", "", err
	}
	return bin, script, nil
}

// findScript is $FIBERD_KUBE_UP, else hack/kube-up.sh in the nearest directory, from the working
// directory up, that has one.
func findScript() (string, error) {
	if s := os.Getenv("FIBERD_KUBE_UP"); s != "" {
		return filepath.Abs(s)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		s := filepath.Join(dir, "hack", "kube-up.sh")
		if _, err := os.Stat(s); err == nil {
			return s, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no hack/kube-up.sh in %s or above; set FIBERD_KUBE_UP", wd)
		}
	}
}

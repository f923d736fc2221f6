package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/collectors"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/controller/issuer"
	"fiberd.io/fiberd/controller/pool"
)

// childEnv is the environment variable that turns this program (or the test binary) into the
// controller process: its value is the controllerSpec as JSON.
const childEnv = "FIBERD_SCALE_CONTROLLER"

// controllerSpec is what the controller process runs with: the parts of cmd/fiberd-controller's
// flags the benchmark sets.
type controllerSpec struct {
	// Kubeconfig is the admin kubeconfig of the control plane.
	Kubeconfig string
	// IssuerURL is the issuer's https URL on 127.0.0.1, the grant Pods' -issuer.
	IssuerURL string
	// IssuerListen is the address the issuer serves on.
	IssuerListen string
	// CertFile and KeyFile are the issuer's serving certificate and key.
	CertFile, KeyFile string
	// KeysNamespace is the namespace of the issuer's keys Secret.
	KeysNamespace string
	// MetricsListen is the address of the controller's /metrics.
	MetricsListen string
	// MaxLease is the longest lease the issuer signs.
	MaxLease time.Duration
}

// runChildIfAsked runs the controller process and exits when childEnv is set; it returns
// otherwise. main and the tests' TestMain call it first.
func runChildIfAsked() {
	raw, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	var spec controllerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "scale controller: %s: %v\n", childEnv, err)
		os.Exit(2)
	}
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(os.Stderr)))
	ctrl.SetLogger(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := runController(ctx, spec, log)
	stop()
	if err != nil {
		log.Error(err, "scale controller stopped")
		os.Exit(1)
	}
	os.Exit(0)
}

// runController wires the pool Reconciler and the issuer into one manager as
// cmd/fiberd-controller's run does (without leader election, health probes or a client
// certificate for fiberd's API, so fibers in use stay unknown), and runs it until ctx ends.
func runController(ctx context.Context, spec controllerSpec, log logr.Logger) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", spec.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", spec.Kubeconfig, err)
	}
	// cmd/fiberd-controller's configuration comes from controller-runtime's GetConfig, which
	// turns client-side rate limiting off (QPS -1) and leaves it to the API server's priority
	// and fairness; so does this.
	cfg.QPS, cfg.Burst = -1, 0
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, v1alpha1.AddToScheme, authenticationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	// The process's heap is read from /metrics: controller-runtime registers the Go collector
	// in its registry; the process collector is added when it is not there yet (a collision
	// with one registered already is no error here).
	if err := ctrlmetrics.Registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		log.V(1).Info("process collector not added", "reason", err.Error())
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Logger:  log,
		Cache:   pool.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: spec.MetricsListen},
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := pool.Setup(ctx, mgr, pool.Config{Shape: pool.Shape{IssuerURL: spec.IssuerURL}}); err != nil {
		return err
	}
	live, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("issuer client: %w", err)
	}
	iss, err := issuer.New(issuer.Config{
		IssuerURL:     spec.IssuerURL,
		ListenAddress: spec.IssuerListen,
		CertFile:      spec.CertFile,
		KeyFile:       spec.KeyFile,
		Namespace:     spec.KeysNamespace,
		MaxLease:      spec.MaxLease,
		Logger:        log.WithName("issuer"),
	}, live, mgr.GetClient())
	if err != nil {
		return err
	}
	if err := mgr.Add(iss); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// controllerProc is the controller process the benchmark started.
type controllerProc struct {
	cmd        *exec.Cmd
	metricsURL string
	done       chan error
}

// startController starts this executable again as the controller process, its log in logOut,
// and waits until its metrics answer.
func startController(ctx context.Context, spec controllerSpec, logOut io.Writer) (*controllerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("controller process: finding this executable: %w", err)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = logOut, logOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("controller process: %w", err)
	}
	p := &controllerProc{cmd: cmd, metricsURL: "http://" + spec.MetricsListen + "/metrics", done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := p.scrape(ctx); err == nil {
			return p, nil
		} else if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("controller process: metrics at %s not served within 30 s: %w (see its log)", p.metricsURL, err)
		}
		select {
		case err := <-p.done:
			p.done <- err
			return nil, fmt.Errorf("controller process exited at start: %v (see its log)", err)
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scrape reads the controller's /metrics.
func (p *controllerProc) scrape(ctx context.Context) ([]sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", p.metricsURL, resp.Status)
	}
	return parseText(string(b))
}

// rssBytes is the controller process's resident set size, from /proc.
func (p *controllerProc) rssBytes() (float64, error) {
	return procRSS(p.cmd.Process.Pid)
}

// procRSS reads VmRSS of pid from /proc/pid/status, in bytes.
func procRSS(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
}

// stop ends the controller process with SIGTERM (SIGKILL after 20 s) and waits for it.
func (p *controllerProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// freeAddr is a 127.0.0.1 address with a port nothing listened on a moment ago (the kernel's
// choice), so the benchmark never takes a fixed port another test on the machine uses.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

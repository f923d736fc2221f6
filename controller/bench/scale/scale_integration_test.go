//go:build integration

package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/textlogger"

	"fiberd.io/fiberd/test/kubeapi"
)

// TestScaleSmoke runs the benchmark with 4 grant Pods in 2 pools on 2 simulated Nodes, a lease
// short enough that each home renews during the rest window, and 2 pool clients, so the program
// keeps working: every Pod becomes Ready through the real controller, issuer and homes, the
// homes poll their Pods, renew and publish readiness, and the report names what it measured.
func TestScaleSmoke(t *testing.T) {
	if _, _, err := kubeapiTools(); err != nil {
		if os.Getenv("FIBERD_KUBE_REQUIRED") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	o := defaultOptions()
	o.Pods, o.Pools, o.Nodes = 4, 2, 2
	o.Lease, o.Poll = 8*time.Second, time.Second
	o.Rest, o.Load, o.Clients = 6*time.Second, 2*time.Second, 2
	o.ReadyTimeout = time.Minute
	o.CRD = "../../../deploy/controller/fiberd.io_fiberpools.yaml"
	o.Dir = t.TempDir()
	o.Log = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(testWriter{t})))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		if b, rerr := os.ReadFile(o.Dir + "/controller.log"); rerr == nil {
			t.Logf("controller log:\n%s", tail(b))
		}
		if b, rerr := os.ReadFile(o.Dir + "/homes.log"); rerr == nil {
			t.Logf("homes log:\n%s", tail(b))
		}
		t.Fatal(err)
	}
	if res.HomesStarted != 4 || res.ReadyPublished != 4 || res.ScopeLost != 0 {
		t.Errorf("homes started %d, readiness published %d, scope lost %d: want 4, 4, 0", res.HomesStarted, res.ReadyPublished, res.ScopeLost)
	}
	if res.ReadyAfter <= 0 || res.ReadyAfter > res.StatusAfter {
		t.Errorf("ready after %v, status after %v", res.ReadyAfter, res.StatusAfter)
	}
	if res.ControllerRSS < 1<<20 || res.ControllerHeap < 1<<20 {
		t.Errorf("controller RSS %v, heap %v: not read", res.ControllerRSS, res.ControllerHeap)
	}
	if res.RampReconciles < 1 {
		t.Errorf("no reconcile counted during the ramp")
	}
	if res.ClientsEndpoints != 4 {
		t.Errorf("pool clients saw %d endpoints, want 2 pools × 2", res.ClientsEndpoints)
	}
	perPod := map[requestKey]float64{}
	for _, r := range res.RampPerPod {
		perPod[r.Key] = r.PerSec
	}
	// Each Pod is created once and bound once; its status is patched by the kubelet (Running,
	// then Ready) and by its home (the readiness gate's condition).
	for k, want := range map[requestKey]float64{{"POST", "pods"}: 1, {"POST", "pods/binding"}: 1, {"PATCH", "pods/status"}: 3} {
		if perPod[k] < want {
			t.Errorf("ramp: %s %.2f per Pod, want at least %v", k, perPod[k], want)
		}
	}
	rest := res.Windows[0]
	// Each home reads its Pod about once a second and renews at 4 s: both show at rest.
	if rest.Homes < 4*0.5 {
		t.Errorf("homes sent %.2f requests/s at rest: want about 8 (4 homes × Pod and Namespace each second)", rest.Homes)
	}
	if rest.Renewals <= 0 {
		t.Errorf("no grant renewed at rest in %.0f s with a lease of %v", rest.Seconds, o.Lease)
	}
	var getPods float64
	for _, r := range rest.Rates {
		if r.Key == (requestKey{"GET", "pods"}) {
			getPods = r.PerSec
		}
	}
	if getPods < 2 {
		t.Errorf("GET pods %.2f/s at rest: want the homes' polls (about 4/s)", getPods)
	}
	var out bytes.Buffer
	writeReport(&out, res)
	for _, want := range []string{"every Pod Ready", "### ramp", "### rest", "### clone load", "GET pods", "controller RSS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("report:\n%s", out.String())
}

// kubeapiTools reports whether kube-apiserver and etcd are there, as kubeapi finds them.
func kubeapiTools() (string, string, error) {
	bin := kubeapi.Binaries()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(bin + "/" + b); err != nil {
			return "", "", err
		}
	}
	return bin, "", nil
}

func tail(b []byte) string {
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

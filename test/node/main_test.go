//go:build e2enode

package node

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"
)

// Names fixed by deploy/kubernetes and hack/images.sh.
const (
	podName         = "grant-0"       // grant-pod.yaml
	issuerNamespace = "fiberd-system" // issuer.yaml
	issuerURL       = "https://grant-issuer.fiberd-system.svc"
	readinessGate   = "fiberd.io/zygote-ready"
	manifestImage   = "fiberd:dev"                   // every manifest's image
	fiberdImage     = "fiberd.local/fiberd:dev"      // hack/images.sh's build of it
	clientImage     = "fiberd.local/node-client:dev" // test/node/client
	lease           = 2 * time.Minute                // issuer.yaml's -lease
	waitPod         = 2 * time.Minute
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e-node: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	timings.print()
	os.Exit(code)
}

// ------------------------------------------------------------------------------------ timings

// measures are what the suite measured, in ms by name, printed at the end for the report.
type measures struct {
	mu sync.Mutex
	ms map[string][]float64
}

var timings = &measures{ms: map[string][]float64{}}

func record(what string, d time.Duration) { recordMs(what, float64(d.Microseconds())/1000) }

func recordMs(what string, ms float64) {
	timings.mu.Lock()
	defer timings.mu.Unlock()
	timings.ms[what] = append(timings.ms[what], ms)
}

// print writes each measure's count, median and maximum.
func (m *measures) print() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.ms) == 0 {
		return
	}
	names := make([]string, 0, len(m.ms))
	for n := range m.ms {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Println("e2e-node timings (ms):")
	for _, n := range names {
		v := append([]float64(nil), m.ms[n]...)
		sort.Float64s(v)
		fmt.Printf("  %-55s n=%-3d p50=%9.1f max=%9.1f\n", n, len(v), v[len(v)/2], v[len(v)-1])
	}
}

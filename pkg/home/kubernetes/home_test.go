package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"

	"fiberd.io/fiberd/internal/logtest"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/home"
	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/kubernetes/fake"
)

// "Home is the Kubernetes home. It implements home.Home, and the optional
// fiberd.ScopeLoser, fiberd.EndpointHoster and the issuer override behind
// the admin socket." The home itself must not import pkg/fiberd, so the
// optional ones are checked here.
var (
	_ home.Home              = (*kubernetes.Home)(nil)
	_ fiberd.ScopeLoser      = (*kubernetes.Home)(nil)
	_ fiberd.EndpointHoster  = (*kubernetes.Home)(nil)
	_ fiberd.IssuerOverrider = (*kubernetes.Home)(nil)
	_ kubernetes.Kube        = (*fake.Kube)(nil)
)

// "Name is what this home is selected by."
func TestName(t *testing.T) {
	h, _, _ := newHome(t, nil)
	if kubernetes.Name != "kubernetes" || h.Name() != kubernetes.Name {
		t.Fatalf("Name = %q, Name() = %q; want \"kubernetes\"", kubernetes.Name, h.Name())
	}
}

// CgroupRoot set: "used as given".
func TestCgroupRootAsGiven(t *testing.T) {
	dir := t.TempDir()
	h, _, _ := newHome(t, func(c *kubernetes.Config) { c.CgroupRoot = dir })
	if got := h.CgroupRoot(); got != dir {
		t.Fatalf("CgroupRoot() = %q, want the configured %q", got, dir)
	}
}

// SelfAdmitUID "is the Pod UID".
func TestSelfAdmitUIDIsThePodUID(t *testing.T) {
	h, _, _ := newHome(t, nil)
	if got := h.SelfAdmitUID(); got != testUID {
		t.Fatalf("SelfAdmitUID() = %q, want the Pod UID %q", got, testUID)
	}
}

// OwnGrant: "A home without a grant fetch holds none."
func TestOwnGrantWithoutFetchHoldsNone(t *testing.T) {
	h, _, _ := newHome(t, func(c *kubernetes.Config) { c.GrantsDir = t.TempDir() })
	if tok, ok := h.OwnGrant(); ok || tok != nil {
		t.Fatalf("OwnGrant() = %q, %v; want none", tok, ok)
	}
}

// Scope: "Before the first Pod is stored it holds what the configuration
// knows, the namespace, the Pod name and its UID. A stored Pod adds the
// service account, the node and one claim per ResourceClaim."
func TestScopeBeforeAndAfterThePod(t *testing.T) {
	h, k, _ := newHome(t, nil)
	p := withClaim(withClaim(newPod(), "gpu"), "nic")
	k.SetPod(p)
	before := []core.ScopeClaim{{Name: "namespace", Value: testNS}, {Name: "pod", Value: testPod}, {Name: "pod_uid", Value: testUID}}
	if got := h.Scope(); !slices.Equal(got, before) {
		t.Fatalf("Scope() before the Pod = %v, want %v", got, before)
	}
	run(t, h)
	rounds(t, k, 1)
	after := append(slices.Clone(before),
		core.ScopeClaim{Name: "service_account", Value: testSA},
		core.ScopeClaim{Name: "node", Value: testNode},
		core.ScopeClaim{Name: "resource_claim", Value: "gpu"},
		core.ScopeClaim{Name: "resource_claim", Value: "nic"},
	)
	eventually(t, "the stored Pod in the scope", func() bool { return slices.Equal(h.Scope(), after) })
}

// A Pod read with another UID is not stored: the scope keeps what the
// configuration knows.
func TestReplacementPodIsNotStored(t *testing.T) {
	h, k, _ := newHome(t, nil)
	p := newPod()
	p.UID = otherUID
	p.Spec.NodeName = "elsewhere"
	k.SetPod(p)
	run(t, h)
	rounds(t, k, 1)
	settle()
	if got := h.Scope(); len(got) != 3 {
		t.Fatalf("Scope() = %v after reading a replacement Pod; want only the configured facts", got)
	}
}

// EndpointHost "is the Pod's IP of the configured family"; "The unix family
// advertises no address, so it returns "" at once."
func TestEndpointHostByFamily(t *testing.T) {
	tests := []struct {
		name   string
		family endpoint.Family
		pod    func(*corev1.Pod)
		want   string
	}{
		{"inet4 dual stack", endpoint.Inet4, nil, "10.0.0.7"},
		{"inet6 dual stack", endpoint.Inet6, nil, "fd00::7"},
		{"inet6 listed first", endpoint.Inet4, func(p *corev1.Pod) {
			p.Status.PodIPs = []corev1.PodIP{{IP: "fd00::7"}, {IP: "10.0.0.8"}}
		}, "10.0.0.8"},
		{"podIP only", endpoint.Inet6, func(p *corev1.Pod) {
			p.Status.PodIPs = nil
			p.Status.PodIP = "fd00::9"
		}, "fd00::9"},
		{"unix", endpoint.Unix, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, k, _ := newHome(t, func(c *kubernetes.Config) { c.Family = tt.family })
			p := newPod()
			if tt.pod != nil {
				tt.pod(p)
			}
			k.SetPod(p)
			if got := endpointHost(t, h); got != tt.want {
				t.Fatalf("EndpointHost() = %q, want %q", got, tt.want)
			}
			if tt.family == endpoint.Unix && k.Calls(fake.GetPod) != 0 {
				t.Fatal("the unix family read the Pod")
			}
		})
	}
}

// endpointHost is h.EndpointHost, cut short by Close if it does not answer
// within 10 s, since the fake clock never moves by itself.
func endpointHost(t *testing.T, h *kubernetes.Home) string {
	t.Helper()
	got := make(chan string, 1)
	go func() { got <- h.EndpointHost() }()
	select {
	case ip := <-got:
		return ip
	case <-time.After(10 * time.Second):
		h.Close()
		t.Errorf("EndpointHost did not answer; closed the home")
		return <-got
	}
}

// "The last Pod stored is consulted first."
func TestEndpointHostConsultsTheStoredPodFirst(t *testing.T) {
	h, k, _ := newHome(t, func(c *kubernetes.Config) { c.Family = endpoint.Inet4 })
	run(t, h)
	rounds(t, k, 1)
	eventually(t, "the Pod stored", func() bool { return len(h.Scope()) > 3 })
	k.Fail(fake.GetPod, errors.New("down"))
	reads := k.Calls(fake.GetPod)
	if got := endpointHost(t, h); got != "10.0.0.7" {
		t.Fatalf("EndpointHost() = %q, want the stored Pod's 10.0.0.7", got)
	}
	if k.Calls(fake.GetPod) != reads {
		t.Fatal("EndpointHost read the Pod although one was stored")
	}
}

// "the home then reads the Pod every podIPRetry for up to podIPWait" (500
// ms and 90 s): an address written after a while is found.
func TestEndpointHostWaitsForTheAddress(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.Family = endpoint.Inet4 })
	p := newPod()
	p.Status.PodIP, p.Status.PodIPs = "", nil
	k.SetPod(p)
	got := make(chan string, 1)
	go func() { got <- h.EndpointHost() }()
	for i := 1; i <= 3; i++ {
		eventually(t, "a Pod read", func() bool { return k.Calls(fake.GetPod) == i })
		tick(t, clk, 499*time.Millisecond)
		settle()
		if n := k.Calls(fake.GetPod); n != i {
			t.Fatalf("read %d times before 500ms passed, want %d", n, i)
		}
		if i == 3 {
			// The address arrives before the read the next millisecond
			// releases; set after it, that read could miss it and wait
			// on a clock that nothing steps again.
			k.SetPod(newPod())
		}
		clk.Step(time.Millisecond)
	}
	select {
	case ip := <-got:
		if ip != "10.0.0.7" {
			t.Fatalf("EndpointHost() = %q, want 10.0.0.7", ip)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("EndpointHost did not return once the Pod had an address")
	}
}

// "It returns "" when the Pod has no address of that family in time, and
// logs the last read error once when it gives up": whether the reads fail
// or the Pod never gets an address of the configured family.
func TestEndpointHostGivesUpAfterPodIPWait(t *testing.T) {
	for _, tt := range []struct {
		name     string
		readsErr bool
	}{
		{"reads fail", true},
		{"no address of the family", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			logs := logtest.Recorder{Verbosity: 1}
			h, k, clk := newHome(t, func(c *kubernetes.Config) { c.Family = endpoint.Inet6; c.Logger = logs.Logger() })
			if !tt.readsErr {
				p := newPod()
				p.Status.PodIP, p.Status.PodIPs = "10.0.0.7", []corev1.PodIP{{IP: "10.0.0.7"}}
				k.SetPod(p)
			}
			// Each read is let through by the loop below and answers at
			// once; one that fails fails with its own error, so the log
			// tells which one it carries.
			began, answer := make(chan struct{}), make(chan struct{})
			var n atomic.Int32
			k.Intercept(fake.GetPod, func(context.Context, string, string) error {
				began <- struct{}{}
				<-answer
				if tt.readsErr {
					return fmt.Errorf("kubelet has not written it (read %d)", n.Add(1))
				}
				return nil
			})
			got := make(chan string, 1)
			go func() { got <- h.EndpointHost() }()
			start := clk.Now()
			for {
				select {
				case <-began:
					// One step of the clock per read: whether it lands
					// while the read ends or while the next one is awaited,
					// the next read begins 500ms after this one did.
					answer <- struct{}{}
					eventually(t, "EndpointHost waiting on the clock", clk.HasWaiters)
					clk.Step(500 * time.Millisecond)
				case ip := <-got:
					if ip != "" {
						t.Fatalf("EndpointHost() = %q, want \"\"", ip)
					}
					// The last read begins at 89.5s: one at 90s would have
					// nothing left of the wait.
					if waited := clk.Since(start); waited != 90*time.Second {
						t.Fatalf("gave up after %v, want 90s", waited)
					}
					if n := k.Calls(fake.GetPod); n != 180 {
						t.Errorf("%d Pod reads in 90s, want 180 (one at once, then one per 500ms while the wait lasts)", n)
					}
					if !tt.readsErr {
						return
					}
					if n := len(logs.Matching("kubelet has not written it")); n != 1 {
						t.Fatalf("the read error was logged %d times, want once", n)
					}
					if n := len(logs.Matching("kubelet has not written it (read 180)")); n != 1 {
						t.Fatalf("the logged read error is not the last one; log:\n%s", logs.String())
					}
					return
				case <-time.After(10 * time.Second):
					t.Fatal("EndpointHost neither read the Pod again nor gave up")
				}
			}
		})
	}
}

// "reads the Pod every podIPRetry": a read begins 500ms after the one
// before it began, whatever that one took, and at once when it took longer.
func TestEndpointHostReadsEveryPodIPRetryFromTheirStart(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.Family = endpoint.Inet4 })
	p := newPod()
	p.Status.PodIP, p.Status.PodIPs = "", nil
	k.SetPod(p)
	took := []time.Duration{300 * time.Millisecond, 300 * time.Millisecond, 700 * time.Millisecond, 0}
	began := make(chan time.Duration, len(took))
	var n atomic.Int32
	k.Intercept(fake.GetPod, func(context.Context, string, string) error {
		i := int(n.Add(1)) - 1
		began <- clk.Since(epoch)
		if i < len(took) {
			clk.Step(took[i]) // the API server takes this long to answer
		}
		if i == len(took)-1 {
			k.SetPod(newPod()) // the kubelet wrote the address
		}
		return nil
	})
	got := make(chan string, 1)
	go func() { got <- h.EndpointHost() }()
	next := func(want time.Duration) {
		t.Helper()
		select {
		case at := <-began:
			if at != want {
				t.Fatalf("a read began at %v, want %v", at, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no read began at %v", want)
		}
	}
	next(0)
	// 300ms in: 200ms more to the next read.
	tick(t, clk, 200*time.Millisecond)
	next(500 * time.Millisecond)
	tick(t, clk, 200*time.Millisecond)
	next(time.Second)
	// This read takes 700ms: the next begins as it ends, with no wait.
	next(1700 * time.Millisecond)
	if ip := <-got; ip != "10.0.0.7" {
		t.Fatalf("EndpointHost() = %q, want 10.0.0.7", ip)
	}
}

// "for up to podIPWait": each read is bounded by Poll and by what is left
// of the wait, on the clock, so an API server that never answers cannot
// hold the wait past 90s. Poll is 20s here: reads at 0, 20, 40, 60 and 80s,
// the last one cut at 90s.
func TestEndpointHostNeverOverrunsPodIPWait(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.Family = endpoint.Inet4; c.Poll = 20 * time.Second })
	var began []time.Duration
	var mu sync.Mutex
	var inRead atomic.Bool
	k.Intercept(fake.GetPod, func(ctx context.Context, _, _ string) error {
		mu.Lock()
		began = append(began, clk.Since(epoch))
		mu.Unlock()
		inRead.Store(true)
		defer inRead.Store(false)
		<-ctx.Done() // an API server that never answers
		return ctx.Err()
	})
	got := make(chan string, 1)
	go func() { got <- h.EndpointHost() }()
	for {
		select {
		case ip := <-got:
			if ip != "" {
				t.Fatalf("EndpointHost() = %q, want \"\"", ip)
			}
			if waited := clk.Since(epoch); waited != 90*time.Second {
				t.Fatalf("gave up after %v on the clock, want podIPWait, 90s", waited)
			}
			mu.Lock()
			defer mu.Unlock()
			want := []time.Duration{0, 20 * time.Second, 40 * time.Second, 60 * time.Second, 80 * time.Second}
			if !slices.Equal(began, want) {
				t.Fatalf("reads began at %v, want %v", began, want)
			}
			return
		default:
		}
		// A read in flight waits on the clock for its bound; nothing else
		// ends it. The clock moves only while a read is in flight, so each
		// read begins at the time the one before it ended.
		deadline := time.Now().Add(10 * time.Second)
		for !(inRead.Load() && clk.HasWaiters()) && len(got) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("at %v on the clock a read waits for nothing on it: no bound on the clock", clk.Since(epoch))
			}
			time.Sleep(time.Millisecond)
		}
		if len(got) == 0 {
			clk.Step(time.Second)
		}
	}
}

// "logs the last read error once when it gives up": the last, so reads
// that failed at first and then worked leave no stale error in the log,
// only that the Pod has no address of the family.
func TestEndpointHostLogsTheLastOutcome(t *testing.T) {
	logs := logtest.Recorder{Verbosity: 1}
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.Family = endpoint.Inet6; c.Logger = logs.Logger() })
	p := newPod()
	p.Status.PodIP, p.Status.PodIPs = "10.0.0.7", []corev1.PodIP{{IP: "10.0.0.7"}}
	k.SetPod(p)
	var n atomic.Int32
	k.Intercept(fake.GetPod, func(context.Context, string, string) error {
		if n.Add(1) <= 3 {
			return errors.New("the API server is starting")
		}
		return nil
	})
	got := make(chan string, 1)
	go func() { got <- h.EndpointHost() }()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case ip := <-got:
			if ip != "" {
				t.Fatalf("EndpointHost() = %q, want \"\"", ip)
			}
			if l := logs.Matching("reading it failed"); len(l) != 0 {
				t.Fatalf("logged a read error although the last reads worked: %q", l)
			}
			if l := logs.Matching("no address of this family"); len(l) != 1 {
				t.Fatalf("want one line saying the Pod has no address of the family; log:\n%s", logs.String())
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("EndpointHost did not give up")
		}
		if clk.HasWaiters() {
			clk.Step(500 * time.Millisecond)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// "Close, or Run's context ending, cuts the wait short." Close "ends what
// New started, the wait for the Pod's address in EndpointHost".
func TestEndpointHostWaitCutShort(t *testing.T) {
	for _, by := range []string{"Close", "Run's context"} {
		t.Run(by, func(t *testing.T) {
			logs := logtest.Recorder{Verbosity: 1}
			h, k, _ := newHome(t, func(c *kubernetes.Config) { c.Family = endpoint.Inet4; c.Logger = logs.Logger() })
			p := newPod()
			p.Status.PodIP, p.Status.PodIPs = "", nil
			k.SetPod(p)
			var stop func()
			if by == "Run's context" {
				stop = run(t, h)
			}
			got := make(chan string, 1)
			go func() { got <- h.EndpointHost() }()
			eventually(t, "EndpointHost reading the Pod", func() bool { return k.Calls(fake.GetPod) >= 1 })
			if stop != nil {
				stop()
			} else {
				h.Close()
			}
			select {
			case ip := <-got:
				if ip != "" {
					t.Fatalf("EndpointHost() = %q, want \"\"", ip)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("EndpointHost still waits")
			}
			// Cut short is no giving up: no error is logged for it.
			if l := logs.Matching("no address"); len(l) != 0 {
				t.Fatalf("a wait cut short logged %q", l)
			}
			if l := logs.Matching("cut short"); len(l) != 1 {
				t.Fatalf("want one line saying the wait was cut short; log:\n%s", logs.String())
			}
		})
	}
}

// Close is idempotent: Closes at once and again afterwards all return,
// and what the first ended stays ended: a Pod without an address is not
// waited for by an EndpointHost after them (the fake clock never moves, so
// a wait would last forever).
func TestCloseIdempotent(t *testing.T) {
	h, k, _ := newHome(t, func(c *kubernetes.Config) { c.GrantsDir = t.TempDir(); c.Family = endpoint.Inet4 })
	p := newPod()
	p.Status.PodIP, p.Status.PodIPs = "", nil
	k.SetPod(p)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(h.Close)
		}
		wg.Wait()
		h.Close()
		if ip := h.EndpointHost(); ip != "" {
			t.Errorf("EndpointHost() after Close = %q, want \"\"", ip)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close called again, or EndpointHost after it, did not return")
	}
}

// "Close ends what New started, the wait for the Pod's address in
// EndpointHost. Run's context ends everything else." Close does not wait on
// the grants directory's poll, which Grants' context ends: a `defer
// h.Close()` written after `defer cancel()` runs while that context lives.
func TestCloseDoesNotWaitForGrantsContext(t *testing.T) {
	h, _, _ := newHome(t, func(c *kubernetes.Config) { c.GrantsDir = t.TempDir() })
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := h.Grants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		for range ch {
		}
	}()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		h.Close()
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		cancel() // let the Close in flight return, so the test can end
		<-closed
		t.Fatal("Close waited for the context given to Grants")
	}
}

// New: "ctx is not the home's lifetime. Run's context and Close end the
// home once New has returned it."
func TestNewContextIsNotTheLifetime(t *testing.T) {
	k := newWorld()
	clk := newClock()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := baseConfig(t, k, clk)
	cfg.Family = endpoint.Inet4
	h, err := kubernetes.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	cancel()
	run(t, h)
	rounds(t, k, 1)
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
	if endpointHost(t, h) == "" {
		t.Fatal("EndpointHost gave up because New's context ended")
	}
}

// Devices: "the Pod's ResourceClaim with the devices the driver exposed, a
// static set when the Pod has devices but no claim, and nothing
// otherwise"; "The claim is the Pod's, so there is nothing to release per
// grant."
func TestDevices(t *testing.T) {
	tests := []struct {
		name    string
		devices []string
		claims  []string
		want    core.DeviceChannel
	}{
		{"claim and devices", []string{"/dev/nvidia0"}, []string{"gpu"}, core.DeviceChannel{Kind: core.DeviceKindDRA, Devices: []string{"/dev/nvidia0"}, Claims: []string{"gpu"}}},
		{"two claims", []string{"/dev/a", "/dev/b"}, []string{"gpu", "nic"}, core.DeviceChannel{Kind: core.DeviceKindDRA, Devices: []string{"/dev/a", "/dev/b"}, Claims: []string{"gpu", "nic"}}},
		{"devices without claim", []string{"/dev/fuse"}, nil, core.DeviceChannel{Kind: core.DeviceKindStatic, Devices: []string{"/dev/fuse"}}},
		{"nothing", nil, nil, core.DeviceChannel{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, k, _ := newHome(t, func(c *kubernetes.Config) { c.Devices = tt.devices })
			p := newPod()
			for _, c := range tt.claims {
				withClaim(p, c)
			}
			k.SetPod(p)
			ch, release, err := h.Devices(context.Background(), core.Grant{UID: "grant-a"})
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			if ch.Kind != tt.want.Kind || !slices.Equal(ch.Devices, tt.want.Devices) || !slices.Equal(ch.Claims, tt.want.Claims) {
				t.Fatalf("Devices() = %+v, want %+v", ch, tt.want)
			}
			if release == nil {
				t.Fatal("release is nil; want a function that does nothing")
			}
			calls := k.Calls(fake.GetPod) + k.Calls(fake.GetResourceClaim) + k.Calls(fake.PatchPodStatus)
			release()
			if k.Calls(fake.GetPod)+k.Calls(fake.GetResourceClaim)+k.Calls(fake.PatchPodStatus) != calls {
				t.Fatal("release touched the cluster")
			}
		})
	}
}

// "The Pod is read first when it has not been yet": once, then the stored
// Pod answers.
func TestDevicesReadsThePodOnce(t *testing.T) {
	h, k, _ := newHome(t, func(c *kubernetes.Config) { c.Devices = []string{"/dev/x"} })
	k.SetPod(withClaim(newPod(), "gpu"))
	for i := 0; i < 2; i++ {
		ch, _, err := h.Devices(context.Background(), core.Grant{})
		if err != nil || ch.Kind != core.DeviceKindDRA {
			t.Fatalf("Devices() = %+v, %v; want the claim", ch, err)
		}
	}
	if n := k.Calls(fake.GetPod); n != 1 {
		t.Fatalf("%d Pod reads, want 1", n)
	}
}

// "A failed read never fails the admission ... The answer is then the
// static set, or no channel without devices."
func TestDevicesFailedReadNeverFails(t *testing.T) {
	for _, tt := range []struct {
		name    string
		devices []string
		want    core.DeviceChannel
	}{
		{"static set", []string{"/dev/x"}, core.DeviceChannel{Kind: core.DeviceKindStatic, Devices: []string{"/dev/x"}}},
		{"no devices", nil, core.DeviceChannel{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, k, _ := newHome(t, func(c *kubernetes.Config) { c.Devices = tt.devices })
			k.SetPod(withClaim(newPod(), "gpu"))
			k.Fail(fake.GetPod, errors.New("apiserver down"))
			ch, release, err := h.Devices(context.Background(), core.Grant{})
			if err != nil || release == nil {
				t.Fatalf("Devices: err %v, release %v; a failed read must not fail the admission", err, release != nil)
			}
			if ch.Kind != tt.want.Kind || !slices.Equal(ch.Devices, tt.want.Devices) || len(ch.Claims) != 0 {
				t.Fatalf("Devices() = %+v, want %+v", ch, tt.want)
			}
		})
	}
}

// Grants: "polls the projected directory. A new or changed *.jwt file is
// GrantAdded, a removed one GrantRemoved." GrantsPoll: "Default
// DefaultGrantsPoll."
func TestGrantsPollsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	h, _, clk := newHome(t, func(c *kubernetes.Config) { c.GrantsDir = dir })
	if kubernetes.DefaultGrantsPoll != 2*time.Second {
		t.Fatalf("DefaultGrantsPoll = %v, want 2s", kubernetes.DefaultGrantsPoll)
	}
	a := token("grant-a", epoch, epoch.Add(time.Hour))
	if err := os.WriteFile(filepath.Join(dir, "a.jwt"), a, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := h.Grants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	next := func(d time.Duration) home.GrantEvent {
		t.Helper()
		for {
			select {
			case ev := <-ch:
				return ev
			case <-time.After(time.Millisecond):
				if d > 0 && clk.HasWaiters() {
					clk.Step(d)
				}
			}
		}
	}
	if ev := next(0); ev.Kind != home.GrantAdded || ev.UID != "grant-a" || string(ev.Token) != string(a) {
		t.Fatalf("first event %+v, want GrantAdded grant-a", ev)
	}
	a2 := token("grant-a", epoch, epoch.Add(2*time.Hour))
	if err := os.WriteFile(filepath.Join(dir, "a.jwt"), a2, 0o600); err != nil {
		t.Fatal(err)
	}
	if ev := next(kubernetes.DefaultGrantsPoll); ev.Kind != home.GrantAdded || string(ev.Token) != string(a2) {
		t.Fatalf("after a change: %+v, want GrantAdded with the new token", ev)
	}
	if err := os.Remove(filepath.Join(dir, "a.jwt")); err != nil {
		t.Fatal(err)
	}
	if ev := next(kubernetes.DefaultGrantsPoll); ev.Kind != home.GrantRemoved || ev.UID != "grant-a" {
		t.Fatalf("after the removal: %+v, want GrantRemoved grant-a", ev)
	}
}

// GrantsPoll "is how often GrantsDir is read. Default DefaultGrantsPoll."
// A change is read by the poll one GrantsPoll after the last, not before.
func TestGrantsPollIsHowOftenTheDirectoryIsRead(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  time.Duration
		want time.Duration
	}{
		{"default", 0, kubernetes.DefaultGrantsPoll},
		{"configured", 5 * time.Second, 5 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			h, _, clk := newHome(t, func(c *kubernetes.Config) { c.GrantsDir = dir; c.GrantsPoll = tt.set })
			write := func(tok []byte) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(dir, "a.jwt"), tok, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write(token("grant-a", epoch, epoch.Add(time.Hour)))
			ctx, cancel := context.WithCancel(context.Background())
			ch, err := h.Grants(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cancel()
				for range ch {
				}
			})
			next := func(what string) home.GrantEvent {
				t.Helper()
				select {
				case ev := <-ch:
					return ev
				case <-time.After(10 * time.Second):
					t.Fatalf("no event: %s", what)
					return home.GrantEvent{}
				}
			}
			next("the first poll, at once")
			// The change lands before the step that releases the poll
			// meant to see it.
			changed := token("grant-a", epoch, epoch.Add(2*time.Hour))
			write(changed)
			tick(t, clk, tt.want-time.Millisecond)
			select {
			case ev := <-ch:
				t.Fatalf("event %+v %v after the last poll, before GrantsPoll (%v)", ev, tt.want-time.Millisecond, tt.want)
			case <-time.After(50 * time.Millisecond):
			}
			clk.Step(time.Millisecond)
			if ev := next("the poll one GrantsPoll later"); ev.Kind != home.GrantAdded || string(ev.Token) != string(changed) {
				t.Fatalf("event %+v, want GrantAdded with the changed token", ev)
			}
		})
	}
}

// GrantsDir: "Empty means no delivery": a nil channel and no error.
func TestGrantsWithoutDirectory(t *testing.T) {
	h, _, _ := newHome(t, nil)
	ch, err := h.Grants(context.Background())
	if ch != nil || err != nil {
		t.Fatalf("Grants() = %v, %v; want nil, nil", ch, err)
	}
}

// Run "returns only once all of them have stopped": after Run returns and
// Close, no goroutine of the home is left, with every part on (polls,
// delivery, cache refresh, renewal).
func TestRunLeavesNoGoroutine(t *testing.T) {
	before := goleak.IgnoreCurrent()
	srv := newGrantServer(t)
	iss := newIssuer(t)
	h, k, clk := newHome(t, func(c *kubernetes.Config) {
		srv.configure(t, c)
		c.Cache = issuerCache(t, iss)
	})
	h.OnScopeLost(func(context.Context, string) {})
	k.DeletePod(testNS, testPod)
	stop := run(t, h)
	rounds(t, k, 1)
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
	stop()
	h.Close()
	srv.Close()
	iss.Close()
	goleak.VerifyNone(t, before)
}

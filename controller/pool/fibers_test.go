package pool

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakePods are running grant Pods of pool "web" in namespace "ns", web-<i> at ips[i] ("" for a
// Pod without an IP yet).
func fakePods(ips ...string) []*corev1.Pod {
	var out []*corev1.Pod
	for i, ip := range ips {
		out = append(out, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("web-%d", i), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-%d", i)),
				Labels: map[string]string{LabelPool: "web"},
			},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
		})
	}
	return out
}

var webKey = types.NamespacedName{Namespace: "ns", Name: "web"}

// TestFiberCounter reads fibers in use from fiberd's status over TLS with a client certificate,
// sums a Pod's grants, names the Pods that did not answer, and reads each Pod at most once an
// interval.
func TestFiberCounter(t *testing.T) {
	f := newFakeFiberd(t, "fiberd.ns.svc")
	f.pod("127.0.0.1", 3)
	f.pod("127.0.0.2", 0)
	f.pod("127.0.0.3", 1)
	f.unreachable("127.0.0.3")
	cfg := f.config("fiberd.{namespace}.svc").withDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	c := newFiberCounter(cfg)
	pods := fakePods("127.0.0.1", "127.0.0.2", "127.0.0.3", "")

	inUse, unknown := c.count(context.Background(), webKey, pods, t0)
	if len(inUse) != 2 || inUse["uid-0"] != (fiberCount{3, t0}) || inUse["uid-1"] != (fiberCount{0, t0}) {
		t.Errorf("in use %v, want uid-0: 3 (two grants summed), uid-1: 0", inUse)
	}
	if len(unknown) != 1 || !strings.HasPrefix(unknown[0], "web-2: ") || !strings.Contains(unknown[0], "503") {
		t.Errorf("unknown %q, want web-2 with fiberd's 503", unknown)
	}

	f.pod("127.0.0.1", 7)
	inUse, _ = c.count(context.Background(), webKey, pods, t0.Add(cfg.Interval-time.Second))
	if inUse["uid-0"].n != 3 || f.readsOf("127.0.0.1") != 1 {
		t.Errorf("within the interval: in use %v after %d reads, want the count kept and no new read", inUse, f.readsOf("127.0.0.1"))
	}
	inUse, _ = c.count(context.Background(), webKey, pods, t0.Add(cfg.Interval))
	if inUse["uid-0"].n != 7 || f.readsOf("127.0.0.1") != 2 {
		t.Errorf("after the interval: in use %v after %d reads, want 7 read again", inUse, f.readsOf("127.0.0.1"))
	}

	// A Pod gone is forgotten; a pool gone too.
	c.count(context.Background(), webKey, pods[:1], t0.Add(cfg.Interval))
	if n := len(c.samples[webKey]); n != 1 {
		t.Errorf("%d samples after three pods left, want 1", n)
	}
	c.forget(webKey)
	if len(c.samples) != 0 {
		t.Errorf("samples %v after forget", c.samples)
	}
}

// TestFiberCounterTLS holds the counter to fiberd's TLS: the server's name is checked, and a
// certificate fiberd's client CA did not sign is refused; either leaves the count unknown.
func TestFiberCounterTLS(t *testing.T) {
	f := newFakeFiberd(t, "fiberd.ns.svc")
	f.pod("127.0.0.1", 2)
	pods := fakePods("127.0.0.1")

	wrongName := newFiberCounter(f.config("fiberd.other.svc").withDefaults())
	if _, unknown := wrongName.count(context.Background(), webKey, pods, t0); len(unknown) != 1 || !strings.Contains(unknown[0], "fiberd.other.svc") {
		t.Errorf("server name not checked: unknown %q", unknown)
	}

	stranger := f.config("fiberd.{namespace}.svc")
	stranger.TLS.Certificates = []tls.Certificate{newTestCA(t, "other").issue(t, "x", 0)}
	if _, unknown := newFiberCounter(stranger.withDefaults()).count(context.Background(), webKey, pods, t0); len(unknown) != 1 {
		t.Errorf("a client certificate of another CA was accepted: unknown %q", unknown)
	}

	noCert := f.config("")
	noCert.TLS.Certificates = nil
	if err := (Config{Fibers: noCert}).Validate(); err == nil || !strings.Contains(err.Error(), "client certificate") {
		t.Errorf("Validate without a client certificate: %v, want it refused", err)
	}
	if newFiberCounter(FibersConfig{}) != nil {
		t.Error("a counter without TLS, want none")
	}
}

// TestFiberCounterTimeout bounds a read of a fiberd that accepts and never answers.
func TestFiberCounterTimeout(t *testing.T) {
	f := newFakeFiberd(t, "fiberd.ns.svc")
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.9", strconv.Itoa(f.port)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				<-done
				return
			}
			held = append(held, c)
		}
	}()
	cfg := f.config("fiberd.{namespace}.svc")
	cfg.Timeout = 200 * time.Millisecond
	cfg.Concurrency = 2
	c := newFiberCounter(cfg.withDefaults())
	start := time.Now()
	_, unknown := c.count(context.Background(), webKey, fakePods("127.0.0.9", "127.0.0.9", "127.0.0.9", "127.0.0.9"), t0)
	took := time.Since(start)
	if len(unknown) != 4 {
		t.Errorf("unknown %q, want all 4", unknown)
	}
	// Four reads, two at a time, each cut at 200 ms.
	if took > 2*time.Second {
		t.Errorf("count took %v, want about 400 ms", took)
	}
}

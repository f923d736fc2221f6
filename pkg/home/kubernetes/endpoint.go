package kubernetes

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"

	"fiberd.io/fiberd/pkg/endpoint"
)

// podIPRetry is how often EndpointHost reads the Pod while it has no
// address, and podIPWait how long it tries.
const (
	podIPRetry = 500 * time.Millisecond
	podIPWait  = 90 * time.Second
)

// EndpointHost is the Pod's IP of the configured family. The last Pod
// stored is consulted first. fiberd asks before Run, and PID 1 can start
// before the kubelet has written the address, so the home then reads the
// Pod every podIPRetry for up to podIPWait. Close, or Run's context ending,
// cuts the wait short. It returns "" when the Pod has no address of that
// family in time, and logs the last read error once when it gives up. The
// unix family advertises no address, so it returns "" at once.
//
// podIPRetry is 500 ms and podIPWait 90 s, both on Config.Clock. A read
// begins podIPRetry after the one before it began, or at once when that one
// took longer. Each read is bounded by Poll and by what is left of
// podIPWait, so the wait ends at podIPWait however slowly the API server
// answers. The address comes from status.podIPs, else status.podIP.
func (h *Home) EndpointHost() string {
	if h.cfg.Family == endpoint.Unix {
		return ""
	}
	if p := h.storedPod(); p != nil {
		if ip := podIP(p, h.cfg.Family); ip != "" {
			return ip
		}
	}
	deadline := h.clk.Now().Add(podIPWait)
	var lastErr error
	for {
		began := h.clk.Now()
		left := deadline.Sub(began)
		if left <= 0 {
			break
		}
		ctx, cancel := onClock(h.waitCtx, h.clk, min(left, h.cfg.Poll),
			fmt.Errorf("podIPWait %v passed: %w", podIPWait, context.DeadlineExceeded))
		p, err := h.readPod(ctx)
		cancel()
		lastErr = err // the last outcome: a read that worked clears it
		if err == nil {
			if ip := podIP(p, h.cfg.Family); ip != "" {
				return ip
			}
		}
		if !h.sleepUntil(h.waitCtx, began.Add(podIPRetry)) {
			break
		}
	}
	if h.waitCtx.Err() != nil {
		h.log.Info("The wait for the Pod's address was cut short: the home is closing", "family", h.cfg.Family)
		return ""
	}
	if lastErr != nil {
		h.log.Error(lastErr, "The Pod has no address to advertise; reading it failed", "family", h.cfg.Family)
	} else {
		h.log.Info("The Pod has no address of this family to advertise", "family", h.cfg.Family)
	}
	return ""
}

// podIP is the Pod's first address of family f, "" for none.
func podIP(p *corev1.Pod, f endpoint.Family) string {
	for _, ip := range p.Status.PodIPs {
		if a, ok := ofFamily(ip.IP, f); ok {
			return a
		}
	}
	if a, ok := ofFamily(p.Status.PodIP, f); ok {
		return a
	}
	return ""
}

// ofFamily reports whether s is an address of family f, and returns it in
// its canonical form.
func ofFamily(s string, f endpoint.Family) (string, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return "", false
	}
	switch {
	case f == endpoint.Inet4 && a.Unmap().Is4():
		return a.Unmap().String(), true
	case f == endpoint.Inet6 && a.Is6() && !a.Is4In6():
		return a.String(), true
	}
	return "", false
}

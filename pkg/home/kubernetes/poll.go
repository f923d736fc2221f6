package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// The reasons a scope is lost, as OnScopeLost receives them. A claim's
// reason also names the claim.
const (
	reasonPodDeleted           = "pod deleted"
	reasonPodReplaced          = "pod replaced"
	reasonPodTerminating       = "pod terminating"
	reasonNamespaceDeleted     = "namespace deleted"
	reasonNamespaceTerminating = "namespace terminating"
	reasonClaimsUnreadable     = "resource claims unreadable"
)

// reasonClaimDeleted is the reason of a claim deleted, or being deleted,
// under the live Pod.
func reasonClaimDeleted(name string) string { return "resource claim " + name + " deleted" }

// pollLoop runs a round at once and then one per Poll, until ctx ends.
func (h *Home) pollLoop(ctx context.Context) {
	t := h.clk.NewTicker(h.cfg.Poll)
	defer t.Stop()
	for {
		h.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// round is one poll round: the Pod, its Namespace and, for the live Pod
// just read, its ResourceClaims; then the repair of the readiness
// condition. Everything in it is bounded by Poll, and it waits for nothing
// else: not for a readiness patch in flight, whose condition a later round
// repairs. It is skipped while the override pauses the polls.
func (h *Home) round(ctx context.Context) {
	if h.isPaused() {
		return
	}
	now := h.clk.Now() // the round's time, for the claims' count
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Poll)
	defer cancel()

	// live is the Pod just read when it is this Pod and not terminating:
	// its claims are checked and its condition repaired.
	var live *corev1.Pod
	pod, err := h.kube.GetPod(ctx, h.cfg.PodNamespace, h.cfg.PodName)
	switch {
	case apierrors.IsNotFound(err):
		h.noteErr("pod", nil)
		h.lose(reasonPodDeleted)
	case err != nil:
		h.noteErr("pod", fmt.Errorf("pod %s/%s: %w", h.cfg.PodNamespace, h.cfg.PodName, err))
	case string(pod.UID) != h.cfg.PodUID:
		h.noteErr("pod", nil)
		h.markSync()
		h.log.Info("The Pod has another UID", "pod", h.cfg.PodNamespace+"/"+h.cfg.PodName, "uid", pod.UID, "want", h.cfg.PodUID)
		h.lose(reasonPodReplaced)
	default:
		h.noteErr("pod", nil)
		h.markSync()
		h.storePod(pod)
		if pod.DeletionTimestamp != nil {
			h.lose(reasonPodTerminating)
		} else {
			live = pod
		}
	}

	ns, err := h.kube.GetNamespace(ctx, h.cfg.PodNamespace)
	switch {
	case apierrors.IsNotFound(err):
		h.noteErr("namespace", nil)
		h.lose(reasonNamespaceDeleted)
	case err != nil:
		h.noteErr("namespace", fmt.Errorf("namespace %s: %w", h.cfg.PodNamespace, err))
	default:
		h.noteErr("namespace", nil)
		if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
			h.lose(reasonNamespaceTerminating)
		}
	}

	if live == nil {
		// An API server that does not answer for the Pod is liveness, not
		// scope: the claims are not read, and the count of how long they
		// went unserved starts over (design decision 45). Claim reads that
		// failed at the edges of an outage (a round cut in the middle, an
		// API server that serves Pods before resource.k8s.io as it starts)
		// do not add up across it.
		h.mu.Lock()
		h.claimsFailingSince = time.Time{}
		h.mu.Unlock()
		return
	}
	h.checkClaims(ctx, now, podClaims(live))
	h.repairCondition(ctx, live)
}

// checkClaims reads each claim the live Pod uses. A claim gone or being
// deleted loses the scope; claims unreadable for StaleTTL in a row of
// rounds that each read the Pod lose it too.
func (h *Home) checkClaims(ctx context.Context, now time.Time, names []string) {
	var failed error
	for _, name := range names {
		c, err := h.kube.GetResourceClaim(ctx, h.cfg.PodNamespace, name)
		switch {
		case apierrors.IsNotFound(err):
			h.lose(reasonClaimDeleted(name))
		case err != nil:
			failed = errors.Join(failed, fmt.Errorf("resource claim %s/%s: %w", h.cfg.PodNamespace, name, err))
		case c.DeletionTimestamp != nil:
			h.lose(reasonClaimDeleted(name))
		}
	}
	h.noteErr("resource claims", failed)
	h.mu.Lock()
	if failed == nil {
		h.claimsFailingSince = time.Time{}
		h.mu.Unlock()
		return
	}
	if h.claimsFailingSince.IsZero() {
		h.claimsFailingSince = now
	}
	since := h.claimsFailingSince
	h.mu.Unlock()
	if now.Sub(since) >= h.cfg.StaleTTL {
		h.lose(reasonClaimsUnreadable)
	}
}

// keyLoop refreshes the key cache when it is due, by the keys' own
// lifetime (grant.Cache.RefreshIn): at once when the keys never loaded,
// then at half of the cache's MaxStale after each load, and once per its
// MinRefreshInterval while refreshes fail. An outage is logged when it
// starts and when it ends. While the override pauses the polls it refreshes
// nothing, and looks again every Poll.
func (h *Home) keyLoop(ctx context.Context) {
	for {
		wait := h.cfg.Cache.RefreshIn()
		if h.isPaused() {
			wait = h.cfg.Poll
		}
		if wait > 0 {
			if !h.sleepUntil(ctx, h.clk.Now().Add(wait)) {
				return
			}
			continue // look again: a Key lookup may have refreshed meanwhile
		}
		err := h.cfg.Cache.Refresh(ctx)
		if ctx.Err() != nil {
			return
		}
		h.noteKeys(err)
	}
}

// noteKeys logs a key refresh outage when it starts and when it ends, and
// each failed retry in between at V(1).
func (h *Home) noteKeys(err error) {
	h.mu.Lock()
	was := h.keysFailing
	h.keysFailing = err != nil
	h.mu.Unlock()
	switch {
	case err != nil && !was:
		h.log.Error(err, "Refreshing the issuer's keys failed; the keys loaded before serve until they are too old, and the refresh is retried", "issuer", h.cfg.Cache.Issuer())
	case err != nil:
		h.log.V(1).Info("Refreshing the issuer's keys still fails", "issuer", h.cfg.Cache.Issuer(), "err", err.Error())
	case was:
		h.log.Info("Refreshing the issuer's keys works again", "issuer", h.cfg.Cache.Issuer())
	}
}

// noteErr logs what fails when it starts failing and when it recovers,
// and every failure at V(1).
func (h *Home) noteErr(what string, err error) {
	h.mu.Lock()
	was := h.failing[what]
	h.failing[what] = err != nil
	h.mu.Unlock()
	switch {
	case err != nil && !was:
		h.log.Error(err, "Reading from the cluster failed; retrying every poll", "what", what)
	case err != nil:
		h.log.V(1).Info("Reading from the cluster still fails", "what", what, "err", err.Error())
	case was:
		h.log.Info("Reading from the cluster works again", "what", what)
	}
}

// lose queues reason for delivery, once.
func (h *Home) lose(reason string) {
	h.mu.Lock()
	if h.lost[reason] {
		h.mu.Unlock()
		return
	}
	h.lost[reason] = true
	h.pending = append(h.pending, reason)
	h.mu.Unlock()
	h.log.Info("Scope lost", "reason", reason, "pod", h.cfg.PodNamespace+"/"+h.cfg.PodName)
	select {
	case h.lostSignal <- struct{}{}:
	default:
	}
}

// deliverLoop hands queued reasons to the OnScopeLost function, in order,
// until ctx ends.
func (h *Home) deliverLoop(ctx context.Context) {
	for {
		h.mu.Lock()
		var reason string
		if len(h.pending) > 0 {
			reason = h.pending[0]
			h.pending = h.pending[1:]
		}
		fn := h.onLost
		h.mu.Unlock()
		if reason == "" {
			select {
			case <-ctx.Done():
				return
			case <-h.lostSignal:
			}
			continue
		}
		if fn == nil {
			h.log.Info("Scope lost with no one to tell (OnScopeLost not set)", "reason", reason)
			continue
		}
		fn(ctx, reason)
		if ctx.Err() != nil {
			return
		}
	}
}

// renewLoop renews the Pod's grant halfway through its lease, retried with
// backoff until it lands, until ctx ends. The current file stays in place
// until a new grant replaces it.
func (h *Home) renewLoop(ctx context.Context) {
	for {
		h.mu.Lock()
		cur := h.ownClaims
		h.mu.Unlock()
		if !h.sleepUntil(ctx, cur.renewAt()) {
			return
		}
		h.log.Info("Renewing this Pod's grant", "expiry", cur.Expiry)
		accept := func(c tokenClaims) error {
			if at := c.renewAt(); !at.After(h.clk.Now()) {
				return fmt.Errorf("the controller answered with a grant that is itself due for renewal (iat %v, exp %v); keeping the current one", c.IssuedAt, c.Expiry)
			}
			return nil
		}
		token, claims, err := h.fetch.fetchUntil(ctx, h.clk, h.log, time.Time{}, accept)
		if err != nil {
			return // only when ctx ended
		}
		h.setOwnGrant(token, claims)
		h.log.Info("Renewed this Pod's grant", "path", h.fetch.path, "expiry", claims.Expiry, "renewAt", claims.renewAt())
	}
}

// sleepUntil waits on the clock until t, and reports false when ctx ended
// first.
func (h *Home) sleepUntil(ctx context.Context, t time.Time) bool {
	d := t.Sub(h.clk.Now())
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := h.clk.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C():
		return true
	}
}

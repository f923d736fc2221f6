package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// pollLoop runs a round at once and then one per Poll, until ctx ends. A
// round's time is its tick's, the time it was due, so rounds are exactly
// Poll apart however late each one starts.
func (h *Home) pollLoop(ctx context.Context) {
	t := h.clk.NewTicker(h.cfg.Poll)
	defer t.Stop()
	at, read := h.clk.Now(), false
	for {
		read = h.round(ctx, at, read)
		select {
		case <-ctx.Done():
			return
		case at = <-t.C():
		}
	}
}

// claimRead is one ResourceClaim's read in a round.
type claimRead struct {
	claim *metav1.PartialObjectMetadata
	err   error
	// late is set for a read begun after the Pod's (a claim the Pod
	// stored before did not name): it had only what was left of the round.
	late bool
}

// round is one poll round, due at at: the Pod, its Namespace and, for the
// live Pod just read, its ResourceClaims; then the repair of the readiness
// condition. Everything in it is bounded by Poll, and it waits for nothing
// else: not for a readiness patch in flight, whose condition a later round
// repairs. It is skipped while the override pauses the polls. It reports
// whether it read the live Pod.
//
// The reads begin together, so each one has the whole round: the Pod, the
// Namespace and, when the last round read the live Pod (prev), the claims
// the stored Pod names (a claim a Pod names never changes; one generated
// from a template is named once it exists). A claim only the Pod just read
// names is read after it, with what is left. So while the API server
// answers for the Pod its claims are read beside it, and while it does not
// they are not read at all. What the reads found is judged once they all
// ended, in order: the Pod, the Namespace, the claims.
func (h *Home) round(ctx context.Context, at time.Time, prev bool) bool {
	if h.isPaused() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Poll)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

	var (
		ns    *corev1.Namespace
		nsErr error
	)
	wg.Go(func() { ns, nsErr = h.kube.GetNamespace(ctx, h.cfg.PodNamespace) })
	reads := map[string]*claimRead{}
	readClaim := func(name string, late bool) {
		r := &claimRead{late: late}
		reads[name] = r
		wg.Go(func() { r.claim, r.err = h.kube.GetResourceClaim(ctx, h.cfg.PodNamespace, name) })
	}
	if p := h.storedPod(); prev && p != nil && p.DeletionTimestamp == nil {
		for _, name := range podClaims(p) {
			readClaim(name, false)
		}
	}

	pod, err := h.kube.GetPod(ctx, h.cfg.PodNamespace, h.cfg.PodName)
	live := h.judgePod(pod, err)
	var names []string
	if live != nil {
		names = podClaims(live)
		for _, name := range names {
			if reads[name] == nil {
				readClaim(name, true)
			}
		}
	}
	wg.Wait()
	h.judgeNamespace(ns, nsErr)
	if live == nil {
		// An API server that does not answer for the Pod is liveness, not
		// scope: the claims are the live Pod's, and are judged only in a
		// round that read it (design decision 89).
		return false
	}
	h.checkClaims(ctx, at, names, reads)
	h.repairCondition(ctx, live)
	return true
}

// judgePod acts on the round's read of the Pod and returns the Pod when it
// is this Pod and not terminating: its claims are then judged and its
// condition repaired. Any answer of the API server for the Pod is a sync,
// a NotFound or a Pod of another UID included: liveness is the API server
// answering, whatever it says.
func (h *Home) judgePod(pod *corev1.Pod, err error) *corev1.Pod {
	switch {
	case apierrors.IsNotFound(err):
		h.noteErr("pod", nil)
		h.markSync()
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
			return nil
		}
		return pod
	}
	return nil
}

// judgeNamespace acts on the round's read of the Namespace.
func (h *Home) judgeNamespace(ns *corev1.Namespace, err error) {
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
}

// checkClaims judges the reads of the claims the live Pod uses, in a round
// due at at. A claim gone or being deleted loses the scope. Claims the
// cluster has not served for StaleTTL lose it too: the time runs from the
// first round that read the live Pod but not every claim, through rounds
// that could not read the Pod, until a round serves them all (design
// decision 89). It starts over only after an outage, a round that reads
// the Pod more than StaleTTL after the last one that did: claim reads that
// failed at the edges of an outage do not add up across it. A late read
// the round's end cut short is no answer: it neither starts the count nor
// ends it.
func (h *Home) checkClaims(ctx context.Context, at time.Time, names []string, reads map[string]*claimRead) {
	var failed error
	cut := false
	for _, name := range names {
		r := reads[name]
		switch {
		case apierrors.IsNotFound(r.err):
			h.lose(reasonClaimDeleted(name))
		case r.err != nil && r.late && ctx.Err() != nil:
			cut = true
		case r.err != nil:
			failed = errors.Join(failed, fmt.Errorf("resource claim %s/%s: %w", h.cfg.PodNamespace, name, r.err))
		case r.claim.DeletionTimestamp != nil:
			h.lose(reasonClaimDeleted(name))
		}
	}
	if cut && failed == nil {
		h.log.V(1).Info("A claim read begun after the Pod's was cut by the round's end; the claims are judged next round", "poll", h.cfg.Poll)
	} else {
		h.noteErr("resource claims", failed)
	}

	h.mu.Lock()
	if !h.lastPodRound.IsZero() && at.Sub(h.lastPodRound) > h.cfg.StaleTTL {
		h.claimsUnservedSince = time.Time{} // an outage: the count starts over
	}
	h.lastPodRound = at
	switch {
	case failed == nil && !cut:
		h.claimsUnservedSince = time.Time{}
	case failed != nil && h.claimsUnservedSince.IsZero():
		h.claimsUnservedSince = at
	}
	since := h.claimsUnservedSince
	h.mu.Unlock()
	if !since.IsZero() && at.Sub(since) >= h.cfg.StaleTTL {
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
		if !h.sleepUntil(ctx, cur.RenewAt()) {
			return
		}
		h.log.Info("Renewing this Pod's grant", "expiry", cur.Expiry)
		accept := func(c tokenClaims) error {
			if at := c.RenewAt(); !at.After(h.clk.Now()) {
				return fmt.Errorf("the controller answered with a grant that is itself due for renewal (iat %v, exp %v); keeping the current one", c.IssuedAt, c.Expiry)
			}
			return nil
		}
		token, claims, err := h.fetch.fetchUntil(ctx, h.clk, h.log, time.Time{}, accept)
		if err != nil {
			return // only when ctx ended
		}
		h.setOwnGrant(token, claims)
		h.log.Info("Renewed this Pod's grant", "path", h.fetch.path, "expiry", claims.Expiry, "renewAt", claims.RenewAt())
	}
}

// recheckEvery is the longest sleepUntil sleeps before it reads the clock
// again.
const recheckEvery = time.Minute

// armSlack is how far the clock may move while sleepUntil arms a timer
// before the timer is armed again: a clock stepped in between (a fake
// clock's Step in a test, a wall-clock step) would leave it late by the step.
const armSlack = 10 * time.Millisecond

// sleepUntil waits on the clock until it reads t or later, and reports
// false when ctx ended first. It reads the clock again at least every
// recheckEvery: t is a wall-clock time (a grant's renewal time, from the
// token), and a timer runs on the monotonic clock, so a step of the wall
// clock (NTP, a VM resumed) moves the wake-up with it within a minute
// instead of leaving it set for the distance computed before the step.
func (h *Home) sleepUntil(ctx context.Context, t time.Time) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		now := h.clk.Now()
		d := t.Sub(now)
		if d <= 0 {
			return true
		}
		tm := h.clk.NewTimer(min(d, recheckEvery))
		if h.clk.Since(now) > armSlack {
			// The clock moved while the timer was armed, which then runs
			// that much late: arm it again from the time as it is now.
			tm.Stop()
			continue
		}
		select {
		case <-ctx.Done():
			tm.Stop()
			return false
		case <-tm.C():
		}
	}
}

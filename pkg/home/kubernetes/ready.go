package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PublishReady records that the grant's template is warm, or no longer is,
// and sets the Pod condition when that flips "any template is warm".
//
// The condition is PodConditionZygoteReady, True with ReasonTemplateWarm
// or False with ReasonNoWarmTemplate, and a message naming the grant. It is
// sent as one strategic merge patch of the Pod's status, and only when the
// answer flips. The patch, and the wait for one still in flight, are
// bounded by ctx and by Poll, like every request of a poll round, so a
// caller whose context has no deadline is not held by a slow API server. A
// failed or unsent patch is returned, and the record stands: the next poll
// round that finds the condition disagreeing with Ready patches again.
func (h *Home) PublishReady(ctx context.Context, grantUID string, ready bool) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Poll)
	defer cancel()
	select {
	case h.patching <- struct{}{}:
		defer func() { <-h.patching }()
	case <-ctx.Done():
		if h.record(grantUID, ready) {
			return fmt.Errorf("pod %s/%s: condition %s not patched: the patch before it is still in flight after %v: %w",
				h.cfg.PodNamespace, h.cfg.PodName, PodConditionZygoteReady, h.cfg.Poll, context.Cause(ctx))
		}
		return nil
	}
	if !h.record(grantUID, ready) {
		return nil
	}
	after := h.Ready()
	msg := fmt.Sprintf("grant %s has a warm template", grantUID)
	if !after {
		msg = fmt.Sprintf("no grant has a warm template: grant %s went cold", grantUID)
	}
	if err := h.patchCondition(ctx, after, msg); err != nil {
		return err
	}
	h.log.Info("Published the Pod's readiness", "condition", PodConditionZygoteReady, "ready", after, "grant", grantUID)
	return nil
}

// record marks grantUID's template warm or cold, and reports whether that
// flipped "any template is warm".
func (h *Home) record(grantUID string, ready bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	before := len(h.warm) > 0
	if ready {
		h.warm[grantUID] = true
	} else {
		delete(h.warm, grantUID)
	}
	return before != (len(h.warm) > 0)
}

// Ready reports whether any grant's template is warm, which is what the
// Pod condition says once it is published.
func (h *Home) Ready() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.warm) > 0
}

// repairCondition patches the condition again when pod, just read, shows
// it disagreeing with Ready: a patch that failed, or another writer. A Pod
// without the condition agrees with not ready. While a patch is in flight
// it does nothing: that patch carries the state, and if it fails a later
// round repairs it.
func (h *Home) repairCondition(ctx context.Context, pod *corev1.Pod) {
	shown := corev1.ConditionFalse
	for _, c := range pod.Status.Conditions {
		if c.Type == PodConditionZygoteReady {
			shown = c.Status
		}
	}
	agrees := func(ready bool) bool {
		if ready {
			return shown == corev1.ConditionTrue
		}
		return shown == corev1.ConditionFalse
	}
	if agrees(h.Ready()) {
		return
	}
	select {
	case h.patching <- struct{}{}:
		defer func() { <-h.patching }()
	default:
		h.log.V(1).Info("A readiness patch is in flight; the condition is checked again next poll", "condition", PodConditionZygoteReady)
		return
	}
	// Asked again while holding patching, under which PublishReady records
	// (unless its wait for patching timed out: a change recorded so is
	// repaired by the next round).
	ready := h.Ready()
	if agrees(ready) {
		return
	}
	msg := "no grant has a warm template"
	if ready {
		msg = fmt.Sprintf("grant %s has a warm template", h.firstWarm())
	}
	if err := h.patchCondition(ctx, ready, msg); err != nil {
		h.log.Error(err, "Repairing the Pod condition failed; retrying next poll", "condition", PodConditionZygoteReady, "ready", ready)
		return
	}
	h.log.Info("Repaired the Pod condition", "condition", PodConditionZygoteReady, "was", shown, "ready", ready)
}

// firstWarm is the least UID of the grants whose template is warm, "" for
// none. Only a repair that patches needs it, so a round that finds the
// condition agreeing does not look.
func (h *Home) firstWarm() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var first string
	for uid := range h.warm {
		if first == "" || uid < first {
			first = uid
		}
	}
	return first
}

// conditionPatch is the strategic merge patch that sets only the
// readiness condition; conditions merge by type.
func conditionPatch(ready bool, msg string, now metav1.Time) ([]byte, error) {
	status, reason := corev1.ConditionFalse, ReasonNoWarmTemplate
	if ready {
		status, reason = corev1.ConditionTrue, ReasonTemplateWarm
	}
	type condition struct {
		Type               string                 `json:"type"`
		Status             corev1.ConditionStatus `json:"status"`
		Reason             string                 `json:"reason"`
		Message            string                 `json:"message"`
		LastTransitionTime metav1.Time            `json:"lastTransitionTime"`
	}
	type status_ struct {
		Conditions []condition `json:"conditions"`
	}
	return json.Marshal(struct {
		Status status_ `json:"status"`
	}{status_{Conditions: []condition{{
		Type: PodConditionZygoteReady, Status: status, Reason: reason, Message: msg, LastTransitionTime: now,
	}}}})
}

func (h *Home) patchCondition(ctx context.Context, ready bool, msg string) error {
	patch, err := conditionPatch(ready, msg, metav1.NewTime(h.clk.Now()).Rfc3339Copy())
	if err != nil {
		return fmt.Errorf("pod %s/%s: condition %s: %w", h.cfg.PodNamespace, h.cfg.PodName, PodConditionZygoteReady, err)
	}
	if err := h.kube.PatchPodStatus(ctx, h.cfg.PodNamespace, h.cfg.PodName, patch); err != nil {
		return fmt.Errorf("pod %s/%s: patching condition %s: %w", h.cfg.PodNamespace, h.cfg.PodName, PodConditionZygoteReady, err)
	}
	return nil
}

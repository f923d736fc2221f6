package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

// revisionLen is how many hex digits of the SHA-256 a revision keeps: 40 bits, so two specs of
// one pool collide with odds of about one in a trillion.
const revisionLen = 10

// Revision is the revision of p's grant Pods under shape: the first hex digits of the SHA-256 of
// the Pod GrantPod makes, less what differs between ordinals (name and ordinal label). Every
// field that shapes a Pod (template, image, pull policy, fibersMax, isolation, the Pod's node
// selection, resources and priority, the controller's Shape) changes it; the spec's other fields
// (replicas, drainGracePeriod) do not. It fails as GrantPod does.
func Revision(p *v1alpha1.FiberPool, shape Shape) (string, error) {
	pod, err := GrantPod(p, 0, shape)
	if err != nil {
		return "", err
	}
	return pod.Labels[LabelRevision], nil
}

// podRevision hashes pod as built by GrantPod, before its revision label is set. JSON encodes
// maps in key order, so equal Pods hash equal.
func podRevision(pod *corev1.Pod) string {
	c := pod.DeepCopy()
	c.Name = ""
	delete(c.Labels, LabelOrdinal)
	delete(c.Labels, LabelRevision)
	b, err := json.Marshal(struct {
		Labels      map[string]string
		Annotations map[string]string
		Spec        corev1.PodSpec
	}{c.Labels, c.Annotations, c.Spec})
	if err != nil {
		// A Pod of the API's own types always encodes; failing here is a programming error.
		panic(fmt.Sprintf("pool: encode pod for its revision: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:revisionLen]
}

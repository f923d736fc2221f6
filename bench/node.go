package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/test/kubenode"
)

// counterPodImage is hack/images.sh's image of the C example template as a plain container:
// tools/cmd/activate listens on :8080 and execs the template with the listener as descriptor 3,
// as fiberd's exec backend starts a cold fiber.
const counterPodImage = "fiberd.local/counter-pod:dev"

// podPerWorkerNode is the "Pod per worker" row on a real node (test/kubenode: kubelet,
// containerd, runc, CNI bridge, kube-scheduler), on a control plane of its own so the other rows'
// API server sees none of it. Each sample creates a Pod of the C template (the scheduler places
// it), and times from the create call to the first byte of its HTTP answer on the Pod IP; the
// Pod is deleted, and gone, outside the timer. The row is not measured, with the reason, when
// this machine cannot run a node or the node does not start.
func podPerWorkerNode(ctx context.Context, work string, kube *kubeTools, o options, p *progress) LatencyRow {
	row := LatencyRow{Mode: modePodNode, What: "create Pod (scheduled, image present), wait until its Pod IP answers the first HTTP byte"}
	if err := kubenode.Missing(); err != nil {
		row.Note = "no real node here: " + err.Error()
		return row
	}
	samples, version, err := measureNode(ctx, work, kube, o, p)
	if err != nil {
		row.Note = "the real node failed: " + err.Error()
		return row
	}
	row.Measured, row.SamplesMs, row.Summary = true, samples, Summarize(samples)
	row.Note = fmt.Sprintf("kubelet %s, containerd, runc, CNI bridge, kube-scheduler; the C template, --init-ms %d paid by every Pod", version, o.initMs)
	return row
}

func measureNode(ctx context.Context, work string, kube *kubeTools, o options, p *progress) (samples []float64, version string, err error) {
	p.Phasef("real node: building the images (hack/images.sh)")
	images := filepath.Join(work, "images")
	if _, err := kubenode.BuildImages(ctx, images); err != nil {
		return nil, "", err
	}
	p.Phasef("real node: a control plane for nodes and a node (hack/kube-up.sh, hack/node-up.sh)")
	kc, err := kube.startFor(ctx, kubenode.DefaultAddress)
	if err != nil {
		return nil, "", err
	}
	defer kc.close()
	node, err := kubenode.Start(ctx, kc.dir, kubenode.Options{Images: images})
	if err != nil {
		return nil, "", err
	}
	defer func() {
		if err := node.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: stopping the node: %v\n", err)
		}
	}()
	if err := node.Import(ctx, filepath.Join(images, "counter-pod.tar")); err != nil {
		return nil, "", err
	}
	const ns = "bench-node"
	if err := kc.namespace(ctx, ns); err != nil {
		return nil, "", err
	}
	// The ServiceAccount admission plugin admits a Pod once its account exists; the controller
	// manager makes "default".
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		_, err := kc.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return nil, "", fmt.Errorf("the default ServiceAccount of %s: %w", ns, err)
	}
	n := o.nodeN
	p.Phasef("Pod per worker on the real node (%d samples)", n)
	tick := p.Counter(n)
	out := make([]float64, 0, n)
	for i := range n {
		d, err := kc.podToFirstByte(ctx, ns, fmt.Sprintf("worker-%d", i), o.initMs)
		if err != nil {
			return nil, "", fmt.Errorf("sample %d: %w", i, err)
		}
		out = append(out, Ms(d))
		tick()
	}
	return out, kc.version, nil
}

// podToFirstByte creates the worker Pod, waits for its IP, dials it until the template answers
// GET / with a first byte, and returns that time; then deletes the Pod and waits until it is
// gone.
func (kc *kubeCluster) podToFirstByte(ctx context.Context, ns, name string, initMs int) (time.Duration, error) {
	pods := kc.cs.CoreV1().Pods(ns)
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "worker", Image: counterPodImage, ImagePullPolicy: corev1.PullNever,
				Args:  []string{"--init-ms", fmt.Sprint(initMs)},
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
	t0 := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	var ip string
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("Pod %s failed: %s", name, p.Status.Message)
		}
		ip = p.Status.PodIP
		return ip != "", nil
	}); err != nil {
		return 0, fmt.Errorf("Pod %s got no IP: %w", name, err)
	}
	addr := net.JoinHostPort(ip, "8080")
	var d time.Duration
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		ok, err := firstByteAt(ctx, addr)
		if ok {
			d = time.Since(t0)
		}
		return ok, err
	}); err != nil {
		return 0, fmt.Errorf("Pod %s at %s never answered: %w", name, addr, err)
	}
	zero := int64(0)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return 0, fmt.Errorf("Pod %s not gone after its deletion: %w", name, err)
	}
	return d, nil
}

// firstByteAt dials addr, sends GET / and reads one byte. A refused or reset connection (the
// container not listening yet) is not an error, just not yet.
func firstByteAt(ctx context.Context, addr string) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var dialer net.Dialer
	conn, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return false, nil
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n"); err != nil {
		return false, nil
	}
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		return false, nil
	}
	return true, nil
}

// waitFor polls cond every 20 ms until it holds, fails, or within passes.
func waitFor(ctx context.Context, within time.Duration, cond func() (bool, error)) error {
	end := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("not within %v", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

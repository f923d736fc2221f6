//go:build integration

package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/home"
	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/test/kubeapi"
)

// kubernetesHome is the Kubernetes home of a grant Pod on a real
// kube-apiserver, a fresh namespace and Pod per agent run, carving a
// cgroup v2 subtree made for it (the test skips where cgroup v2 is not
// writable: the home needs a cgroup root). Grants arrive as files, as the
// home's grant fetch writes them; the scope is lost by deleting the Pod.
var kubernetesHome = Home{Name: "kubernetes", New: func(t *testing.T, dir string, devices []string) (home.Home, Control) {
	t.Helper()
	env := kubeapi.NewEnv(t)
	pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant-pod"})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	kube, err := kubernetes.NewKube(ctx, env.CP.Config())
	must(t, err)
	grants := filepath.Join(dir, "grants")
	must(t, os.MkdirAll(grants, 0o700))
	h, err := kubernetes.New(ctx, kubernetes.Config{
		Kube: kube, PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: string(pod.UID),
		StaleTTL: 10 * time.Second, Poll: 200 * time.Millisecond,
		GrantsDir: grants, GrantsPoll: 50 * time.Millisecond,
		Family: endpoint.Unix, Devices: devices, CgroupRoot: testCgroup(t), Logger: quiet,
	})
	must(t, err)
	return h, kubeControl{fileLane: fileLane{dir: grants}, env: env, pod: pod.Name}
}}

// kubeControl feeds the home's grants directory and deletes its Pod.
type kubeControl struct {
	fileLane
	env *kubeapi.Env
	pod string
}

func (c kubeControl) LoseScope(t *testing.T) bool {
	c.env.DeletePod(t, c.pod)
	return true
}

var cgroupSeq atomic.Int32

// testCgroup makes a cgroup v2 directory for one home, removed (its
// processes killed) when the test ends, or skips the test.
func testCgroup(t *testing.T) string {
	t.Helper()
	mount, err := cgroup.Mount()
	if err != nil {
		t.Skipf("the Kubernetes home needs a cgroup v2 root, and there is no cgroup v2 here: %v", err)
	}
	dir := filepath.Join(mount, fmt.Sprintf("fiberd-conformance-%d-%d", os.Getpid(), cgroupSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("the Kubernetes home needs a cgroup v2 root, and cgroup v2 is not writable here: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := cgroup.At(dir).Destroy(ctx); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("removing the test cgroup %s: %v", dir, err)
		}
	})
	return dir
}

func TestKubernetesHome(t *testing.T) {
	for _, b := range []Backend{fakeBackend, procBackend, execBackend} {
		t.Run(b.Name, func(t *testing.T) { Run(t, kubernetesHome, b) })
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/pkg/grant/granttest"
)

// A SIGTERM while fiberd waits, at start, for the kubelet to write the
// Pod's address ends the wait: fiberd exits 0 at once instead of after up
// to 90 s. The API server here serves the Pod without an address.
func TestSignalDuringTheStartWaitForThePodIP(t *testing.T) {
	var podReads atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/namespaces/tenants/pods/grant-pod-1" {
			podReads.Add(1)
			_ = json.NewEncoder(w).Encode(corev1.Pod{
				TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
				ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: "grant-pod-1", UID: "0b5e0cbe-1d1b-4f5c-9c1e-2f2f2f2f2f2f"},
			})
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound})
	}))
	defer api.Close()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, api.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	// A cgroup v2 directory as fiberd checks one, with no controllers: the
	// test moves no process and writes nothing under /sys/fs/cgroup.
	cg := filepath.Join(dir, "cgroup")
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cgroup.procs", "cgroup.controllers", "cgroup.subtree_control"} {
		if err := os.WriteFile(filepath.Join(cg, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	iss := granttest.NewIssuer(granttest.Options{})
	defer iss.Close()
	keys := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(keys, iss.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"-home", "kubernetes", "-kubeconfig", kubeconfig, "-issuer", "https://issuer.example", "-issuer-keys", keys,
		"-templates", dir, "-grants-dir", filepath.Join(dir, "grants"), "-state", filepath.Join(dir, "state"),
		"-run-dir", filepath.Join(dir, "run"), "-listen=127.0.0.1:0", "-insecure-plaintext", "-cgroup-root", cg, "-isolation", "none"}

	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	stderr := &syncWriter{b: &strings.Builder{}}
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, args, kubeEnv, io.Discard, stderr) }()
	deadline := time.Now().Add(30 * time.Second)
	for podReads.Load() == 0 {
		select {
		case code := <-exit:
			t.Fatalf("fiberd exited %d before it read the Pod for its address; stderr:\n%s", code, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("fiberd never read the Pod for its address")
		}
	}
	sigterm()
	select {
	case code := <-exit:
		if code != exitOK {
			t.Fatalf("exit %d after a signal at start, want %d; stderr:\n%s", code, exitOK, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("fiberd still waits for the Pod's address 10s after the signal")
	}
}

// syncWriter is a strings.Builder several goroutines may write and read.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

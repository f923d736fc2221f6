package backend

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runHook runs the relock script as criu would at action, for pid.
func runHook(t *testing.T, h *relockHook, action string, pid int) error {
	t.Helper()
	cmd := exec.Command(h.script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "CRTOOLS_SCRIPT_ACTION=" + action, "CRTOOLS_INIT_PID=" + strconv.Itoa(pid)}
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the script did not end at %s", action)
		return nil
	}
}

// TestRelockHook: criu's action script lets every step but pre-resume
// pass without asking fiberd; at pre-resume fiberd makes the mounts of the
// pid's mount namespace read-only (but its scratch and /proc) and the
// script succeeds; for a pid fiberd cannot relock it fails, and so does
// the hook's outcome; a hook never asked closes with nil.
func TestRelockHook(t *testing.T) {
	if os.Geteuid() != 0 {
		isolationMiss(t, "not root: the hook enters another mount namespace")
	}
	h, err := writeRelockHook("/bin/sh", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h.served = true
	go h.serve(time.Now().Add(time.Minute))
	if err := runHook(t, h, "post-setup-namespaces", 1); err != nil {
		t.Fatalf("another step: %v", err)
	}
	// A process in a mount namespace of its own, with a writable mount.
	target := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs relock-test /mnt && exec sleep 60")
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { target.Process.Kill(); target.Wait() }()
	var mounts string
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(target.Process.Pid) + "/mountinfo")
		if mounts = string(b); strings.Contains(mounts, "relock-test") {
			break
		}
	}
	if err := runHook(t, h, "pre-resume", target.Process.Pid); err != nil {
		t.Fatalf("pre-resume: %v (hook: %v)", err, h.close())
	}
	if err := h.close(); err != nil {
		t.Fatalf("outcome: %v", err)
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(target.Process.Pid) + "/mountinfo")
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if f[4] != "/proc" && !contains(scratchDirs, f[4]) && strings.HasPrefix(f[5], "rw") {
			t.Errorf("after the hook, %s is writable: %s", f[4], line)
		}
	}

	bad, err := writeRelockHook("/bin/sh", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bad.served = true
	go bad.serve(time.Now().Add(time.Minute))
	if err := runHook(t, bad, "pre-resume", 1<<22+7); err == nil {
		t.Error("pre-resume for a pid that is not there succeeded")
	}
	if err := bad.close(); err == nil {
		t.Error("the hook's outcome for a pid that is not there is nil")
	}

	never, err := writeRelockHook("/bin/sh", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	never.served = true
	go never.serve(time.Now().Add(time.Minute))
	if err := never.close(); err != nil {
		t.Errorf("a hook never asked: %v", err)
	}
}

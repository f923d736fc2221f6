package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/grant"
)

// holdState takes the lock of the state directory state as a running
// agent does (an exclusive flock of private/lock holding its pid), until
// the test ends.
func holdState(t *testing.T, state string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(state, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(state, "private", "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(strconv.Itoa(os.Getpid()) + "\n"); err != nil {
		t.Fatal(err)
	}
}

// bounded is the context of one run: fiberd returns at once when it
// refuses the -state, as here; one that started serving instead is
// stopped (drained, exit 0) after 20 s.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestStateInUseExitsUsage: fiberd on a -state another agent holds exits 2
// (a usage error: the command line must name another -state) with a
// message naming the directory and the holder's pid, before it builds or
// binds anything; so does fiberd -dev, before it writes anything there. A
// -state another user owns is a failure to start (exit 1) naming the
// directory.
func TestStateInUseExitsUsage(t *testing.T) {
	dir := t.TempDir()
	key, err := grant.GenerateKey("EdDSA", "k1")
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := grant.PublicJWKS(key)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(keys, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := func(state string) []string {
		return []string{"-issuer", "https://issuer.example", "-issuer-keys", keys, "-templates", filepath.Join(dir, "templates"),
			"-state", state, "-run-dir", filepath.Join(dir, "run"), "-listen=", "-cgroup-root=none", "-isolation", "none"}
	}
	// -dev on an empty -templates would stop at "no template to grant",
	// past its key, and makes no cgroup: a fiberd that went past the check
	// of its -state touches nothing of the host's.
	devArgs := func(state string) []string {
		return []string{"-dev", "-state", state, "-templates", filepath.Join(dir, "templates"), "-cgroup-root=none", "-isolation", "none"}
	}
	state := filepath.Join(dir, "state")
	holdState(t, state)
	inUse := "state directory " + state + " is in use by process " + strconv.Itoa(os.Getpid()) + " ("

	var stderr strings.Builder
	if code := run(bounded(t), args(state), testEnv, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), inUse) {
		t.Errorf("fiberd on a -state in use: exit %d, want %d, and a message saying %q; stderr:\n%s", code, exitUsage, inUse, stderr.String())
	}
	t.Logf("fiberd on a -state in use says: %s", stderr.String())
	if _, err := os.Stat(filepath.Join(state, "fiberd.sock")); !os.IsNotExist(err) {
		t.Errorf("fiberd bound a socket in a -state in use (stat: %v)", err)
	}

	stderr.Reset()
	if code := run(bounded(t), devArgs(state), testEnv, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), inUse) {
		t.Errorf("fiberd -dev on a -state in use: exit %d, want %d, and a message saying %q; stderr:\n%s", code, exitUsage, inUse, stderr.String())
	}
	t.Logf("fiberd -dev on a -state in use says: %s", stderr.String())
	if _, err := os.Stat(filepath.Join(state, "dev")); !os.IsNotExist(err) {
		t.Errorf("fiberd -dev wrote its issuer key into a -state in use (stat: %v)", err)
	}

	// New's own refusal (another fiberd took the lock between run's check
	// and New) is the same usage error.
	if code := startFailure(fmt.Errorf("fiberd: %w", fiberd.ErrStateInUse)); code != exitUsage {
		t.Errorf("exit status for New's ErrStateInUse: %d, want %d", code, exitUsage)
	}

	t.Run("owned by another user", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root: the test chowns the -state to another user (uid 65534)")
		}
		foreign := filepath.Join(dir, "foreign")
		if err := os.Mkdir(foreign, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		stderr.Reset()
		want := "state directory " + foreign + " (-state) is owned by uid 65534"
		if code := run(bounded(t), args(foreign), testEnv, io.Discard, &stderr); code != exitFailure || !strings.Contains(stderr.String(), want) {
			t.Errorf("fiberd on a -state of another user: exit %d, want %d, and a message saying %q; stderr:\n%s", code, exitFailure, want, stderr.String())
		}
		t.Logf("fiberd on a -state of another user says: %s", stderr.String())
		stderr.Reset()
		if code := run(bounded(t), devArgs(foreign), testEnv, io.Discard, &stderr); code != exitFailure || !strings.Contains(stderr.String(), want) {
			t.Errorf("fiberd -dev on a -state of another user: exit %d, want %d, and a message saying %q; stderr:\n%s", code, exitFailure, want, stderr.String())
		}
		if _, err := os.Stat(filepath.Join(foreign, "dev")); !os.IsNotExist(err) {
			t.Errorf("fiberd -dev read or wrote its issuer key in a -state of another user (stat: %v)", err)
		}
	})
}

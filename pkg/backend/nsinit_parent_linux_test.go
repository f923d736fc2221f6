package backend

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNsinitOutlivesNoDeadFiberd starts nsinit as fiberd does (in new user,
// mount and PID namespaces) but with the read end of its status pipe already
// closed, as when fiberd is killed between the fork and the runtime's
// PR_SET_PDEATHSIG: in a new PID namespace the runtime's own check of the
// parent cannot see that, so without nsinit's check the template would run
// with nothing left to end it. nsinit must exit without running it.
func TestNsinitOutlivesNoDeadFiberd(t *testing.T) {
	if os.Geteuid() != 0 {
		isolationMiss(t, "nsinit's namespaces need root")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(dir, "ran")
	script := filepath.Join(dir, "template")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n: > "+ran+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	command, err := os.Open(script)
	if err != nil {
		t.Fatal(err)
	}
	defer command.Close()
	home, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	fd3, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer fd3.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r.Close() // fiberd is gone: nobody reads nsinit's status

	const id = 1879000001
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{nsinitArg0, "{}", "template"},
		Env:        []string{nsinitEnv + "=1"},
		ExtraFiles: []*os.File{fd3, w, command, home},
		SysProcAttr: &syscall.SysProcAttr{
			Setsid:                     true,
			Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: id, HostID: id, Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: id, HostID: id, Size: 1}},
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}},
			AmbientCaps:                []uintptr{unix.CAP_SYS_ADMIN},
		},
	}
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != nsinitExitCode {
		t.Errorf("nsinit with no fiberd reading its status: %v, want exit %d", err, nsinitExitCode)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Errorf("nsinit ran the template although the fiberd that started it was gone")
	}
}

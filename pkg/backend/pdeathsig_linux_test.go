package backend

import (
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFibersEndWithTheirZygote: a fiber of the C or the Python SDK ends
// when its zygote dies, even with nobody (no fiberd) to kill it: the SDKs
// set a parent-death signal in every fiber. The zygote is started here by
// hand, as fiberd would, and killed with SIGKILL, as it is when fiberd is.
func TestFibersEndWithTheirZygote(t *testing.T) {
	for _, k := range []kind{kindC, kindPython} {
		t.Run(k.name, func(t *testing.T) {
			spec := k.spec(t)
			pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			parent := os.NewFile(uintptr(pair[0]), "fiberd-control")
			child := os.NewFile(uintptr(pair[1]), "zygote-control")
			defer parent.Close()
			cmd := exec.Command(spec.Command, spec.Args...)
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			for k, v := range spec.Env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			cmd.ExtraFiles = []*os.File{child}
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			child.Close()
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			c, err := net.FileConn(parent)
			if err != nil {
				t.Fatal(err)
			}
			conn := c.(*net.UnixConn)
			defer conn.Close()
			read := func() message {
				t.Helper()
				buf := make([]byte, maxMessage)
				n, _, _, _, err := conn.ReadMsgUnix(buf, nil)
				if err != nil {
					t.Fatal(err)
				}
				m, err := parseMessage(buf[:n])
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			if m := read(); m.kind != msgReady {
				t.Fatalf("first message %+v, want READY", m)
			}
			ep := listen(t, true)
			f := fence("pdeathsig", 1)
			if _, _, err := conn.WriteMsgUnix([]byte(formatClone(f, nil)), unix.UnixRights(int(ep.file.Fd())), nil); err != nil {
				t.Fatal(err)
			}
			m := read()
			if m.kind != msgCloned {
				t.Fatalf("answer to CLONE %+v, want CLONED", m)
			}
			if _, err := get(ep, "/"); err != nil {
				t.Fatalf("fiber does not serve: %v", err)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			waitGone(t, m.pid) // the fiber's new parent (init) reaps it
		})
	}
}

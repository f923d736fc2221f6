package backend

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkReadOnlyHost is what the spawner adds before each isolated
// process it starts (an exec fiber's, a zygote's): readOnlyHost over a
// mount namespace like its own, a slave copy of the host's with a /proc
// on top. It reports the namespace's mounts. It needs root.
func BenchmarkReadOnlyHost(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("not root: a mount namespace of its own needs CAP_SYS_ADMIN")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Never unlocked: the runtime ends this thread, and its mount
		// namespace, with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			b.Errorf("unshare: %v", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			b.Errorf("make / a slave: %v", err)
			return
		}
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, hiddenProcOptions); err != nil {
			b.Errorf("mount /proc: %v", err)
			return
		}
		info, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			b.Errorf("mountinfo: %v", err)
			return
		}
		b.ResetTimer()
		for b.Loop() {
			if err := readOnlyHost(); err != nil {
				b.Errorf("readOnlyHost: %v", err)
				return
			}
		}
		b.ReportMetric(float64(strings.Count(string(info), "\n")), "mounts")
	}()
	<-done
}

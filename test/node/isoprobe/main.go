// Command isoprobe reports what isolation fiberd's backends can build in
// the container it runs in: its ids and id maps, its capabilities, and the
// proc and exec backends' own probe at -isolation fiber. Then it waits, so
// its Pod stays Running for kubectl logs.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"fiberd.io/fiberd/pkg/backend"
)

func main() {
	first := flag.Uint("first", uint(backend.DefaultIDFirst), "first id of the pool")
	count := flag.Uint("count", uint(backend.DefaultIDCount), "ids in the pool")
	wait := flag.Bool("wait", true, "sleep after the report")
	flag.Parse()
	fmt.Printf("uid %d euid %d gid %d\n", os.Getuid(), os.Geteuid(), os.Getgid())
	for _, f := range []string{"/proc/self/uid_map", "/proc/self/gid_map", "/proc/sys/user/max_user_namespaces"} {
		b, err := os.ReadFile(f)
		fmt.Printf("%s: %q %v\n", f, strings.Join(strings.Fields(string(b)), " "), err)
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Cap") || strings.HasPrefix(l, "NoNewPrivs") || strings.HasPrefix(l, "Seccomp") {
				fmt.Println(l)
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, " /proc") {
				fmt.Println("mount:", l)
			}
		}
	}
	ids, err := backend.NewIDPool(uint32(*first), uint32(*count))
	if err != nil {
		fmt.Println("ids:", err)
		os.Exit(1)
	}
	p, err := backend.NewProc(backend.Config{Isolation: backend.IsolationFiber, IDs: ids})
	if err != nil {
		fmt.Println("proc backend:", err)
	} else {
		s := p.Isolation()
		fmt.Printf("proc: level=%s networkNone=%v missing=%q\n", s.Level, s.NetworkNone, s.Missing)
		p.Close()
	}
	e, err := backend.NewExec(backend.Config{Isolation: backend.IsolationFiber, IDs: ids})
	if err != nil {
		fmt.Println("exec backend:", err)
	} else {
		s := e.Isolation()
		fmt.Printf("exec: level=%s networkNone=%v missing=%q\n", s.Level, s.NetworkNone, s.Missing)
		e.Close()
	}
	for *wait {
		time.Sleep(time.Hour)
	}
}

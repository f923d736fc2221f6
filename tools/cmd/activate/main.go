// Command activate runs a socket-activated program as a plain container's
// entrypoint: it binds a TCP listener, makes it descriptor 3, sets
// LISTEN_FDS=1 and LISTEN_PID to its own pid, and execs the program, which
// keeps the pid. fiberd's exec backend starts a cold fiber the same way, so
// a template (examples/templates/c/counter) runs as a one-worker Pod with
// it: the bench's "Pod per worker" row.
//
// Usage:
//
//	activate -listen ADDR PROGRAM [ARG...]
//
// Exit status: the program's, once exec'd; 1 when the listener cannot be
// bound or the program cannot be exec'd; 2 on bad usage.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
)

func main() {
	listen := flag.String("listen", ":8080", "TCP address to listen on")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: activate -listen ADDR PROGRAM [ARG...]")
		os.Exit(2)
	}
	if err := activate(*listen, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "activate: %v\n", err)
		os.Exit(1)
	}
}

// activate returns only on failure: on success the process is the program.
func activate(addr string, argv []string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	f, err := l.(*net.TCPListener).File() // a blocking duplicate, without close-on-exec once dup'd to 3
	if err != nil {
		return err
	}
	if err := syscall.Dup3(int(f.Fd()), 3, 0); err != nil {
		return fmt.Errorf("making the listener descriptor 3: %w", err)
	}
	env := append(os.Environ(), "LISTEN_FDS=1", "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	prog := argv[0]
	if err := syscall.Exec(prog, argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", prog, err)
	}
	return nil
}

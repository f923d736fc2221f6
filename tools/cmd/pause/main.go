// Command pause is the sandbox process of a node's Pods (the image
// containerd's CRI plugin names as sandbox_image): it holds the Pod's
// namespaces open, doing nothing, until SIGTERM or SIGINT, and reaps any
// child it inherits, as PID 1 of a Pod that shares its process namespace.
//
// Exit status 0 on SIGTERM or SIGINT; it takes no arguments.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}

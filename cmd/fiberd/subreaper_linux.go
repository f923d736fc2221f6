package main

import (
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// becomeSubreaper marks fiberd a child subreaper (PR_SET_CHILD_SUBREAPER),
// so the fibers of a zygote that dies are reparented to fiberd, which the
// proc backend then reaps, rather than to the pid namespace's init. In a
// grant Pod fiberd is that init anyway; on a host this makes it behave the
// same. A failure is logged as a warning and fiberd runs on: orphans then
// go to init, which reaps them. main's run calls it once at start-up.
func becomeSubreaper(log logr.Logger) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		log.Info("Could not become a child subreaper: fibers of a dead zygote go to init, which must reap them", "err", err.Error())
		return
	}
	log.V(1).Info("Marked fiberd a child subreaper: it reaps the fibers of zygotes that die")
}

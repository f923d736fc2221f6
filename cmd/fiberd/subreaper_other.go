//go:build !linux

package main

import "github.com/go-logr/logr"

// becomeSubreaper does nothing off Linux, where there are no fibers to
// reap (the backends are Linux-only).
func becomeSubreaper(logr.Logger) {}

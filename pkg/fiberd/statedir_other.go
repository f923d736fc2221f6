//go:build !linux

package fiberd

import (
	"io/fs"
	"os"
)

// fileUID does not know owners off Linux: fiberd runs fibers on Linux
// only, and elsewhere judges its directories' modes alone.
func fileUID(fs.FileInfo) (uid int, known bool) { return 0, false }
func fileGID(fs.FileInfo) (gid int, known bool) { return 0, false }

// lockState takes no lock off Linux.
func lockState(string) (*os.File, error) { return nil, nil }

// probeState finds no holder off Linux.
func probeState(string) error { return nil }

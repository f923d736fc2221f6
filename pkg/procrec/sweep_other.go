//go:build !linux

package procrec

import (
	"context"
	"errors"
)

// Swept is what Sweep ended.
type Swept struct {
	Cgroups, Processes, Records int
	Left                        []Left
}

// Left is a cgroup record Sweep did not act on.
type Left struct {
	Record, Cgroup string
}

// Sweep is unsupported off Linux: fiberd runs fibers on Linux only.
func (d *Dir) Sweep(ctx context.Context, cgroupRoot string) (Swept, error) {
	return Swept{}, errors.ErrUnsupported
}

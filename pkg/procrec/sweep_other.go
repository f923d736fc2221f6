//go:build !linux

package procrec

import (
	"context"
	"errors"
)

// Swept is what Sweep ended.
type Swept struct {
	Cgroups, Processes, Records int
}

// Sweep is unsupported off Linux: fiberd runs fibers on Linux only.
func (d *Dir) Sweep(ctx context.Context) (Swept, error) {
	return Swept{}, errors.ErrUnsupported
}

package backend

import (
	"errors"
	"fmt"
)

// The backend's errors. Beside them the backends wrap the classes of
// pkg/core: core.ErrInvalid for a malformed request, core.ErrTierGap for a
// spec that cannot be served at the tier, core.ErrNotFound for a fiber not
// running. The Checkpointer's sentinels are in a class too (core.NewError):
// ErrBusy in core.ErrBusy, ErrTooLarge in core.ErrInsufficientStorage.
// ErrCold is a cause of a capacity miss, in no class; ErrImageUnusable and
// ErrNoSpace are in none yet (the agent's wire table names ErrNoSpace).
var (
	// ErrCold is wrapped by Clone when the grant is not warm: never
	// warmed, stopped, or its zygote died. The agent answers it as a
	// capacity miss.
	ErrCold = errors.New("template is cold")

	// errClosed is returned by calls after Close.
	errClosed = fmt.Errorf("backend closed: %w", ErrCold)
)

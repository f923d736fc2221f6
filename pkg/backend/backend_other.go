//go:build !linux

package backend

import (
	"context"
	"errors"
	"fmt"

	"fiberd.io/fiberd/pkg/core"
)

var errUnsupported = fmt.Errorf("backend: fibers need Linux: %w", errors.ErrUnsupported)

// Proc is the WARM tier backend. Off Linux it cannot be created.
type Proc struct{ unsupported }

// Exec is the BASIC tier backend. Off Linux it cannot be created.
type Exec struct{ unsupported }

// NewProc fails off Linux with an error wrapping errors.ErrUnsupported.
func NewProc(cfg Config) (*Proc, error) { return nil, errUnsupported }

// NewExec fails off Linux with an error wrapping errors.ErrUnsupported.
func NewExec(cfg Config) (*Exec, error) { return nil, errUnsupported }

type unsupported struct{}

func (unsupported) Tier() core.Tier                         { return "" }
func (unsupported) Warm(context.Context, WarmRequest) error { return errUnsupported }
func (unsupported) Warmed(string) bool                      { return false }
func (unsupported) Isolation() IsolationSupport {
	return IsolationSupport{Level: IsolationNone, Missing: "fibers need Linux"}
}
func (unsupported) GrantIsolation(string) Isolation { return "" }
func (unsupported) Clone(context.Context, CloneRequest) (Fiber, error) {
	return Fiber{}, errUnsupported
}
func (unsupported) Kill(context.Context, core.Fence) error { return errUnsupported }
func (unsupported) Stop(context.Context, string) error     { return errUnsupported }
func (unsupported) Exits() <-chan Exit                     { return nil }
func (unsupported) Close() error                           { return nil }

// SetSpares, RenewSpares, Spares and SparePIDs do nothing off Linux.
func (*Proc) SetSpares(string, int, int) {}
func (*Proc) RenewSpares(string)         {}
func (*Proc) Spares(string) SpareStatus  { return SpareStatus{} }
func (*Proc) SparePIDs(string) []int     { return nil }

// CheckpointSupport fails off Linux with an error wrapping
// errors.ErrUnsupported and core.ErrTierGap.
func (*Proc) CheckpointSupport(context.Context) error {
	return fmt.Errorf("%w: %w", errUnsupported, core.ErrTierGap)
}

// CheckpointIsolated fails off Linux as CheckpointSupport does.
func (p *Proc) CheckpointIsolated(Isolation) error {
	return p.CheckpointSupport(context.Background())
}

// Park fails off Linux.
func (p *Proc) Park(ctx context.Context, _ ParkRequest) (Image, error) {
	return Image{}, p.CheckpointSupport(ctx)
}

// Resume fails off Linux.
func (p *Proc) Resume(ctx context.Context, _ ResumeRequest) (Resumed, error) {
	return Resumed{}, p.CheckpointSupport(ctx)
}

var (
	_ Checkpointer = (*Proc)(nil)
	_ Backend      = (*Proc)(nil)
	_ Backend      = (*Exec)(nil)
)

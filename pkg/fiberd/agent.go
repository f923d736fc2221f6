package fiberd

import (
	"context"
	"errors"
	"net"
)

// Agent is fiberd: it admits the grants its home delivers, keeps their
// templates warm, and serves Clone on its HTTP API. New builds it (nothing
// is served yet); Run serves until its context ends and then drains.
type Agent struct {
	cfg Config
}

// New validates cfg, creates the private state directory, builds the
// verifier, bumps the epoch, makes the ledger and binds the API listeners
// and the admin socket. It serves nothing: Run does. ctx bounds the work New
// does (asking the home for its endpoint host among it). On failure
// everything New acquired is released and cfg.Home is closed.
func New(ctx context.Context, cfg Config) (*Agent, error) {
	return nil, errors.New("fiberd: not implemented yet")
}

// Run serves until ctx ends, then drains: it stops accepting, releases every
// fiber, stops every zygote, closes the home and returns nil once every
// goroutine it started has ended. It returns an error only when serving
// could not start. Run may be called once.
func (a *Agent) Run(ctx context.Context) error { return errors.New("fiberd: not implemented yet") }

// Close releases what New acquired when Run is never called; after Run it
// does nothing. It is idempotent.
func (a *Agent) Close() {}

// Addr is the bound address of the TCP listener (useful with Listen
// "127.0.0.1:0"), nil when there is none.
func (a *Agent) Addr() net.Addr { return nil }

// Epoch is the epoch fences are minted in now.
func (a *Agent) Epoch() uint64 { return 0 }

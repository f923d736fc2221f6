package home

import (
	"context"
	"strconv"

	"fiberd.io/fiberd/pkg/core"
)

// Home is where fiberd runs, seen from the agent. It answers how grants
// arrive (Grants), whether the control plane is alive (Health), which cgroup
// fibers are carved under (CgroupRoot), which devices a template gets
// (Devices), how readiness is published (PublishReady, Ready), what the
// home's scope is (Scope), and which grant the home fetched itself
// (OwnGrant, SelfAdmitUID).
//
// The agent builds a home, calls Grants once, then Run in a goroutine of its
// own, and Close when it stops. Homes may implement the optional interfaces
// of pkg/fiberd: ScopeLoser, EndpointHoster and IssuerOverrider.
type Home interface {
	// Name is what the home is selected by, such as "standalone".
	Name() string
	// Grants returns the lane of grant events. A nil channel with a nil
	// error means grants arrive only inside Clone requests. The channel is
	// closed when ctx ends.
	Grants(ctx context.Context) (<-chan GrantEvent, error)
	// Health is the control plane's liveness by the home's own signal.
	Health() *core.SourceHealth
	// CgroupRoot is the cgroup v2 directory fiberd may carve, "" for none.
	CgroupRoot() string
	// Devices is the device channel for grant g's template, and a release
	// function called when the grant is yielded.
	Devices(ctx context.Context, g core.Grant) (core.DeviceChannel, func(), error)
	// PublishReady records that grant grantUID's template is warm, or no
	// longer is, and publishes the home's readiness when it changes.
	PublishReady(ctx context.Context, grantUID string, ready bool) error
	// Ready reports whether any grant's template is warm.
	Ready() bool
	// Scope is the facts of where the home runs.
	Scope() []core.ScopeClaim
	// OwnGrant is the home's own grant token, if it fetches one.
	OwnGrant() ([]byte, bool)
	// SelfAdmitUID is the UID OwnGrant is admitted under, "" for none.
	SelfAdmitUID() string
	// Run drives the home's background work until ctx ends, and returns
	// only once all of it has stopped.
	Run(ctx context.Context)
	// Close releases what the constructor acquired. It is idempotent.
	Close()
}

// EventKind says what happened to a grant in the lane.
type EventKind int

const (
	// GrantAdded is a grant token that is new or changed.
	GrantAdded EventKind = iota + 1
	// GrantRemoved is a grant whose token is gone.
	GrantRemoved
)

// String is "GrantAdded" or "GrantRemoved".
func (k EventKind) String() string {
	switch k {
	case GrantAdded:
		return "GrantAdded"
	case GrantRemoved:
		return "GrantRemoved"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// GrantEvent is one event of a home's lane.
type GrantEvent struct {
	// Kind is GrantAdded or GrantRemoved.
	Kind EventKind
	// UID is the grant's UID, read without verification (see
	// grant.PeekUID); the agent verifies Token before trusting it.
	UID string
	// Token is the compact JWT; nil for GrantRemoved.
	Token []byte
	// Path is the file the event came from, for logs.
	Path string
}

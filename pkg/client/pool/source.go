package pool

import (
	"cmp"
	"slices"
	"sync"
)

// Endpoint is one grant Pod of a pool that may be sent Clones: ready (its
// readiness gate fiberd.io/zygote-ready set) and serving (not draining).
type Endpoint struct {
	// PodName is the grant Pod's name, "<pool>-<ordinal>"; it names the
	// Pod in errors and logs.
	PodName string
	// PodUID is the grant Pod's UID, which is also its grant's UID: the
	// Clone's grantUID on that Pod, and the first part of the id of every
	// fiber it serves ("uid/epoch/seq"). Required: it is the Endpoint's
	// identity.
	PodUID string
	// Addr is fiberd's API on the Pod, "host:port" (the Pod IP and the
	// port named "api"). Required.
	Addr string
	// Node is the node the Pod runs on, for logs; may be empty.
	Node string
}

// Snapshot is a Source's view of the pool at one moment.
type Snapshot struct {
	// Version changes whenever Endpoints does; a Pool rebuilds its view of
	// the Pods only then.
	Version uint64
	// Endpoints are the Pods that may be sent Clones now, sorted by
	// PodUID, no two with the same PodUID. Read-only: a Source shares the
	// slice with every caller.
	Endpoints []Endpoint
	// Synced is false until the Source has seen the pool's state once (a
	// watch that has not listed yet); a Pool with no Endpoints then says
	// so in its error.
	Synced bool
}

// Source tells a Pool which grant Pods it may send Clones to. Snapshot is
// called on every Clone, Release and Park, from many goroutines at once: it
// must be cheap (no API call) and safe for concurrent use.
//
// EndpointSlices (NewSliceSource) is the source for a pool in Kubernetes;
// StaticSource is a fixed list, for tests and for agents reached without a
// cluster.
type Source interface {
	Snapshot() Snapshot
}

// StaticSource is a Source whose endpoints are set by its owner. The zero
// value is not usable; build one with NewStaticSource. It is safe for
// concurrent use.
type StaticSource struct {
	mu   sync.Mutex
	snap Snapshot
}

// NewStaticSource returns a synced source listing eps (see Set).
func NewStaticSource(eps ...Endpoint) *StaticSource {
	s := &StaticSource{}
	s.Set(eps...)
	return s
}

// Set replaces the endpoints with eps, sorted by PodUID; of two endpoints
// with the same PodUID the first is kept. The version moves on even when
// the set is the same.
func (s *StaticSource) Set(eps ...Endpoint) {
	norm := normalize(eps)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snap = Snapshot{Version: s.snap.Version + 1, Endpoints: norm, Synced: true}
}

// Snapshot is the endpoints last Set.
func (s *StaticSource) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

// normalize returns a sorted copy of eps without endpoints lacking a UID or
// an address, and without a second endpoint of the same UID.
func normalize(eps []Endpoint) []Endpoint {
	out := make([]Endpoint, 0, len(eps))
	for _, e := range eps {
		if e.PodUID != "" && e.Addr != "" {
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b Endpoint) int { return cmp.Compare(a.PodUID, b.PodUID) })
	return slices.CompactFunc(out, func(a, b Endpoint) bool { return a.PodUID == b.PodUID })
}

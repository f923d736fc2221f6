package backend

import (
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
)

// Isolation is how far a grant's fibers are kept from other grants' fibers,
// from each other and from fiberd. The levels are ordered: each gives what
// the one before gives, and more.
type Isolation string

const (
	// IsolationNone runs fibers as fiberd's own user in fiberd's
	// namespaces: a fiber can list, signal and trace every other fiber,
	// read their environment and files, and reach fiberd's state.
	IsolationNone Isolation = "none"
	// IsolationGrant starts each grant's zygote (and each exec fiber)
	// under a user and group of its own (from Config.IDs), with
	// no_new_privs, in user, mount, PID, IPC and UTS namespaces of its
	// own, with a /proc of that PID namespace and a private /tmp,
	// /var/tmp and /dev/shm; with "network": "none" also in a network
	// namespace with loopback only. The fibers of a grant share all of
	// it, at no cost per clone.
	IsolationGrant Isolation = "grant"
	// IsolationFiber is IsolationGrant, and each fiber of a zygote also
	// gets a PID namespace of its own (it is PID 1 there), with its own
	// /proc, and a private /tmp, /var/tmp and /dev/shm, so sessions of
	// one grant do not see each other's processes or scratch files. An
	// exec fiber is isolated on its own anyway and gets this level too.
	IsolationFiber Isolation = "fiber"
)

// rank orders the levels; an unknown level ranks below IsolationNone.
func (i Isolation) rank() int {
	switch i {
	case IsolationNone, "":
		return 0
	case IsolationGrant:
		return 1
	case IsolationFiber:
		return 2
	}
	return -1
}

// AtLeast reports whether i gives everything want gives. The zero value
// counts as IsolationNone.
func (i Isolation) AtLeast(want Isolation) bool { return i.rank() >= want.rank() }

// String is the level's name; the zero value reads "none".
func (i Isolation) String() string {
	if i == "" {
		return string(IsolationNone)
	}
	return string(i)
}

// least is the lower of a and b.
func least(a, b Isolation) Isolation {
	if a.rank() <= b.rank() {
		return a
	}
	return b
}

// ParseIsolation reads "none", "grant" or "fiber" (the form cmd/fiberd's
// -isolation flag takes); anything else is an error naming the choices.
func ParseIsolation(s string) (Isolation, error) {
	switch i := Isolation(s); i {
	case IsolationNone, IsolationGrant, IsolationFiber:
		return i, nil
	}
	return "", fmt.Errorf("isolation %q: want none, grant or fiber", s)
}

// IsolationSupport is what a backend gives on this host. The backend finds
// it when it is created, by starting a probe the way it starts a zygote.
type IsolationSupport struct {
	// Level is the most isolation a grant gets: Config.Isolation, or less
	// where the host does not allow it.
	Level Isolation
	// NetworkNone says a template with "network": "none" can be warmed;
	// when false such a template is refused with core.ErrTierGap.
	NetworkNone bool
	// EndpointsApart says the TCP endpoints of isolated grants are kept
	// apart: a fiber of one grant cannot connect to another grant's
	// fiber's listener (the endpoint guard: SO_MARK and an nftables table,
	// design decision 102). False at IsolationNone, and where nft or
	// nf_tables is missing.
	EndpointsApart bool
	// Missing says in one sentence what keeps Level below
	// Config.Isolation, or NetworkNone or EndpointsApart false, and how
	// to fix it. Empty when nothing is missing.
	Missing string
}

// addMissing adds a sentence to Missing.
func (s *IsolationSupport) addMissing(why string) {
	if s.Missing == "" {
		s.Missing = why
		return
	}
	s.Missing += "; " + why
}

// The default range of ids grants run as: 65536 ids from 1879048192
// (0x70000000), above the ranges systemd hands to users, dynamic users and
// containers, and below 2^31.
const (
	DefaultIDFirst uint32 = 0x70000000
	DefaultIDCount uint32 = 65536
)

// ErrNoIDs is wrapped by Warm when every id of Config.IDs is held by a warm
// grant.
var ErrNoIDs = errors.New("no free id for the grant's user")

// IDPool hands out the user (and group) ids isolated grants run as: two
// ids per warm grant, never the same for two grants at once. The grant's
// processes run as the first (acquire's id); the second (rootID) is what
// root of the grant's user namespace maps to, which none of its processes
// runs as: CRIU needs root mapped to dump and restore the namespace (a
// parked fiber of an isolated grant). A grant gets the same ids each time
// it is warmed while they are free, so files it leaves in its home
// directory stay its own across restarts of fiberd. Both backends of one
// fiberd must share one pool (Config.IDs); it is safe for concurrent use.
type IDPool struct {
	first, count uint32

	mu      sync.Mutex        // guards byGrant and held
	byGrant map[string]idHold // grant UID -> its id and how many hold it
	held    map[uint32]string // id -> the grant UID holding it
}

type idHold struct {
	id    uint32
	holds int
}

// NewIDPool returns a pool of count ids from first: count/2 grants at
// once. The range must hold two ids at least, must not include 0 and must
// end below 2^32-1 (the kernel's invalid id); the ids should belong to no
// user of the host, since a grant's processes can touch whatever those
// users own.
func NewIDPool(first, count uint32) (*IDPool, error) {
	switch {
	case count < 2:
		return nil, fmt.Errorf("backend: id range of %d ids: give at least two (each grant takes two)", count)
	case first == 0:
		return nil, fmt.Errorf("backend: id range starts at 0 (root): start above every user of the host, e.g. %d", DefaultIDFirst)
	case uint64(first)+uint64(count) > 1<<32-1:
		return nil, fmt.Errorf("backend: id range %d+%d reaches 2^32-1, the invalid id", first, count)
	}
	return &IDPool{first: first, count: count, byGrant: map[string]idHold{}, held: map[uint32]string{}}, nil
}

// acquire returns the grant's id, holding it (and rootID of it) once
// more: the id the grant already holds, else the first free pair from a
// hash of its UID. It fails with ErrNoIDs when every pair is held.
func (p *IDPool) acquire(grantUID string) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, ok := p.byGrant[grantUID]; ok {
		h.holds++
		p.byGrant[grantUID] = h
		return h.id, nil
	}
	f := fnv.New32a()
	_, _ = f.Write([]byte(grantUID))
	pairs := p.count / 2
	start := f.Sum32() % pairs
	for i := uint32(0); i < pairs; i++ {
		id := p.first + 2*((start+i)%pairs)
		if _, busy := p.held[id]; !busy {
			p.held[id] = grantUID
			p.byGrant[grantUID] = idHold{id: id, holds: 1}
			return id, nil
		}
	}
	return 0, fmt.Errorf("grant %q: all %d ids from %d are held (two per grant): %w", grantUID, p.count, p.first, ErrNoIDs)
}

// rootID is the id root of the user namespace of the grant running as id
// maps to: the second of the grant's pair.
func rootID(id uint32) uint32 { return id + 1 }

// release drops one hold of the grant's id; the last frees it.
func (p *IDPool) release(grantUID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.byGrant[grantUID]
	if !ok {
		return
	}
	if h.holds--; h.holds > 0 {
		p.byGrant[grantUID] = h
		return
	}
	delete(p.byGrant, grantUID)
	delete(p.held, h.id)
}

package pool

import (
	"cmp"
	"container/list"
	"math/rand/v2"
	"slices"
	"time"
)

// picker hands out, one at a time, the Pods a Clone of session asks, each
// at most once. Its next is called with Pool.mu held; the weights are
// computed without it.
//
// A Clone with a session goes first to home, the Pod that served the
// session last (its running fiber or parked image is there), when it is
// listed; then to the other Pods by rendezvous hashing of the session
// (highest weight first), the Pods that could not be reached lately last.
// The hash makes two clients that never met agree on a new session's Pod,
// and moves only the sessions of a Pod that joins or leaves.
//
// A Clone without a session asks the Pods that neither missed nor failed
// lately first, then those that missed, then those that failed; within
// each, the fewest of this client's Clones under way first, and Pods
// equal on both in random order, so concurrent Clones and clients spread.
//
// Each next scans the Pods once (no sort): a Clone served by its first Pod
// costs one scan, and one hash per Pod with a session.
type picker struct {
	listed  []*pod // the Pool's listed Pods when the Clone began; not mutated
	session string
	home    int      // index of the session's Pod in listed, -1 for none
	weights []uint64 // rendezvous weights, parallel to listed, with a session
	tried   []bool
	left    int // Pods not handed out yet
}

// newPicker returns the picker of a Clone of session over listed, home
// being the session's Pod or nil. It takes no lock: listed is never
// mutated once built.
func newPicker(listed []*pod, session string, home *pod) *picker {
	pk := &picker{listed: listed, session: session, home: -1, tried: make([]bool, len(listed)), left: len(listed)}
	if session == "" {
		return pk
	}
	pk.weights = make([]uint64, len(listed))
	for i, pd := range listed {
		pk.weights[i] = rendezvous(session, pd.ep.PodUID)
		if pd == home {
			pk.home = i
		}
	}
	return pk
}

// next is the next Pod to ask, nil when every Pod was handed out. The
// Pools's mu is held: the Pods' counters are read.
func (pk *picker) next(now time.Time) *pod {
	if pk.left == 0 {
		return nil
	}
	best, ties := -1, 0
	if pk.home >= 0 && !pk.tried[pk.home] {
		best = pk.home
	} else {
		var bk pickKey
		for i := range pk.listed {
			if pk.tried[i] {
				continue
			}
			k := pk.key(i, now)
			if best < 0 {
				best, bk, ties = i, k, 1
				continue
			}
			switch c := k.compare(bk); {
			case c < 0:
				best, bk, ties = i, k, 1
			case c == 0:
				// Each of the tied Pods ends up chosen with equal odds.
				ties++
				if rand.IntN(ties) == 0 {
					best = i
				}
			}
		}
	}
	pk.tried[best] = true
	pk.left--
	return pk.listed[best]
}

// pickKey ranks a Pod for a picker: the lower rank first, then the lower
// load, then the higher weight.
type pickKey struct {
	rank int
	load int
	w    uint64
}

func (a pickKey) compare(b pickKey) int {
	if c := cmp.Compare(a.rank, b.rank); c != 0 {
		return c
	}
	if c := cmp.Compare(a.load, b.load); c != 0 {
		return c
	}
	return cmp.Compare(b.w, a.w)
}

// key is Pod i's pickKey: with a session, whether it is down and its
// weight; without, its rank and this client's Clones under way there.
func (pk *picker) key(i int, now time.Time) pickKey {
	pd := pk.listed[i]
	if pk.weights != nil {
		return pickKey{rank: downRank(pd, now), w: pk.weights[i]}
	}
	return pickKey{rank: rank(pd, now), load: pd.inflight}
}

// rank is 0 for a Pod in good standing, 1 for one that missed lately, 2 for
// one that could not be reached lately.
func rank(pd *pod, now time.Time) int {
	switch {
	case now.Before(pd.down):
		return 2
	case now.Before(pd.missed):
		return 1
	}
	return 0
}

// downRank is 1 for a Pod that could not be reached lately, 0 otherwise.
func downRank(pd *pod, now time.Time) int {
	if now.Before(pd.down) {
		return 1
	}
	return 0
}

// rendezvous is the weight of Pod uid for session: FNV-1a over the session,
// a zero byte and the UID, then a 64-bit finalizer so that UIDs alike in
// their last bytes still spread. It is the same in every process and
// release: clients rely on agreeing on it.
func rendezvous(session, uid string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(session); i++ {
		h ^= uint64(session[i])
		h *= prime
	}
	h *= prime // the zero byte between the two
	for i := 0; i < len(uid); i++ {
		h ^= uint64(uid[i])
		h *= prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// sortByLeft sorts departed Pods by when they left, oldest first.
func sortByLeft(ps []*pod) {
	slices.SortFunc(ps, func(a, b *pod) int { return a.left.Compare(b.left) })
}

// sessionCache maps sessions to the UID of the Pod that served them last,
// forgetting the least recently used beyond its size. It is not safe for
// concurrent use: Pool.mu guards it.
type sessionCache struct {
	max   int
	order *list.List // of *sessionEntry, most recent first
	by    map[string]*list.Element
}

type sessionEntry struct {
	session, uid string
}

func newSessionCache(max int) *sessionCache {
	return &sessionCache{max: max, order: list.New(), by: map[string]*list.Element{}}
}

// get is the session's Pod UID, marking the session used.
func (c *sessionCache) get(session string) (string, bool) {
	el, ok := c.by[session]
	if !ok {
		return "", false
	}
	c.order.MoveToFront(el)
	return el.Value.(*sessionEntry).uid, true
}

// put records the session's Pod UID, forgetting the least recently used
// session when over the size.
func (c *sessionCache) put(session, uid string) {
	if el, ok := c.by[session]; ok {
		el.Value.(*sessionEntry).uid = uid
		c.order.MoveToFront(el)
		return
	}
	c.by[session] = c.order.PushFront(&sessionEntry{session: session, uid: uid})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.by, last.Value.(*sessionEntry).session)
	}
}

// len is how many sessions are remembered.
func (c *sessionCache) len() int { return c.order.Len() }

package pool

import (
	"cmp"
	"container/list"
	"math/rand/v2"
	"slices"
	"time"
)

// order is the order in which a Clone of session asks the listed Pods.
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
func order(listed []*pod, session string, home *pod, now time.Time) []*pod {
	out := make([]*pod, 0, len(listed))
	if session != "" {
		if home != nil {
			out = append(out, home)
		}
		rest := make([]weighted, 0, len(listed))
		for _, pd := range listed {
			if pd != home {
				rest = append(rest, weighted{pd, rendezvous(session, pd.ep.PodUID)})
			}
		}
		slices.SortFunc(rest, func(a, b weighted) int {
			if c := cmp.Compare(downRank(a.pd, now), downRank(b.pd, now)); c != 0 {
				return c
			}
			return cmp.Compare(b.w, a.w)
		})
		for _, r := range rest {
			out = append(out, r.pd)
		}
		return out
	}
	out = append(out, listed...)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	slices.SortStableFunc(out, func(a, b *pod) int {
		if c := cmp.Compare(rank(a, now), rank(b, now)); c != 0 {
			return c
		}
		return cmp.Compare(a.inflight, b.inflight)
	})
	return out
}

type weighted struct {
	pd *pod
	w  uint64
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

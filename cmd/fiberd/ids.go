package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"fiberd.io/fiberd/pkg/backend"
)

// idRange is the pool of user and group ids isolated grants run as
// (backend.NewIDPool): count ids from first. The zero value means "choose
// at start" (chooseIDs).
type idRange struct{ first, count uint32 }

func (r idRange) String() string {
	return fmt.Sprintf("%d-%d", r.first, uint64(r.first)+uint64(r.count)-1)
}

// parseIDRange reads -ids, FIRST-LAST (inclusive); "" is the zero idRange.
func parseIDRange(s string) (idRange, error) {
	if s == "" {
		return idRange{}, nil
	}
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	last, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	switch {
	case !ok || err1 != nil || err2 != nil:
		return idRange{}, fmt.Errorf("%q: want FIRST-LAST, two ids such as 32768-49151", s)
	case first == 0:
		return idRange{}, fmt.Errorf("%q starts at 0 (root): start above every user of the host or the Pod", s)
	case last < first:
		return idRange{}, fmt.Errorf("%q ends before it starts", s)
	case last >= math.MaxUint32:
		return idRange{}, fmt.Errorf("%q reaches %d, the invalid id", s, uint32(math.MaxUint32))
	}
	return idRange{first: uint32(first), count: uint32(last - first + 1)}, nil
}

// idExtent is one line of /proc/self/uid_map or gid_map, inside this
// process's user namespace: count ids from first are mapped.
type idExtent struct{ first, count uint64 }

// parseIDMap reads the text of an id map file (lines of "inside outside
// count").
func parseIDMap(text string) ([]idExtent, error) {
	var out []idExtent
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("id map line %q: want three numbers", line)
		}
		first, err1 := strconv.ParseUint(f[0], 10, 32)
		count, err2 := strconv.ParseUint(f[2], 10, 33)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("id map line %q: want three numbers", line)
		}
		out = append(out, idExtent{first: first, count: count})
	}
	return out, nil
}

// covers says whether the extents map every id of r.
func covers(m []idExtent, r idRange) bool {
	lo, hi := uint64(r.first), uint64(r.first)+uint64(r.count)
	for _, e := range m {
		if e.first <= lo && hi <= e.first+e.count {
			return true
		}
	}
	return false
}

// defaultIDs picks the pool isolated grants run as when -ids is not given.
// A grant's id must be mapped in fiberd's own user namespace (the kernel
// refuses an id map naming an id the writer's namespace does not map). On a
// host, and in a container sharing the host's ids, that holds for
// backend.DefaultIDFirst and DefaultIDCount, which stay the default. In a
// user-namespaced Pod (hostUsers: false) the namespace maps 65536 ids,
// 0-65535, and the default pool lies outside it: the pool is then the
// second quarter from the top of the widest range both maps hold (32768-
// 49151 of 0-65535), clear of root and the system's low ids, and of the
// top where nobody (65534) and the images' own user (65532) are. own are
// fiberd's uid and gid, which a pool must never hold.
func defaultIDs(uidMap, gidMap []idExtent, own ...uint32) (idRange, error) {
	def := idRange{first: backend.DefaultIDFirst, count: backend.DefaultIDCount}
	if covers(uidMap, def) && covers(gidMap, def) {
		return def, nil
	}
	var best idExtent
	for _, u := range uidMap {
		for _, g := range gidMap {
			lo, hi := max(u.first, g.first), min(u.first+u.count, g.first+g.count)
			if hi > lo && hi-lo > best.count {
				best = idExtent{first: lo, count: hi - lo}
			}
		}
	}
	quarter := best.count / 4
	if quarter == 0 {
		return idRange{}, fmt.Errorf("this user namespace maps too few ids (uid map %v, gid map %v) for a pool of grant ids: give -ids", uidMap, gidMap)
	}
	r := idRange{first: uint32(best.first + 2*quarter), count: uint32(min(quarter, uint64(backend.DefaultIDCount)))}
	if r.first == 0 {
		r.first, r.count = 1, r.count-1
	}
	for _, id := range own {
		if id >= r.first && uint64(id) < uint64(r.first)+uint64(r.count) {
			return idRange{}, fmt.Errorf("the ids %s this user namespace leaves for grants hold fiberd's own id %d: give -ids", r, id)
		}
	}
	return r, nil
}

// chooseIDs is defaultIDs for this process, from its id maps.
func chooseIDs() (idRange, error) {
	read := func(name string) ([]idExtent, error) {
		b, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			// No /proc, or not Linux: the default pool, which the backends
			// will refuse or not use.
			return []idExtent{{first: 0, count: math.MaxUint32}}, nil
		}
		if err != nil {
			return nil, err
		}
		return parseIDMap(string(b))
	}
	u, err := read("/proc/self/uid_map")
	if err != nil {
		return idRange{}, err
	}
	g, err := read("/proc/self/gid_map")
	if err != nil {
		return idRange{}, err
	}
	return defaultIDs(u, g, uint32(os.Getuid()), uint32(os.Getgid()))
}

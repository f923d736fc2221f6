package core

import (
	"fmt"
	"strconv"
	"strings"
)

// Fence names one incarnation of a fiber: the grant it runs under, the
// agent's epoch when it was created, and its sequence number within the
// grant. It is printed "uid/epoch/seq" and doubles as the fiber id.
type Fence struct {
	GrantUID string `json:"grantUID"`
	Epoch    uint64 `json:"epoch"`
	Seq      uint64 `json:"seq"`
}

// String is the fence as "uid/epoch/seq", the form ParseFence reads.
func (f Fence) String() string {
	return f.GrantUID + "/" + strconv.FormatUint(f.Epoch, 10) + "/" + strconv.FormatUint(f.Seq, 10)
}

// ParseFence reads "uid/epoch/seq". The uid must be non-empty and hold no
// '/', epoch and seq must be decimal unsigned integers. Anything else is an
// error wrapping ErrInvalid.
func ParseFence(s string) (Fence, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[0] == "" {
		return Fence{}, fmt.Errorf("fence %q: want uid/epoch/seq: %w", s, ErrInvalid)
	}
	epoch, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return Fence{}, fmt.Errorf("fence %q: epoch: %w", s, ErrInvalid)
	}
	seq, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return Fence{}, fmt.Errorf("fence %q: seq: %w", s, ErrInvalid)
	}
	return Fence{GrantUID: parts[0], Epoch: epoch, Seq: seq}, nil
}

// Compare orders two fences of the same grant: the higher epoch wins, then
// the higher seq. It returns -1, 0 or +1 as f is older than, the same as, or
// newer than o, and ok false when the fences belong to different grants,
// which are not ordered.
func (f Fence) Compare(o Fence) (cmp int, ok bool) {
	if f.GrantUID != o.GrantUID {
		return 0, false
	}
	switch {
	case f.Epoch != o.Epoch:
		if f.Epoch > o.Epoch {
			return 1, true
		}
		return -1, true
	case f.Seq != o.Seq:
		if f.Seq > o.Seq {
			return 1, true
		}
		return -1, true
	}
	return 0, true
}

// Supersedes reports whether f is strictly newer than o under the ordering
// rule. Fences of different grants never supersede each other.
func (f Fence) Supersedes(o Fence) bool {
	c, ok := f.Compare(o)
	return ok && c > 0
}

package core

import (
	"fmt"
	"time"
)

// MaxTokenSize is the largest grant token, 8 KiB (docs/architecture.md,
// The grant token). Every reader of tokens refuses a larger one before it
// parses or even reads it whole: the verifier (grant.MaxTokenSize), the file lane
// (home.MaxTokenSize) and the Kubernetes home's grant fetch.
const MaxTokenSize = 8 << 10

// Tier is the isolation and start-up class a fiber is served with. Tiers are
// ordered: BASIC < WARM < CHECKPOINT. A grant's MinTier is the lowest tier it
// accepts; a backend that cannot reach it answers with a tier gap.
type Tier string

const (
	// TierBasic is a fiber started by fork+exec of the template: a cold start.
	TierBasic Tier = "BASIC"
	// TierWarm is a fiber forked from the grant's warm zygote.
	TierWarm Tier = "WARM"
	// TierCheckpoint is a fiber that can also be parked and resumed.
	TierCheckpoint Tier = "CHECKPOINT"
)

// Rank orders tiers: BASIC is 1, WARM 2, CHECKPOINT 3. The empty tier and
// unknown tiers rank 0, below every known tier.
func (t Tier) Rank() int {
	switch t {
	case TierBasic:
		return 1
	case TierWarm:
		return 2
	case TierCheckpoint:
		return 3
	}
	return 0
}

// ParseTier returns the tier named s. The empty string is TierBasic, the
// default of a grant that names none. Anything else is an error.
func ParseTier(s string) (Tier, error) {
	switch t := Tier(s); t {
	case "":
		return TierBasic, nil
	case TierBasic, TierWarm, TierCheckpoint:
		return t, nil
	}
	return "", fmt.Errorf("unknown tier %q: want BASIC, WARM or CHECKPOINT", s)
}

// Fibers is a grant's capacity: at most Max fibers run at once, and the
// agent keeps min(Warm, Max - running) spare fibers forked ahead, so a
// Clone hands one over instead of forking (backend.Sparer; a template that
// does not hand spares over forks every Clone). Warm is advisory: spares
// are no capacity and no promise.
type Fibers struct {
	Max  int `json:"max"`
	Warm int `json:"warm,omitempty"`
}

// DeviceRequest is what a grant asks of the node's devices, for example one
// device of class "gpu". The zero value asks for nothing.
type DeviceRequest struct {
	Class string `json:"class"`
	Count int    `json:"count"`
}

// Grant is a verified capacity block: the home may run up to Fibers.Max
// fibers of Template until Expiry. pkg/grant builds it from a token; the
// agent's ledger admits it.
type Grant struct {
	// UID is the grant's id, the token's jti: a DNS-1123 label.
	UID string
	// Issuer is the control plane that signed the grant (the iss claim).
	Issuer string
	// Audience is the home the grant is for (the aud claim): the node id,
	// in Kubernetes the Pod name.
	Audience string
	// Template is what the grant runs, "name@sha256:<64 hex>".
	Template string
	// Fibers is the capacity.
	Fibers Fibers
	// WBudget is the memory a fiber may dirty, in bytes. Zero is no budget.
	WBudget int64
	// MinTier is the lowest tier the grant accepts.
	MinTier Tier
	// Devices is the device request; the zero value requests none.
	Devices DeviceRequest
	// IssuedAt and Expiry are the iat and exp claims.
	IssuedAt time.Time
	Expiry   time.Time
	// Token is the compact JWT the grant was read from.
	Token []byte
}

// Lease is how long the grant was issued for: Expiry - IssuedAt.
func (g Grant) Lease() time.Duration { return g.Expiry.Sub(g.IssuedAt) }

// Expired reports whether the lease has ended at now. A grant is expired
// from its Expiry on.
func (g Grant) Expired(now time.Time) bool { return !now.Before(g.Expiry) }

// RenewAt is when a holder renews the grant: halfway through its lease,
// IssuedAt + Lease/2.
func (g Grant) RenewAt() time.Time { return g.IssuedAt.Add(g.Lease() / 2) }

package grant

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"fiberd.io/fiberd/pkg/core"
)

// Lease is what PeekLease reads of a grant token without verifying it:
// the grant's UID (jti) and its lease (iat, exp).
type Lease struct {
	UID      string
	IssuedAt time.Time
	Expiry   time.Time
}

// RenewAt is halfway through the lease, as core.Grant.RenewAt.
func (l Lease) RenewAt() time.Time {
	return core.Grant{IssuedAt: l.IssuedAt, Expiry: l.Expiry}.RenewAt()
}

// PeekLease reads jti, iat and exp from a compact JWT without checking its
// signature, for a holder that schedules its renewal; whoever admits the
// grant verifies it. It refuses a token over MaxTokenSize, one that is not
// three dot-separated parts, and one whose iat or exp is missing, out of
// range or not in order (exp after iat).
func PeekLease(token []byte) (Lease, error) {
	if len(token) > MaxTokenSize {
		return Lease{}, fmt.Errorf("token of %d bytes is over the %d-byte limit", len(token), MaxTokenSize)
	}
	parts := bytes.Split(token, []byte("."))
	if len(parts) != 3 {
		return Lease{}, errors.New("token is not a compact JWS (three dot-separated parts)")
	}
	payload := make([]byte, base64.RawURLEncoding.DecodedLen(len(parts[1])))
	n, err := base64.RawURLEncoding.Decode(payload, parts[1])
	if err != nil {
		return Lease{}, fmt.Errorf("token payload: %w", err)
	}
	var c struct {
		JTI string   `json:"jti"`
		IAT *float64 `json:"iat"`
		EXP *float64 `json:"exp"`
	}
	if err := json.Unmarshal(payload[:n], &c); err != nil {
		return Lease{}, fmt.Errorf("token payload: %w", err)
	}
	if c.EXP == nil || c.IAT == nil {
		return Lease{}, errors.New("token has no iat or exp")
	}
	const maxUnix = 1 << 40 // far beyond any lease, and within time.Time
	if *c.IAT < 0 || *c.EXP < 0 || *c.IAT > maxUnix || *c.EXP > maxUnix {
		return Lease{}, errors.New("token iat or exp out of range")
	}
	iat, exp := time.Unix(int64(*c.IAT), 0), time.Unix(int64(*c.EXP), 0)
	if !exp.After(iat) {
		return Lease{}, errors.New("token exp is not after iat")
	}
	return Lease{UID: c.JTI, IssuedAt: iat, Expiry: exp}, nil
}

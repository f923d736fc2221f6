package core

import (
	"testing"
	"time"
)

func TestGrantLeaseAndRenewal(t *testing.T) {
	iat := time.Unix(1000, 0)
	g := Grant{IssuedAt: iat, Expiry: iat.Add(10 * time.Minute)}
	if g.Lease() != 10*time.Minute {
		t.Fatalf("Lease = %v", g.Lease())
	}
	if !g.RenewAt().Equal(iat.Add(5 * time.Minute)) {
		t.Fatalf("RenewAt = %v, want iat + lease/2", g.RenewAt())
	}
	if g.Expired(g.Expiry.Add(-time.Nanosecond)) || !g.Expired(g.Expiry) {
		t.Fatal("a grant is expired from its Expiry on, not before")
	}
}

func TestTierOrderAndParse(t *testing.T) {
	if !(TierBasic.Rank() < TierWarm.Rank() && TierWarm.Rank() < TierCheckpoint.Rank()) {
		t.Fatal("tiers must order BASIC < WARM < CHECKPOINT")
	}
	if tr, err := ParseTier(""); err != nil || tr != TierBasic {
		t.Fatalf(`ParseTier("") = %v, %v; want BASIC`, tr, err)
	}
	if _, err := ParseTier("GOLD"); err == nil {
		t.Fatal("ParseTier accepted an unknown tier")
	}
}

func TestMaxTokenSizeIs8KiB(t *testing.T) {
	// docs/architecture.md, The grant token: at most 8 KiB. The verifier, the
	// file lane and the grant fetch all read this one constant.
	if MaxTokenSize != 8192 {
		t.Fatalf("MaxTokenSize = %d, want 8192", MaxTokenSize)
	}
}

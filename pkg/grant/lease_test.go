package grant

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func seg(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestPeekLease(t *testing.T) {
	hdr := seg(`{"alg":"EdDSA","kid":"k"}`)
	tests := []struct {
		name    string
		token   string
		wantErr bool
		want    Lease
	}{
		{"good", hdr + "." + seg(`{"jti":"g1","iat":1000,"exp":3000}`) + ".c2ln", false,
			Lease{UID: "g1", IssuedAt: time.Unix(1000, 0), Expiry: time.Unix(3000, 0)}},
		{"fractional", hdr + "." + seg(`{"iat":1000.5,"exp":3000.9}`) + ".c2ln", false,
			Lease{IssuedAt: time.Unix(1000, 0), Expiry: time.Unix(3000, 0)}},
		{"two parts", hdr + "." + seg(`{"iat":1,"exp":2}`), true, Lease{}},
		{"no exp", hdr + "." + seg(`{"iat":1}`) + ".c2ln", true, Lease{}},
		{"exp before iat", hdr + "." + seg(`{"iat":5,"exp":2}`) + ".c2ln", true, Lease{}},
		{"negative", hdr + "." + seg(`{"iat":-5,"exp":2}`) + ".c2ln", true, Lease{}},
		{"huge", hdr + "." + seg(`{"iat":1,"exp":1e300}`) + ".c2ln", true, Lease{}},
		{"bad base64", hdr + ".!!!.c2ln", true, Lease{}},
		{"not json", hdr + "." + seg(`[1,2]`) + ".c2ln", true, Lease{}},
		{"oversized", hdr + "." + seg(`{"iat":1,"exp":2,"x":"`+strings.Repeat("a", MaxTokenSize)+`"}`) + ".c2ln", true, Lease{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PeekLease([]byte(tt.token))
			if (err != nil) != tt.wantErr {
				t.Fatalf("PeekLease: %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && (got.UID != tt.want.UID || !got.IssuedAt.Equal(tt.want.IssuedAt) || !got.Expiry.Equal(tt.want.Expiry)) {
				t.Fatalf("PeekLease = %+v, want %+v", got, tt.want)
			}
		})
	}
	c, _ := PeekLease([]byte(tests[0].token))
	if want := time.Unix(2000, 0); !c.RenewAt().Equal(want) {
		t.Fatalf("RenewAt = %v, want iat + (exp-iat)/2 = %v", c.RenewAt(), want)
	}
}

// FuzzPeekLease: a grant fetch's answer is untrusted; the peek must never
// panic and must keep its promises on what it accepts.
func FuzzPeekLease(f *testing.F) {
	hdr := seg(`{"alg":"EdDSA","kid":"k"}`)
	f.Add([]byte(hdr + "." + seg(`{"jti":"g1","iat":1000,"exp":3000}`) + ".c2ln"))
	f.Add([]byte(hdr + "." + seg(`{"iat":1e20,"exp":1e21}`) + ".c2ln"))
	f.Add([]byte("a.b.c"))
	f.Add([]byte(".."))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, token []byte) {
		c, err := PeekLease(token)
		if err != nil {
			return
		}
		if len(token) > MaxTokenSize || !c.Expiry.After(c.IssuedAt) {
			t.Fatalf("accepted %q as %+v", token, c)
		}
	})
}

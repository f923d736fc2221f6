package api

import (
	"strings"
	"testing"
)

// TestValidSession: printable text up to MaxSession bytes is a session;
// control and format characters, invalid UTF-8 and longer names are not,
// and the error does not repeat the name.
func TestValidSession(t *testing.T) {
	for s, ok := range map[string]bool{
		"": true, "s": true, "café 1": true, "user@example.com/tab 3": true, strings.Repeat("s", MaxSession): true,
		strings.Repeat("é", MaxSession/2): true,
		strings.Repeat("s", MaxSession+1): false, "a\nb": false, "\x1b[2J": false, "a\tb": false, "nul\x00": false,
		"del\x7f": false, "c1\u009b": false, "bidi\u202e": false, "\xff": false, "zero\u200bwidth": false,
	} {
		err := ValidSession(s)
		if (err == nil) != ok {
			t.Errorf("ValidSession(%q) = %v, want ok=%v", s, err, ok)
		}
		if err != nil && len(s) > 8 && strings.Contains(err.Error(), s) {
			t.Errorf("ValidSession(%.20q) error repeats the session: %v", s, err)
		}
	}
}

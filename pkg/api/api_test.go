package api

import (
	"encoding/json"
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

// TestParkWireNames: the park answer, the parked sessions and the
// checkpoint state keep the member names docs/api.md documents.
func TestParkWireNames(t *testing.T) {
	b, err := json.Marshal(Status{
		Checkpoint: Checkpoint{Reason: "no CRIU"},
		Grants:     []GrantStatus{{Parked: 1, ParkedBytes: 2, ParkedSessions: []ParkedSession{{Session: "s", FiberID: "g/1/1", ImageBytes: 2, OwnBytes: 1, By: "api"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"checkpoint":{"available":false,"reason":"no CRIU"}`, `"parked":1`, `"parkedBytes":2`,
		`"parkedSessions":[{"session":"s","fiberID":"g/1/1","imageBytes":2,"ownBytes":1,"parkedAt":`, `"by":"api"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("status JSON %s lacks %s", b, want)
		}
	}
	b, _ = json.Marshal(ParkResponse{FiberID: "g/1/1", Session: "s", ImageBytes: 2, OwnBytes: 1})
	if string(b) != `{"fiberID":"g/1/1","session":"s","imageBytes":2,"ownBytes":1}` {
		t.Errorf("park answer JSON %s", b)
	}
}

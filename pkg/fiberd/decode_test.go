package fiberd

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// FuzzDecodeStrict: decodeStrict never panics on a request body, every
// refusal wraps core.ErrInvalid, and a body it accepts decodes to the same
// CloneRequest as encoding/json does, which it accepts again, unchanged, once encoded.
// checkClone then passes only a grantUID that is a grant UID and a session
// of printable characters within api.MaxSession, and its refusals are short
// and never raw.
func FuzzDecodeStrict(f *testing.F) {
	for _, seed := range []string{
		`{"grant":"a.b.c","grantUID":"g1","session":"s","deadlineMs":5,"payload":"aGk="}`,
		`{"grantUID":"g1","extra":1}`,
		`{"GrantUID":"g1"}`,
		`{"grantUID":"g1","grantUID":"g2"}`,
		`{"grantUID":"g1"} {}`,
		`{"grantUID":{"nested":"x"}}`,
		`{"deadlineMs":"soon"}`,
		`{"grantUID":"../../etc","session":"\u001b[2J\n"}`,
		`{"grantUID":"g1","session":"caf\u00e9 \u202e"}`,
		` null `,
		`[]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got api.CloneRequest
		err := decodeStrict(body, &got)
		if err != nil {
			if !errors.Is(err, core.ErrInvalid) {
				t.Fatalf("refusal %v does not wrap core.ErrInvalid", err)
			}
			return
		}
		var want api.CloneRequest
		if err := json.Unmarshal(body, &want); err != nil {
			t.Fatalf("decodeStrict accepted %q, encoding/json refuses it: %v", body, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeStrict read %+v, encoding/json %+v", got, want)
		}
		again, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		var round api.CloneRequest
		if err := decodeStrict(again, &round); err != nil {
			t.Fatalf("re-encoded %s refused: %v", again, err)
		}
		if b, _ := json.Marshal(round); string(b) != string(again) {
			t.Fatalf("re-encoded %s read back as %s", again, b)
		}
		if err := checkClone(got); err != nil {
			if msg := err.Error(); !errors.Is(err, core.ErrInvalid) || len(msg) > 512 || strings.ContainsAny(msg, "\x00\x1b\n\r") {
				t.Fatalf("checkClone refusal %q", msg)
			}
			return
		}
		if got.GrantUID != "" && grant.ValidUID(got.GrantUID) != nil {
			t.Fatalf("checkClone passed grantUID %q", got.GrantUID)
		}
		if len(got.Session) > api.MaxSession || !utf8.ValidString(got.Session) || strings.IndexFunc(got.Session, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			t.Fatalf("checkClone passed session %q", got.Session)
		}
	})
}

package fiberd

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// FuzzDecodeStrict: decodeStrict never panics on a request body, every
// refusal wraps core.ErrInvalid, and a body it accepts decodes to the same
// CloneRequest as encoding/json does, which it accepts again, unchanged, once encoded.
func FuzzDecodeStrict(f *testing.F) {
	for _, seed := range []string{
		`{"grant":"a.b.c","grantUID":"g1","session":"s","deadlineMs":5,"payload":"aGk="}`,
		`{"grantUID":"g1","extra":1}`,
		`{"GrantUID":"g1"}`,
		`{"grantUID":"g1","grantUID":"g2"}`,
		`{"grantUID":"g1"} {}`,
		`{"grantUID":{"nested":"x"}}`,
		`{"deadlineMs":"soon"}`,
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
	})
}

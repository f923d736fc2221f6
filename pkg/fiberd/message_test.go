package fiberd

import (
	"strings"
	"testing"

	"fiberd.io/fiberd/pkg/api"
)

// TestNotATokenMessageReadsOnce: a Clone whose grant is not a token at all
// is 401, and its message says what is wrong once, without repeating the
// object's name or the error classes.
func TestNotATokenMessageReadsOnce(t *testing.T) {
	e := newEnv(t)
	r := e.cloneReq(e.unix, api.CloneRequest{Grant: "not-a-token"})
	body := r.apiError(t)
	if r.status != 401 || body.Code != api.CodeUnauthenticated {
		t.Fatalf("got %d %s, want 401 UNAUTHENTICATED", r.status, r.body)
	}
	if n := strings.Count(body.Message, "grant token"); n != 1 {
		t.Errorf("message %q names the grant token %d times, want once", body.Message, n)
	}
	if strings.Contains(body.Message, "invalid: unauthenticated") {
		t.Errorf("message %q stacks two error classes", body.Message)
	}
}

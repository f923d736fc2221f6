package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// hostile are strings a fiberd (or whoever answers in its place) may send
// back: terminal escapes, line breaks, C1 controls, a bidi override.
var hostile = []string{
	"\x1b[2J\x1b[H",
	"x\nroot# forged line",
	"\r\x1b[K",
	"\x1b]0;title\x07",
	"\u009b31m",
	"evil\u202eexe.txt",
	"tab\there",
}

// hostileAgent answers every route with the hostile strings in every
// field fiberctl prints.
func hostileAgent(t *testing.T) string {
	h := strings.Join(hostile, "|")
	st := api.Status{
		Home: "home" + h, Epoch: 2, Lane: api.Lane{Healthy: true, LastSync: testNow},
		Scope: []core.ScopeClaim{{Name: "pod" + h, Value: "v" + h}},
		Grants: []api.GrantStatus{{
			UID: "g1" + h, Template: "t" + h + "@sha256:00", Tier: core.Tier("WARM" + h), Running: 1, Max: 2,
			LeaseExpiry: testNow.Add(time.Hour), LatestFence: &core.Fence{GrantUID: "g1" + h, Epoch: 2, Seq: 1},
			Fibers: []api.FiberStatus{{FiberID: "f" + h, Endpoint: "tcp://e" + h, Session: "s" + h}},
		}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/status", "/v1/watch":
			json.NewEncoder(w).Encode(st)
		case "/v1/clone":
			json.NewEncoder(w).Encode(api.CloneResponse{FiberID: "f" + h, Endpoint: "tcp://e" + h, Kind: "create" + h, ReleaseKey: "k" + h})
		default:
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(api.Error{Code: "NOT_FOUND" + h, Message: "gone" + h, Issuer: "https://iss" + h})
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// terminalSafe reports the first character of s a terminal would act on
// rather than print (anything but printable characters, spaces and the
// line ends fiberctl writes itself).
func terminalSafe(s string) (rune, bool) {
	for _, r := range s {
		if r != '\n' && r != ' ' && !unicode.IsPrint(r) {
			return r, false
		}
	}
	return 0, true
}

// TestUntrustedStringsEscaped: whatever strings the agent answers with,
// fiberctl prints them escaped, in text and in JSON, on stdout and stderr:
// no terminal control reaches the operator's terminal and no line is
// forged; JSON output still decodes to what the agent sent.
func TestUntrustedStringsEscaped(t *testing.T) {
	addr := hostileAgent(t)
	for _, tc := range []struct {
		args  []string
		lines int // lines of text stdout, -1 for JSON
	}{
		{[]string{"status"}, 6},
		{[]string{"watch"}, 1},
		{[]string{"clone", "g1"}, 5},
		{[]string{"release", "g1/2/1"}, 0},
		{[]string{"-o", "json", "status"}, -1},
		{[]string{"-o", "json", "watch"}, -1},
		{[]string{"-o", "json", "clone", "g1"}, -1},
		{[]string{"-o", "json", "release", "g1/2/1"}, -1},
	} {
		code, out, errs := runCmd(t, testNow, "", append([]string{"-addr", addr}, tc.args...)...)
		name := strings.Join(tc.args, " ")
		if code != grantcli.ExitOK && !strings.Contains(name, "release") {
			t.Errorf("%s: exit %d: %s", name, code, errs)
		}
		for stream, s := range map[string]string{"stdout": out, "stderr": errs} {
			if r, ok := terminalSafe(s); !ok {
				t.Errorf("%s: %s holds %U raw:\n%s", name, stream, r, s)
			}
		}
		switch {
		case tc.lines >= 0 && strings.Count(out, "\n") != tc.lines:
			t.Errorf("%s: %d lines, want %d:\n%s", name, strings.Count(out, "\n"), tc.lines, out)
		case tc.lines < 0 && out != "":
			var v map[string]any
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Errorf("%s: JSON output does not decode: %v\n%s", name, err, out)
			} else if b, _ := json.Marshal(v); !strings.Contains(string(b), hostile[4]) {
				t.Errorf("%s: JSON output lost the agent's strings: %s", name, b)
			}
		}
	}
}

// FuzzEscape: for any string, field and escapeText print only printable
// characters and spaces; field is s itself or its Go quoting (which reads
// back as s); jsonSafe of s's JSON is printable too and decodes to what the
// JSON did.
func FuzzEscape(f *testing.F) {
	for _, s := range append(hostile, "", "plain", `quo"te`, `back\slash`, "\xff\xfe", "\U000e0001tag", "é", "\x7f") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, out := range map[string]string{"field": field(s), "escapeText": escapeText(s)} {
			if r, ok := terminalSafe(out); !ok || strings.Contains(out, "\n") {
				t.Fatalf("%s(%q) = %q holds %U", name, s, out, r)
			}
		}
		if got := field(s); got != s {
			if back, err := strconv.Unquote(got); err != nil || back != s {
				t.Fatalf("field(%q) = %q, which reads back as %q, %v", s, got, back, err)
			}
		}
		enc, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		safe := jsonSafe(enc)
		if r, ok := terminalSafe(string(safe)); !ok {
			t.Fatalf("jsonSafe(%s) = %s holds %U", enc, safe, r)
		}
		var want, got string
		if err := json.Unmarshal(enc, &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(safe, &got); err != nil || got != want {
			t.Fatalf("jsonSafe(%s) = %s decodes to %q, %v; want %q", enc, safe, got, err, want)
		}
	})
}

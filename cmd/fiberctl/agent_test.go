package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// fakeAgent serves the API as fiberd does, recording the requests.
type fakeAgent struct {
	mu       sync.Mutex
	requests []string // "POST /v1/clone {...}"
}

func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(string(body)))
	f.mu.Unlock()
	switch r.Method + " " + r.URL.Path {
	case "POST /v1/clone":
		var req api.CloneRequest
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			w.WriteHeader(400)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeInvalid, Message: err.Error()})
			return
		}
		if req.Session == "taken" && req.ReleaseKey != "k3y" && req.Grant == "" { // as on a plaintext listener
			w.WriteHeader(401)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeUnauthenticated, Message: `session "taken" is taken: name the session's releaseKey`})
			return
		}
		if req.GrantUID == "full" {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
			json.NewEncoder(w).Encode(api.Error{Code: "SHED", Message: "at fibers.max", Issuer: "https://iss"})
			return
		}
		json.NewEncoder(w).Encode(api.CloneResponse{
			FiberID: req.GrantUID + "/2/5", Endpoint: "tcp://127.0.0.1:20005",
			Fence: core.Fence{GrantUID: req.GrantUID, Epoch: 2, Seq: 5}, Kind: api.KindCreate, ReleaseKey: "k3y",
		})
	case "POST /v1/release", "POST /v1/park":
		var req api.FiberRequest
		json.Unmarshal(body, &req)
		if strings.Contains(req.FiberID, "/1/") {
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: "older epoch"})
			return
		}
		if strings.HasPrefix(req.FiberID, "plain/") && req.ReleaseKey == "" && req.Grant == "" { // as on a plaintext listener
			w.WriteHeader(401)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeUnauthenticated, Message: "name the fiber's releaseKey"})
			return
		}
		if r.URL.Path == "/v1/park" {
			json.NewEncoder(w).Encode(api.ParkResponse{FiberID: req.FiberID, Session: "s1", ImageBytes: 17 << 20, OwnBytes: 3 << 20})
			return
		}
		w.Write([]byte("{}"))
	case "GET /v1/status":
		json.NewEncoder(w).Encode(testStatus())
	case "GET /v1/watch":
		for i := uint64(1); i <= 3; i++ {
			s := testStatus()
			s.Epoch = i
			json.NewEncoder(w).Encode(s)
		}
	default:
		http.NotFound(w, r)
	}
}

func testStatus() api.Status {
	f := core.Fence{GrantUID: "g1", Epoch: 2, Seq: 5}
	return api.Status{
		Home: "standalone", Epoch: 2, Ready: true,
		Lane: api.Lane{Healthy: true, LastSync: testNow.Add(-3 * time.Second)},
		Grants: []api.GrantStatus{{
			UID: "g1", Template: "counter-c@sha256:" + strings.Repeat("a", 64), Warm: true, Running: 1, Max: 64,
			LeaseExpiry: testNow.Add(time.Hour), LatestFence: &f, Tier: core.TierWarm, Isolation: "grant",
			Fibers: []api.FiberStatus{
				{FiberID: "g1/2/5", Endpoint: "tcp://127.0.0.1:20005", Session: "s1", Isolation: "grant"},
				{FiberID: "g1/2/6", Endpoint: "tcp://127.0.0.1:20006", Isolation: "none"},
			},
			Parked: 1, ParkedBytes: 16 << 20,
			Spares:         &api.SpareStatus{Warm: 8, HandOver: true, Wanted: 8, Ready: 7, Taken: 12, Bytes: 3 << 20},
			ParkedSessions: []api.ParkedSession{{Session: "s0", FiberID: "g1/2/4", ImageBytes: 16 << 20, OwnBytes: 1 << 20, ParkedAt: testNow.Add(-time.Minute), By: "api"}},
		}},
		Checkpoint: api.Checkpoint{Available: true},
		Isolation: []api.TierIsolation{
			{Tier: core.TierWarm, Level: "grant", Missing: "a zygote cannot give each fiber namespaces"},
			{Tier: core.TierBasic, Level: "fiber", NetworkNone: true, EndpointsApart: true},
		},
		MinIsolation: "grant",
		Limits:       &api.Limits{Cgroups: true, FiberPidsMax: 4096, Missing: []string{"memory", "cpu"}},
	}
}

func newAgent(t *testing.T) (*fakeAgent, string) {
	a := &fakeAgent{}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return a, srv.Listener.Addr().String()
}

func TestClone(t *testing.T) {
	a, addr := newAgent(t)
	code, out, errs := runCmd(t, testNow, "", "-addr", addr, "clone", "-grant-uid", "g1", "-session", "s1", "-payload", "hi", "-deadline", "2s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"fiber     g1/2/5", "endpoint  tcp://127.0.0.1:20005", "kind      create", "key       k3y", "took"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	if got := a.requests[0]; !strings.Contains(got, `"grantUID":"g1"`) || !strings.Contains(got, `"session":"s1"`) ||
		!strings.Contains(got, `"deadlineMs":2000`) || !strings.Contains(got, `"payload":"aGk="`) {
		t.Errorf("request %s", got)
	}

	// A bare UID, JSON output.
	code, out, _ = runCmd(t, testNow, "", "-addr", addr, "-o", "json", "clone", "g2")
	var resp api.CloneResponse
	if code != 0 || json.Unmarshal([]byte(out), &resp) != nil || resp.FiberID != "g2/2/5" || resp.Fence.Seq != 5 {
		t.Fatalf("exit %d, output %q", code, out)
	}

	// A token from stdin.
	code, _, errs = runCmd(t, testNow, "header.payload.sig\n", "-addr", addr, "clone", "-grant", "-")
	if code != 0 || !strings.Contains(a.requests[2], `"grant":"header.payload.sig"`) {
		t.Fatalf("exit %d (%s), request %s", code, errs, a.requests[2])
	}
}

func TestCloneMiss(t *testing.T) {
	_, addr := newAgent(t)
	code, out, errs := runCmd(t, testNow, "", "-addr", addr, "-o", "json", "clone", "-grant-uid", "full")
	if code != grantcli.ExitFailure {
		t.Fatalf("exit %d, want %d", code, grantcli.ExitFailure)
	}
	var e api.Error
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.Code != "SHED" || e.RetryAfterSeconds != 2 {
		t.Errorf("stdout %q: want the miss body with the Retry-After", out)
	}
	if !strings.Contains(errs, "429 SHED: at fibers.max (issuer https://iss)") {
		t.Errorf("stderr %q", errs)
	}
}

func TestReleaseAndPark(t *testing.T) {
	a, addr := newAgent(t)
	if code, out, errs := runCmd(t, testNow, "", "-addr", addr, "release", "g1/2/5"); code != 0 || out != "released g1/2/5\n" {
		t.Fatalf("release: exit %d, %q %q", code, out, errs)
	}
	if !strings.Contains(a.requests[0], `POST /v1/release {"fiberID":"g1/2/5"}`) {
		t.Errorf("request %s", a.requests[0])
	}
	if code, out, _ := runCmd(t, testNow, "", "-addr", addr, "-o", "json", "park", "g1/2/6"); code != 0 || !strings.Contains(out, `"fiberID":"g1/2/6","session":"s1","imageBytes":17825792`) {
		t.Fatalf("park: exit %d, %q", code, out)
	}
	if code, out, _ := runCmd(t, testNow, "", "-addr", addr, "park", "g1/2/6"); code != 0 || !strings.Contains(out, "parked g1/2/6: session s1, image 17.0 MiB (its own memory 3.0 MiB)") {
		t.Fatalf("park: exit %d, %q", code, out)
	}
	code, _, errs := runCmd(t, testNow, "", "-addr", addr, "release", "g1/1/1")
	if code != grantcli.ExitFailure || !strings.Contains(errs, "404 NOT_FOUND") {
		t.Fatalf("release of an old fiber: exit %d, %q", code, errs)
	}
}

// TestReleaseWithProof: -key and -grant carry the proof a plaintext
// listener asks for; without one there, fiberctl says what to pass.
func TestReleaseWithProof(t *testing.T) {
	a, addr := newAgent(t)
	code, _, errs := runCmd(t, testNow, "", "-addr", addr, "release", "plain/2/5")
	if code != grantcli.ExitFailure || !strings.Contains(errs, "401 UNAUTHENTICATED") || !strings.Contains(errs, "pass -key KEY") {
		t.Fatalf("release without a key: exit %d, %q", code, errs)
	}
	if code, out, errs := runCmd(t, testNow, "", "-addr", addr, "release", "-key", "k3y", "plain/2/5"); code != 0 || out != "released plain/2/5\n" {
		t.Fatalf("release -key: exit %d, %q %q", code, out, errs)
	}
	if !strings.Contains(a.requests[1], `POST /v1/release {"fiberID":"plain/2/5","releaseKey":"k3y"}`) {
		t.Errorf("request %s", a.requests[1])
	}
	if code, _, errs := runCmd(t, testNow, "header.payload.sig\n", "-addr", addr, "park", "-grant", "-", "plain/2/5"); code != 0 {
		t.Fatalf("park -grant: exit %d, %q", code, errs)
	}
	if !strings.Contains(a.requests[2], `POST /v1/park {"fiberID":"plain/2/5","grant":"header.payload.sig"}`) {
		t.Errorf("request %s", a.requests[2])
	}
	if code, _, errs := runCmd(t, testNow, "", "-addr", addr, "release", "-key", "k", "-grant", "-", "plain/2/5"); code != grantcli.ExitUsage || !strings.Contains(errs, "-key and -grant") {
		t.Errorf("release -key -grant: exit %d, %q", code, errs)
	}
}

// TestCloneWithProof: -key carries a session's release key, which a
// plaintext listener asks for to attach to or resume a session another
// Clone created; without it there, fiberctl says what to pass.
func TestCloneWithProof(t *testing.T) {
	a, addr := newAgent(t)
	code, _, errs := runCmd(t, testNow, "", "-addr", addr, "clone", "-session", "taken", "g1")
	if code != grantcli.ExitFailure || !strings.Contains(errs, "401 UNAUTHENTICATED") || !strings.Contains(errs, "pass -key KEY") || !strings.Contains(errs, "another -session") {
		t.Fatalf("clone of a taken session without a key: exit %d, %q", code, errs)
	}
	if code, out, errs := runCmd(t, testNow, "", "-addr", addr, "clone", "-session", "taken", "-key", "k3y", "g1"); code != 0 || !strings.Contains(out, "key       k3y") {
		t.Fatalf("clone -key: exit %d, %q %q", code, out, errs)
	}
	if !strings.Contains(a.requests[1], `POST /v1/clone {"grantUID":"g1","session":"taken","releaseKey":"k3y"}`) {
		t.Errorf("request %s", a.requests[1])
	}
	// A wrong key is refused, without the hint for a missing one.
	code, _, errs = runCmd(t, testNow, "", "-addr", addr, "clone", "-session", "taken", "-key", "nope", "g1")
	if code != grantcli.ExitFailure || !strings.Contains(errs, "401 UNAUTHENTICATED") || strings.Contains(errs, "pass -key KEY") {
		t.Fatalf("clone with a wrong key: exit %d, %q", code, errs)
	}
}

// TestRedactedStatus: a status without fibers (a plaintext address) says
// they are not shown, rather than that none run.
func TestRedactedStatus(t *testing.T) {
	st := testStatus()
	st.Redacted, st.Grants[0].Fibers, st.Grants[0].LatestFence, st.Grants[0].ParkedSessions = true, nil, nil, nil
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(st) }))
	t.Cleanup(srv.Close)
	code, out, errs := runCmd(t, testNow, "", "-addr", srv.Listener.Addr().String(), "status")
	if code != 0 || !strings.Contains(out, "1/64") || !strings.Contains(out, "fibers: not shown") || !strings.Contains(out, "parked sessions: 1, not shown") {
		t.Fatalf("redacted status: exit %d, %q %q", code, out, errs)
	}
}

func TestStatus(t *testing.T) {
	_, addr := newAgent(t)
	code, out, errs := runCmd(t, testNow, "", "-addr", addr, "status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"home standalone  epoch 2  lane healthy (last sync 3s ago)  ready true",
		"GRANT", "g1", "counter-c", "WARM", "1/64", "1h0m0s", "g1/2/5", "session s1",
		"checkpoint: available", "parked:\n  g1/2/4  session s0  image 16.0 MiB  by api  1m0s ago",
		"isolation WARM grant, BASIC fiber (network none) (endpoints apart)  at least grant (less is TIER_GAP)",
		"  less than asked: a zygote cannot give each fiber namespaces", "ISOLATION", "g1/2/6  tcp://127.0.0.1:20006  isolation none",
		"limits: pids.max 4096 a fiber, W budgets measured\n  missing cgroup controllers: memory, cpu",
		"SPARES", "7/8", "spares of g1: 7 ready of 8 wanted (fibers.warm 8), 12 Clones handed over, holding 3.0 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCmd(t, testNow, "", "-addr", addr, "-o", "json", "status")
	var st api.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Epoch != 2 || len(st.Grants) != 1 {
		t.Fatalf("json status: exit %d, %q", code, out)
	}
}

// TestStatusReady: status -ready is a grant Pod's exec readiness probe: it
// prints nothing and exits 0 while a grant's template is warm, and exits 1
// with the reason while none is (a restarted fiberd before its first warm),
// and when fiberd does not answer.
func TestStatusReady(t *testing.T) {
	for _, ready := range []bool{true, false} {
		st := testStatus()
		st.Ready = ready
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(st) }))
		code, out, errs := runCmd(t, testNow, "", "-addr", srv.Listener.Addr().String(), "status", "-ready")
		srv.Close()
		want := grantcli.ExitOK
		if !ready {
			want = grantcli.ExitFailure
		}
		if code != want || out != "" || ready != (errs == "") || (!ready && !strings.Contains(errs, "not ready")) {
			t.Errorf("ready %v: exit %d (want %d), stdout %q, stderr %q", ready, code, want, out, errs)
		}
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.Listener.Addr().String()
	srv.Close()
	if code, _, errs := runCmd(t, testNow, "", "-addr", addr, "status", "-ready"); code != grantcli.ExitFailure {
		t.Errorf("fiberd down: exit %d, %q; want %d", code, errs, grantcli.ExitFailure)
	}
}

func TestWatch(t *testing.T) {
	_, addr := newAgent(t)
	code, out, errs := runCmd(t, testNow, "", "-addr", addr, "watch")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[2], "epoch=3 lane=healthy ready=true g1:1/64+1parked") {
		t.Fatalf("watch printed %q", out)
	}
	code, out, _ = runCmd(t, testNow, "", "-addr", addr, "-o", "json", "watch")
	if code != 0 || strings.Count(out, "\n") != 3 {
		t.Fatalf("json watch: exit %d, %q", code, out)
	}
}

func TestDefaultAddrFromEnvironment(t *testing.T) {
	_, addr := newAgent(t)
	t.Setenv("FIBERD_ADDR", addr)
	if code, _, errs := runCmd(t, testNow, "", "status"); code != 0 {
		t.Fatalf("status with $FIBERD_ADDR: exit %d, %s", code, errs)
	}
}

func TestAgentUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // stderr must contain it
	}{
		{"bad output", []string{"-o", "yaml", "status"}, "-o"},
		{"unknown global flag", []string{"-bogus", "status"}, "-bogus"},
		{"tls cert without key", []string{"-tls-cert", "/c", "status"}, "-tls-key"},
		{"clone without grant", []string{"clone"}, "-grant-uid"},
		{"clone unknown flag", []string{"clone", "-nope"}, "-nope"},
		{"clone two args", []string{"clone", "a", "b"}, "unexpected argument"},
		{"clone negative deadline", []string{"clone", "-deadline", "-1s", "g"}, "-deadline"},
		{"clone session with a newline", []string{"clone", "-session", "a\nb", "g"}, "-session"},
		{"clone session too long", []string{"clone", "-session", strings.Repeat("s", api.MaxSession+1), "g"}, "-session"},
		{"clone key without session", []string{"clone", "-key", "k", "g"}, "name the session with -session"},
		{"clone two payloads", []string{"clone", "-grant-uid", "g", "-payload", "a", "-payload-file", "-"}, "-payload"},
		{"clone payload too big", []string{"clone", "-grant-uid", "g", "-payload", strings.Repeat("x", api.MaxPayload+1)}, "-payload"},
		{"release without id", []string{"release"}, "fiber id"},
		{"park two ids", []string{"park", "a", "b"}, "fiber id"},
		{"status extra arg", []string{"status", "x"}, "x"},
		{"bad address", []string{"-addr", "nowhere", "status"}, "nowhere"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := runCmd(t, testNow, "", tc.args...)
			if code != grantcli.ExitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", code, grantcli.ExitUsage, errs)
			}
			if !strings.Contains(errs, tc.want) {
				t.Errorf("stderr %q does not name %q", errs, tc.want)
			}
		})
	}
}

func TestUnreachableAgentFails(t *testing.T) {
	code, _, errs := runCmd(t, testNow, "", "-addr", "unix:///nonexistent/fiberd.sock", "status")
	if code != grantcli.ExitFailure || !strings.Contains(errs, "fiberd.sock") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

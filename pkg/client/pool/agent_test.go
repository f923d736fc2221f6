package pool

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// mode is how a fake agent answers a Clone.
type mode int

const (
	serve    mode = iota // a fiber of the named grant
	shed                 // 429 SHED, Retry-After 1
	deferred             // 503 DEFERRED_FALLBACK
	hang                 // no answer until the request is cancelled
	unauth               // 401 UNAUTHENTICATED
	internal             // 500 INTERNAL
	gated                // serves once the gate is closed
)

// agent is a fake grant Pod: an HTTP server answering Clone, Release and
// Park as fiberd does, for the one grant whose UID is its Pod's.
type agent struct {
	t    *testing.T
	uid  string
	name string
	srv  *httptest.Server
	mode atomic.Int32
	seq  atomic.Uint64
	gate chan struct{} // closed to let gated Clones through

	mu       sync.Mutex
	clones   []api.CloneRequest
	released []string
	parked   []string
	sessions map[string]string // session -> fiber id, the fibers running
	live     map[string]bool   // fiber ids served and not released
}

// newAgent starts a fake agent for Pod name with UID uid.
func newAgent(t *testing.T, name, uid string, m mode) *agent {
	t.Helper()
	a := &agent{t: t, uid: uid, name: name, sessions: map[string]string{}, live: map[string]bool{}, gate: make(chan struct{})}
	a.mode.Store(int32(m))
	a.srv = httptest.NewServer(a)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *agent) set(m mode) { a.mode.Store(int32(m)) }

// endpoint is the agent as a pool Endpoint.
func (a *agent) endpoint() Endpoint {
	return Endpoint{PodName: a.name, PodUID: a.uid, Addr: a.srv.Listener.Addr().String(), Node: "node-1"}
}

// calls is how many Clones the agent was sent.
func (a *agent) calls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.clones)
}

func (a *agent) lastClone() api.CloneRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.clones[len(a.clones)-1]
}

func writeErr(w http.ResponseWriter, status int, e api.Error) {
	w.Header().Set("Content-Type", "application/json")
	if e.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(e.RetryAfterSeconds))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

func (a *agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch r.URL.Path {
	case "/v1/clone":
		var req api.CloneRequest
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeErr(w, 400, api.Error{Code: api.CodeInvalid, Message: err.Error()})
			return
		}
		a.mu.Lock()
		a.clones = append(a.clones, req)
		a.mu.Unlock()
		switch mode(a.mode.Load()) {
		case shed:
			writeErr(w, 429, api.Error{Code: string(core.CodeShed), Message: "at fibers.max", Issuer: "https://iss", RetryAfterSeconds: 1})
			return
		case deferred:
			writeErr(w, 503, api.Error{Code: string(core.CodeDeferredFallback), Message: "template not warm", Issuer: "https://iss"})
			return
		case hang:
			<-r.Context().Done()
			return
		case gated:
			select {
			case <-a.gate:
			case <-r.Context().Done():
				return
			}
		case unauth:
			writeErr(w, 401, api.Error{Code: api.CodeUnauthenticated, Message: "name the session's releaseKey"})
			return
		case internal:
			writeErr(w, 500, api.Error{Code: api.CodeInternal, Message: "fork failed"})
			return
		}
		if req.GrantUID != a.uid {
			// As fiberd: a grant it does not hold is a miss.
			writeErr(w, 503, api.Error{Code: string(core.CodeDeferredFallback), Message: fmt.Sprintf("unknown grant %q", req.GrantUID)})
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		kind := api.KindCreate
		id, ok := a.sessions[req.Session]
		if req.Session != "" && ok {
			kind = api.KindAttach
		} else {
			id = fmt.Sprintf("%s/1/%d", a.uid, a.seq.Add(1))
			if req.Session != "" {
				a.sessions[req.Session] = id
			}
		}
		a.live[id] = true
		f, _ := core.ParseFence(id)
		_ = json.NewEncoder(w).Encode(api.CloneResponse{FiberID: id, Endpoint: "tcp://127.0.0.1:1", Fence: f, Kind: kind, ReleaseKey: "k"})
	case "/v1/release", "/v1/park":
		var req api.FiberRequest
		_ = json.Unmarshal(body, &req)
		a.mu.Lock()
		defer a.mu.Unlock()
		if !a.live[req.FiberID] {
			writeErr(w, 404, api.Error{Code: api.CodeNotFound, Message: "no such fiber"})
			return
		}
		if r.URL.Path == "/v1/park" {
			a.parked = append(a.parked, req.FiberID)
			session := ""
			for s, id := range a.sessions {
				if id == req.FiberID {
					session = s
				}
			}
			_ = json.NewEncoder(w).Encode(api.ParkResponse{FiberID: req.FiberID, Session: session, ImageBytes: 1 << 20})
			return
		}
		a.released = append(a.released, req.FiberID)
		delete(a.live, req.FiberID)
		_, _ = w.Write([]byte("{}"))
	default:
		http.NotFound(w, r)
	}
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

package fiberd

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// The API's rule for callers (docs/design.md, "callers who cannot
// authenticate"): a caller is authenticated by its connection (the unix
// socket's file mode, or TLS with a verified client certificate); one on a
// plaintext TCP listener is not. An unauthenticated caller
//
//   - is refused as a browser would send it (guard): a Host that is not the
//     listener's own address, a cross-site Origin or Sec-Fetch-Site, a POST
//     body that is not application/json;
//   - sees a redacted status and watch (redact): grants with their counts,
//     no fiber id, endpoint or session;
//   - releases or parks a fiber only with its release key (the one its
//     Clone answered) or a token of its grant (authorizeFiber);
//   - may Clone an admitted grant by UID, as anyone who reaches the
//     listener may, and never self-admits;
//   - attaches to a session's running fiber, or resumes its parked one,
//     only with the session's release key or a token of its grant
//     (sessionProof): a session is its creator's, not whoever names it.

// guard wraps h with the browser checks of listener ln: none on a unix
// socket (no browser reaches one); the cross-site check on every TCP
// listener (a browser may hold a client certificate); and on a listener
// that does not authenticate, the Host and Content-Type checks too.
func (a *Agent) guard(h http.Handler, ln net.Listener, authenticated bool) http.Handler {
	if ln.Addr().Network() == "unix" {
		return h
	}
	plaintext := !authenticated
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		if status, err := browserCheck(r, local, plaintext); err != nil {
			code := api.CodeForbidden
			if status != http.StatusForbidden {
				code = api.CodeInvalid
			}
			a.log.V(1).Info("Request refused as a browser's", "path", r.URL.Path, "reason", err.Error())
			writeJSON(w, status, api.Error{Code: code, Message: err.Error()})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// browserCheck is the guard's decision for request r arriving at local
// address local: 0 and nil to serve it, else the status (403 or 415) and
// why. plaintext says the listener does not authenticate; only then are
// Host and Content-Type checked. Header values are quoted shortened in the
// error, never whole.
func browserCheck(r *http.Request, local net.Addr, plaintext bool) (int, error) {
	scheme := "https"
	if plaintext {
		scheme = "http"
		if !hostIsListener(r.Host, local) {
			return http.StatusForbidden, fmt.Errorf("Host %s is not this listener's address: call it by its address (or localhost on loopback)", quoteShort(r.Host))
		}
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return http.StatusForbidden, fmt.Errorf("Sec-Fetch-Site %s: cross-site requests are refused", quoteShort(site))
	}
	if origins := r.Header.Values("Origin"); len(origins) > 0 {
		if len(origins) > 1 || !sameOrigin(origins[0], scheme, r.Host) {
			return http.StatusForbidden, fmt.Errorf("Origin %s is not this listener's: cross-site requests are refused", quoteShort(strings.Join(origins, ", ")))
		}
	}
	if plaintext && r.Method == http.MethodPost {
		ct := r.Header.Get("Content-Type")
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return http.StatusUnsupportedMediaType, fmt.Errorf("Content-Type %s: a POST body must be sent as application/json", quoteShort(ct))
		}
	}
	return 0, nil
}

// hostIsListener reports whether host, a request's Host, names the local
// address of its connection: the same IP and port, or "localhost" and the
// port when that IP is loopback. A Host without a port means port 80. A
// DNS name (what DNS rebinding needs) never matches but localhost.
func hostIsListener(host string, local net.Addr) bool {
	tcp, ok := local.(*net.TCPAddr)
	if !ok || host == "" {
		return false
	}
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		// No port: the whole Host is the name, an IPv6 literal in
		// brackets.
		name, port = host, "80"
		if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
			name = name[1 : len(name)-1]
		}
	}
	if port != strconv.Itoa(tcp.Port) {
		return false
	}
	if strings.EqualFold(name, "localhost") {
		return tcp.IP.IsLoopback()
	}
	if strings.Contains(name, "%") { // a zone: never one of ours
		return false
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.Equal(tcp.IP)
}

// sameOrigin reports whether origin, an Origin header, is scheme://host:
// the page that sent the request was served by this very listener.
func sameOrigin(origin, scheme, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Scheme != scheme || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	return strings.EqualFold(u.Host, host)
}

// quoteShort quotes s for an error message, cut to 64 bytes (marked
// "..."): values a caller sent are never repeated whole, and never raw.
func quoteShort(s string) string {
	const max = 64
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}

// checkClone refuses a Clone whose grantUID is not a grant UID (the rules
// of a token's jti, grant.ValidUID), whose session is not api.ValidSession,
// or that names a releaseKey without a session (the key proves a session
// is the caller's; without one it proves nothing). Errors wrap
// core.ErrInvalid (400) and never repeat the value whole.
func checkClone(req api.CloneRequest) error {
	if req.GrantUID != "" {
		if err := grant.ValidUID(req.GrantUID); err != nil {
			return fmt.Errorf("grantUID: %v: %w", err, core.ErrInvalid)
		}
	}
	if err := api.ValidSession(req.Session); err != nil {
		return fmt.Errorf("%v: %w", err, core.ErrInvalid)
	}
	if req.ReleaseKey != "" && req.Session == "" {
		return fmt.Errorf("releaseKey without a session: a Clone names a release key to attach to or resume its session; name the session too: %w", core.ErrInvalid)
	}
	return nil
}

// parseFiberID reads a FiberRequest's fiber id: uid/epoch/seq with uid a
// grant UID. The error wraps core.ErrInvalid and quotes id shortened.
func parseFiberID(id string) (core.Fence, error) {
	f, err := core.ParseFence(id)
	if err == nil {
		err = grant.ValidUID(f.GrantUID)
	}
	if err != nil {
		return core.Fence{}, fmt.Errorf("fiberID %s is not uid/epoch/seq of a grant UID: %w", quoteShort(id), core.ErrInvalid)
	}
	return f, nil
}

// releaseKeys mints and checks fibers' release keys: the first 16 bytes of
// HMAC-SHA256 over a fiber id under a secret drawn when the API handler is
// built, base64url. The fiber id is the key's fence (keyFence): for a fiber
// with a session, the fence of the session's first fiber, which parks and
// resumes carry along, so the key the session's creator received proves
// the session its own for as long as it lives; for a fiber without a
// session, its own. A key needs no storage but that fence, differs for
// every creation of a session (a name used again is a new session, and its
// old key does not open it), and dies with the agent (as do its fibers and
// parked images).
type releaseKeys struct {
	secret [32]byte
}

// releaseKeyBytes is the length of a release key before base64url.
const releaseKeyBytes = 16

func newReleaseKeys() *releaseKeys {
	k := &releaseKeys{}
	_, _ = rand.Read(k.secret[:]) // never fails (crypto/rand)
	return k
}

func (k *releaseKeys) sum(f core.Fence) []byte {
	m := hmac.New(sha256.New, k.secret[:])
	m.Write([]byte(f.String()))
	return m.Sum(nil)[:releaseKeyBytes]
}

// key is fiber f's release key.
func (k *releaseKeys) key(f core.Fence) string {
	return base64.RawURLEncoding.EncodeToString(k.sum(f))
}

// check reports whether presented is fiber f's release key, in constant
// time.
func (k *releaseKeys) check(f core.Fence, presented string) bool {
	b, err := base64.RawURLEncoding.DecodeString(presented)
	return err == nil && hmac.Equal(b, k.sum(f))
}

// keyFence is the fence whose release key is fiber f's: the fence its
// session was created as (fiberHandle.origin, kept across parks and
// resumes), else f's own.
func keyFence(f core.Fiber) core.Fence {
	if h := handleOf(f); h != nil && h.origin != (core.Fence{}) {
		return h.origin
	}
	return f.Fence
}

// errNoProof is a release or park by an unauthenticated caller who
// presented neither the fiber's release key nor its grant's token.
var errNoProof = errors.New("on a listener that does not authenticate, name the fiber's releaseKey (from its Clone) or a token of its grant (grant)")

// errNoSessionProof is the rule a Clone by an unauthenticated caller of a
// session that has a fiber, running or parked, broke: it named neither the
// session's release key nor a token of its grant, or a key that is not the
// session's. The refusal says the same for a running and a parked session:
// the caller learns that the session is taken, which it cannot help
// learning (a Clone of a free session creates it), and nothing more.
var errNoSessionProof = errors.New("on a listener that does not authenticate, a Clone of a session that has a fiber (running or parked) must name the session's releaseKey (answered by the Clone that created it) or carry a token of its grant (grant)")

// sessionProof decides whether an unauthenticated caller whose Clone
// carries no token of the grant may attach to, or resume, the session of
// req whose release key is that of fence key: only with that key. Errors
// wrap core.ErrUnauthenticated (401); they name the session as the caller
// sent it (shortened) and nothing of its fiber.
func (a *apiServer) sessionProof(req api.CloneRequest, key core.Fence) error {
	switch {
	case req.ReleaseKey == "":
		return fmt.Errorf("session %s is taken: %v; or use another session name: %w", quoteShort(req.Session), errNoSessionProof, core.ErrUnauthenticated)
	case !a.keys.check(key, req.ReleaseKey):
		return fmt.Errorf("session %s: the releaseKey does not match the session's: %v: %w", quoteShort(req.Session), errNoSessionProof, core.ErrUnauthenticated)
	}
	return nil
}

// authorizeFiber decides whether the caller of a release or park of fiber
// f, whose release key is that of fence key (keyFence), may end it: an
// authenticated caller may; an unauthenticated one must present that
// release key, or a token of f's grant that verifies. Errors:
// core.ErrUnauthenticated (401), or a SHED miss when the token cannot be
// verified now (the issuer's keys are missing or stale).
func (a *apiServer) authorizeFiber(ctx context.Context, authed bool, req api.FiberRequest, f, key core.Fence) error {
	switch {
	case authed:
		return nil
	case req.ReleaseKey != "":
		if a.keys.check(key, req.ReleaseKey) {
			return nil
		}
		return fmt.Errorf("fiber %s: the release key does not match: %w", f, core.ErrUnauthenticated)
	case req.Grant != "":
		g, err := a.verifier.Verify(ctx, []byte(req.Grant))
		switch {
		case errors.Is(err, core.ErrUnverifiable):
			return core.Shed(err.Error(), a.cfg.Issuer, a.cfg.RetryAfter)
		case err != nil:
			return err
		case g.UID != f.GrantUID:
			return fmt.Errorf("fiber %s: the token is of grant %q, not the fiber's: %w", f, g.UID, core.ErrUnauthenticated)
		}
		return nil
	}
	return fmt.Errorf("fiber %s: %v: %w", f, errNoProof, core.ErrUnauthenticated)
}

// redact is st as an unauthenticated caller sees it: each grant with its
// counts, template, tier and lease, without its fibers (ids, endpoints,
// sessions), parked sessions or latest fence, and its exits with their
// reasons and times but not the fibers' ids. st itself is left whole.
func redact(st api.Status) api.Status {
	st.Redacted = true
	grants := make([]api.GrantStatus, len(st.Grants))
	for i, g := range st.Grants {
		g.Fibers, g.LatestFence, g.ParkedSessions = nil, nil, nil
		exits := make([]api.FiberExit, len(g.Exits))
		for j, x := range g.Exits {
			x.FiberID = ""
			exits[j] = x
		}
		if len(exits) > 0 {
			g.Exits = exits
		}
		grants[i] = g
	}
	st.Grants = grants
	return st
}

package fiberd

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
)

// browserRequest is a request as a browser sends it, header for header
// (Chrome 131 on Linux), with HOST and PORT replaced by the listener's.
type browserRequest struct {
	name string
	raw  string
}

// chromeHeaders are the headers Chrome adds to every request.
const chromeHeaders = "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36\r\n" +
	"sec-ch-ua: \"Chromium\";v=\"131\", \"Not_A Brand\";v=\"24\"\r\nsec-ch-ua-mobile: ?0\r\nsec-ch-ua-platform: \"Linux\"\r\n" +
	"Accept-Encoding: gzip, deflate, br, zstd\r\nAccept-Language: en-US,en;q=0.9\r\nConnection: keep-alive\r\n"

// browserAttacks are the requests a page the operator visits can make of a
// plaintext listener on loopback: body is a Clone of grant g1.
func browserAttacks(body string) []browserRequest {
	n := len(body)
	return []browserRequest{
		{"cross-site fetch, no-cors, text/plain", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: HOST:PORT\r\nContent-Length: %d\r\n"+chromeHeaders+
			"Content-Type: text/plain;charset=UTF-8\r\nAccept: */*\r\nOrigin: http://attacker.example\r\n"+
			"Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: empty\r\nReferer: http://attacker.example/\r\n\r\n%s", n, body)},
		{"cross-site form, enctype text/plain", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: HOST:PORT\r\nContent-Length: %d\r\n"+chromeHeaders+
			"Cache-Control: max-age=0\r\nContent-Type: text/plain\r\nOrigin: http://attacker.example\r\nUpgrade-Insecure-Requests: 1\r\n"+
			"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"+
			"Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-User: ?1\r\nSec-Fetch-Dest: document\r\nReferer: http://attacker.example/\r\n\r\n%s", n, body)},
		{"cross-site POST of an older browser (no Sec-Fetch-*)", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: HOST:PORT\r\nContent-Length: %d\r\n"+
			"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:89.0) Gecko/20100101 Firefox/89.0\r\nAccept: */*\r\n"+
			"Content-Type: text/plain;charset=UTF-8\r\nOrigin: http://attacker.example\r\nReferer: http://attacker.example/\r\n\r\n%s", n, body)},
		{"cross-site POST with no Origin (stripped by a privacy setting)", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: HOST:PORT\r\nContent-Length: %d\r\n"+
			"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:89.0) Gecko/20100101 Firefox/89.0\r\nAccept: */*\r\n"+
			"Content-Type: application/x-www-form-urlencoded\r\n\r\n%s", n, body)},
		{"sandboxed iframe (Origin null)", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: HOST:PORT\r\nContent-Length: %d\r\n"+chromeHeaders+
			"Content-Type: application/json\r\nAccept: */*\r\nOrigin: null\r\n\r\n%s", n, body)},
		{"another port of the same host (same-site)", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: HOST:PORT\r\nContent-Length: %d\r\n"+chromeHeaders+
			"Content-Type: text/plain;charset=UTF-8\r\nAccept: */*\r\nOrigin: http://HOST:3000\r\n"+
			"Sec-Fetch-Site: same-site\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: empty\r\n\r\n%s", n, body)},
		{"DNS rebinding: a same-origin POST to attacker.example", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: attacker.example:PORT\r\nContent-Length: %d\r\n"+chromeHeaders+
			"Content-Type: application/json\r\nAccept: */*\r\nOrigin: http://attacker.example:PORT\r\n"+
			"Sec-Fetch-Site: same-origin\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Dest: empty\r\nReferer: http://attacker.example:PORT/\r\n\r\n%s", n, body)},
		{"the issue's curl: Host and Origin attacker.example, text/plain", fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: attacker.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n"+
			"Origin: http://attacker.example\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", n, body)},
	}
}

// rebindReads are the reads a page that rebound attacker.example to the
// listener makes: same-origin in the browser's eyes, so no Origin.
var rebindReads = []browserRequest{
	{"DNS rebinding: GET /v1/status", "GET /v1/status HTTP/1.1\r\nHost: attacker.example:PORT\r\n" + chromeHeaders +
		"Accept: */*\r\nSec-Fetch-Site: same-origin\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Dest: empty\r\nReferer: http://attacker.example:PORT/\r\n\r\n"},
	{"DNS rebinding: GET /v1/watch", "GET /v1/watch HTTP/1.1\r\nHost: attacker.example:PORT\r\n" + chromeHeaders +
		"Accept: */*\r\nSec-Fetch-Site: same-origin\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Dest: empty\r\n\r\n"},
	{"DNS rebinding: GET /metrics", "GET /metrics HTTP/1.1\r\nHost: attacker.example:PORT\r\n" + chromeHeaders +
		"Accept: */*\r\nSec-Fetch-Site: same-origin\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Dest: empty\r\n\r\n"},
}

// sendRaw sends raw, HOST and PORT replaced by the TCP listener's, on a
// new connection and returns the answer.
func (e *env) sendRaw(raw string) (*http.Response, string) {
	e.t.Helper()
	host, port, _ := net.SplitHostPort(e.agent.Addr().String())
	raw = strings.NewReplacer("HOST", host, "PORT", port).Replace(raw)
	c := e.dialRaw("tcp")
	defer c.Close()
	_, err := io.WriteString(c, raw)
	must(e.t, err)
	return readResponse(e.t, c, bufio.NewReader(c))
}

// TestBrowsersCannotDriveThePlaintextListener: what a web page can make a
// browser send to a plaintext listener on loopback (a cross-site simple
// POST in every form a browser sends one, and reads after DNS rebinding)
// is refused with 403 or 415 and starts nothing; the same Clone from a
// client that calls the listener by its address with application/json is
// served.
func TestBrowsersCannotDriveThePlaintextListener(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1"))
	body := `{"grantUID":"` + uid + `","session":"="}`
	for _, br := range append(browserAttacks(body), rebindReads...) {
		resp, got := e.sendRaw(br.raw)
		if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("%s: %d %s, want 403 or 415", br.name, resp.StatusCode, got)
		}
		if strings.Contains(got, uid) || strings.Contains(got, "fiberd_") {
			t.Errorf("%s: the answer leaks the agent's state: %s", br.name, got)
		}
	}
	if st := e.status(); st.Grants[0].Running != 0 {
		t.Fatalf("browser requests started %d fibers", st.Grants[0].Running)
	}

	host, port, _ := net.SplitHostPort(e.agent.Addr().String())
	for i, ok := range []struct{ name, host, origin string }{
		{"by address", host + ":" + port, ""},
		{"by localhost", "localhost:" + port, ""},
		{"same-origin page", host + ":" + port, "http://" + host + ":" + port},
	} {
		// A session each: on plaintext a Clone of a taken session needs
		// its key (TestSessionAttachNeedsProofOnPlaintext).
		body := fmt.Sprintf(`{"grantUID":%q,"session":"=%d"}`, uid, i)
		raw := fmt.Sprintf("POST /v1/clone HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json; charset=utf-8\r\n", ok.host)
		if ok.origin != "" {
			raw += "Origin: " + ok.origin + "\r\n"
		}
		raw += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
		if resp, got := e.sendRaw(raw); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s, want 200", ok.name, resp.StatusCode, got)
		}
	}
	// The unix socket does not check: no browser reaches it, and curl -d
	// sends a form's Content-Type.
	req, err := http.NewRequest(http.MethodPost, "http://fiberd/v1/clone", strings.NewReader(body))
	must(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://attacker.example")
	resp, err := e.unix.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("curl -d on the unix socket: %d, want 200", resp.StatusCode)
	}
}

// tlsSetup makes a server certificate and a client CA in a temporary
// directory: the option that serves TLS with them, and a client (with a
// certificate chained to the client CA, or none).
func tlsSetup(t *testing.T) (envOption, func(withCert bool) *http.Client) {
	dir := t.TempDir()
	ca, caKey := newCA(t, "client-ca")
	sca, scaKey := newCA(t, "server-ca")
	writeCert(t, filepath.Join(dir, "ca.pem"), ca, nil)
	srv, srvKey := leafCert(t, sca, scaKey, "fiberd", true)
	writeCert(t, filepath.Join(dir, "srv.pem"), srv, nil)
	writeCert(t, filepath.Join(dir, "srv.key"), nil, srvKey)
	cli, cliKey := leafCert(t, ca, caKey, "caller", false)
	roots := x509.NewCertPool()
	roots.AddCert(sca)
	opt := withConfig(func(c *Config) {
		c.InsecurePlaintext = false
		c.TLSCert, c.TLSKey, c.ClientCA = filepath.Join(dir, "srv.pem"), filepath.Join(dir, "srv.key"), filepath.Join(dir, "ca.pem")
	})
	return opt, func(withCert bool) *http.Client {
		tc := &tls.Config{RootCAs: roots, ServerName: "fiberd"}
		if withCert {
			tc.Certificates = []tls.Certificate{{Certificate: [][]byte{cli.Raw}, PrivateKey: cliKey}}
		}
		tr := &http.Transport{TLSClientConfig: tc}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
}

// TestCrossSiteRefusedOnTLS: a browser holding the operator's client
// certificate is still refused a cross-site request on the TLS listener;
// a client's request is served.
func TestCrossSiteRefusedOnTLS(t *testing.T) {
	opt, client := tlsSetup(t)
	e := newEnv(t, opt)
	uid := e.deliver(e.mint("g1"))
	c := client(true)
	url := "https://" + e.agent.Addr().String() + "/v1/clone"
	for _, h := range []map[string]string{
		{"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain;charset=UTF-8"},
		{"Origin": "https://attacker.example"},
		{"Sec-Fetch-Site": "same-site"},
	} {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"grantUID":"`+uid+`"}`))
		must(t, err)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("TLS request with %v: %d, want 403", h, resp.StatusCode)
		}
	}
	resp, err := c.Post(url, "application/json", strings.NewReader(`{"grantUID":"`+uid+`"}`))
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("TLS client's Clone: %d, want 200", resp.StatusCode)
	}
}

// listener is one listener kind as a caller reaches it.
type listener struct {
	name   string
	client *http.Client
	base   string
	authed bool
}

func (e *env) call(l listener, method, path string, v any) reply {
	e.t.Helper()
	var body io.Reader
	if v != nil {
		b, err := json.Marshal(v)
		must(e.t, err)
		body = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, l.base+path, body)
	must(e.t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := l.client.Do(req)
	must(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(e.t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// firstWatchLine is the first line /v1/watch sends on l.
func (e *env) firstWatchLine(l listener) string {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, l.base+"/v1/watch", nil)
	must(e.t, err)
	resp, err := l.client.Do(req)
	must(e.t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	must(e.t, err)
	return line
}

// TestUnauthenticatedCallersCannotActOnOthersFibers: on every listener
// kind, the rule of docs/api.md. The unix socket and TLS with a client
// certificate authenticate: status and watch show every fiber, and a
// fiber id is enough to release or park. Plaintext TCP does not: status
// and watch show counts only (no fiber id, endpoint or session), and a
// release or park needs the fiber's release key or its grant's token.
func TestUnauthenticatedCallersCannotActOnOthersFibers(t *testing.T) {
	for _, tc := range []struct {
		name string
		mk   func(t *testing.T) (*env, listener)
	}{
		{"unix socket", func(t *testing.T) (*env, listener) {
			e := newEnv(t)
			return e, listener{"unix socket", e.unix, "http://fiberd", true}
		}},
		{"plaintext TCP", func(t *testing.T) (*env, listener) {
			e := newEnv(t)
			return e, listener{"plaintext TCP", e.tcp, e.tcpBase, false}
		}},
		{"TLS with a client certificate", func(t *testing.T) (*env, listener) {
			opt, client := tlsSetup(t)
			e := newEnv(t, opt)
			return e, listener{"TLS", client(true), "https://" + e.agent.Addr().String(), true}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, l := tc.mk(t)
			tok1, tok2 := e.mint("g1"), e.mint("g2")
			e.deliver(tok1)
			e.deliver(tok2)
			owner := listener{"unix", e.unix, "http://fiberd", true}
			// Fibers of another caller, cloned on the unix socket.
			a := e.call(owner, http.MethodPost, "/v1/clone", api.CloneRequest{GrantUID: "g1", Session: "owner-secret"}).clone(t)
			b := e.call(owner, http.MethodPost, "/v1/clone", api.CloneRequest{GrantUID: "g2"}).clone(t)
			if a.ReleaseKey == "" || a.ReleaseKey == b.ReleaseKey {
				t.Errorf("release keys %q and %q: want one per fiber", a.ReleaseKey, b.ReleaseKey)
			}
			// An attach on l answers the same fiber and key: on a listener
			// that authenticates without proof, on plaintext TCP only with
			// the session's key (without it: 401, revealing nothing).
			attach := api.CloneRequest{GrantUID: "g1", Session: "owner-secret"}
			if !l.authed {
				if at := e.call(l, http.MethodPost, "/v1/clone", attach); at.status != http.StatusUnauthorized || at.apiError(t).Code != api.CodeUnauthenticated ||
					strings.Contains(string(at.body), a.FiberID) || strings.Contains(string(at.body), a.ReleaseKey) {
					t.Errorf("attach without proof on %s: %d %s, want 401", l.name, at.status, at.body)
				}
				attach.ReleaseKey = a.ReleaseKey
			}
			if at := e.call(l, http.MethodPost, "/v1/clone", attach); at.status != 200 ||
				at.clone(t).FiberID != a.FiberID || at.clone(t).ReleaseKey != a.ReleaseKey {
				t.Errorf("attach on %s: %d %s", l.name, at.status, at.body)
			}

			checkRedaction(t, e, l, a, b)

			if l.authed {
				if r := e.call(l, http.MethodPost, "/v1/park", api.FiberRequest{FiberID: b.FiberID}); r.status != http.StatusPreconditionFailed {
					t.Errorf("park by id on %s: %d %s, want 412", l.name, r.status, r.body)
				}
				if r := e.call(l, http.MethodPost, "/v1/release", api.FiberRequest{FiberID: a.FiberID}); r.status != 200 {
					t.Errorf("release by id on %s: %d %s, want 200", l.name, r.status, r.body)
				}
				return
			}
			for _, bad := range []struct {
				name string
				req  api.FiberRequest
			}{
				{"id only", api.FiberRequest{FiberID: a.FiberID}},
				{"another fiber's key", api.FiberRequest{FiberID: a.FiberID, ReleaseKey: b.ReleaseKey}},
				{"a made-up key", api.FiberRequest{FiberID: a.FiberID, ReleaseKey: base64.RawURLEncoding.EncodeToString(make([]byte, 16))}},
				{"not a key", api.FiberRequest{FiberID: a.FiberID, ReleaseKey: "!\x1b[2J"}},
				{"another grant's token", api.FiberRequest{FiberID: a.FiberID, Grant: tok2}},
				{"a token from an untrusted key", api.FiberRequest{FiberID: a.FiberID, Grant: e.mintWith(e.other, "g1")}},
			} {
				for _, path := range []string{"/v1/release", "/v1/park"} {
					if r := e.call(l, http.MethodPost, path, bad.req); r.status != http.StatusUnauthorized || r.apiError(t).Code != api.CodeUnauthenticated {
						t.Errorf("%s with %s on %s: %d %s, want 401", path, bad.name, l.name, r.status, r.body)
					}
				}
			}
			if st := e.status(); st.Grants[0].Running != 1 || st.Grants[1].Running != 1 {
				t.Fatalf("refused releases ended fibers: %+v", st.Grants)
			}
			if r := e.call(l, http.MethodPost, "/v1/park", api.FiberRequest{FiberID: a.FiberID, ReleaseKey: a.ReleaseKey}); r.status != http.StatusPreconditionFailed {
				t.Errorf("park with the release key: %d %s, want 412 (no checkpoint tier)", r.status, r.body)
			}
			if r := e.call(l, http.MethodPost, "/v1/release", api.FiberRequest{FiberID: a.FiberID, ReleaseKey: a.ReleaseKey}); r.status != 200 {
				t.Errorf("release with the release key: %d %s, want 200", r.status, r.body)
			}
			if r := e.call(l, http.MethodPost, "/v1/release", api.FiberRequest{FiberID: b.FiberID, Grant: tok2}); r.status != 200 {
				t.Errorf("release with the grant's token: %d %s, want 200", r.status, r.body)
			}
			if r := e.call(l, http.MethodPost, "/v1/release", api.FiberRequest{FiberID: b.FiberID, Grant: tok2}); r.status != http.StatusNotFound {
				t.Errorf("second release: %d %s, want 404", r.status, r.body)
			}
		})
	}
}

// checkRedaction: the status and the watch on l show both grants with their
// counts, and the fibers a and b (their ids, endpoints and session) only
// where l authenticates its callers; elsewhere they are redacted.
func checkRedaction(t *testing.T, e *env, l listener, a, b api.CloneResponse) {
	t.Helper()
	st := e.call(l, http.MethodGet, "/v1/status", nil)
	watch := e.firstWatchLine(l)
	for what, body := range map[string]string{"status": string(st.body), "watch": watch} {
		var s api.Status
		must(t, json.Unmarshal([]byte(body), &s))
		if len(s.Grants) != 2 || s.Grants[0].Running+s.Grants[1].Running != 2 {
			t.Errorf("%s on %s: want both grants with their counts: %s", what, l.name, body)
		}
		secrets := []string{a.FiberID, a.Endpoint, "owner-secret", b.FiberID, b.Endpoint}
		for _, s := range secrets {
			if strings.Contains(body, s) != l.authed {
				t.Errorf("%s on %s: shows %q = %v, want %v", what, l.name, s, !l.authed, l.authed)
			}
		}
		if s.Redacted == l.authed {
			t.Errorf("%s on %s: redacted = %v", what, l.name, s.Redacted)
		}
	}
}

// TestCloneInputs: a session with control characters or over 256 bytes,
// and a grantUID that is not a grant UID, are 400, and the answer never
// repeats the value whole; a token issued beyond the clock skew, or with
// a crit header, is 401 saying why.
func TestCloneInputs(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1", maxFibers(64)))
	for _, s := range []string{"\x1b[2J\x1b[Hgrant g1 revoked", "a\nforged line", "a\rb", strings.Repeat("s", 20000),
		strings.Repeat("s", api.MaxSession+1), "right\u202eleft", "nul\x00", "del\x7f", "c1\u009b2J"} {
		r := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: s})
		if r.status != 400 || strings.Contains(string(r.body), s) || len(r.body) > 512 {
			t.Errorf("session %.40q: %d %.200s, want a short 400", s, r.status, r.body)
		}
	}
	for _, s := range []string{"café 1", "user@example.com/tab 3", strings.Repeat("s", api.MaxSession)} {
		if r := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: s}); r.status != 200 {
			t.Errorf("session %.40q: %d %s, want 200", s, r.status, r.body)
		}
	}
	for _, g := range []string{"../../etc", "a\x00b", strings.Repeat("a", 5000), "G1", "g1\n", "-g1"} {
		r := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: g})
		if r.status != 400 || len(r.body) > 512 || (len(g) > 64 && strings.Contains(string(r.body), g[:64])) {
			t.Errorf("grantUID %.40q: %d %.200s, want a short 400", g, r.status, r.body)
		}
	}
	r := e.post(e.tcp, "/v1/release", api.FiberRequest{FiberID: strings.Repeat("x", 5000) + "/1/1"})
	if r.status != 400 || len(r.body) > 512 {
		t.Errorf("a 5000-byte fiber id: %d %.200s, want a short 400", r.status, r.body)
	}

	future := e.mint("g2", issuedAt(e.clk.Now().Add(time.Hour)))
	if r := e.cloneReq(e.tcp, api.CloneRequest{Grant: future}); r.status != 401 || !strings.Contains(string(r.body), "in the future") {
		t.Errorf("token issued an hour ahead: %d %s, want 401", r.status, r.body)
	}
	if r := e.cloneReq(e.tcp, api.CloneRequest{Grant: e.mint("g3", issuedAt(e.clk.Now().Add(30*time.Second)))}); r.status != 200 {
		t.Errorf("token issued 30s ahead (within the default skew): %d %s, want 200", r.status, r.body)
	}
	crit := e.signCrit(e.mint("g4"), "urn:example:policy")
	if r := e.cloneReq(e.tcp, api.CloneRequest{Grant: crit}); r.status != 401 || !strings.Contains(string(r.body), `critical header extension \"urn:example:policy\" is not supported`) {
		t.Errorf("token with crit: %d %s, want 401 naming the extension", r.status, r.body)
	}
}

// TestClockSkewConfigurable: ClockSkew widens what iat may be ahead.
func TestClockSkewConfigurable(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.ClockSkew = 2 * time.Hour }))
	if r := e.cloneReq(e.tcp, api.CloneRequest{Grant: e.mint("g1", issuedAt(e.clk.Now().Add(time.Hour)))}); r.status != 200 {
		t.Errorf("token issued an hour ahead with a skew of 2h: %d %s, want 200", r.status, r.body)
	}
}

// signCrit re-signs token's payload with the test key, its header naming
// crit as critical extensions.
func (e *env) signCrit(token string, crit ...string) string {
	e.t.Helper()
	payload, err := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[1])
	must(e.t, err)
	opts := (&jose.SignerOptions{}).WithHeader("kid", e.key.KeyID).WithHeader("crit", crit)
	for _, c := range crit {
		opts = opts.WithHeader(jose.HeaderKey(c), true)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: e.key.Key}, opts)
	must(e.t, err)
	jws, err := s.Sign(payload)
	must(e.t, err)
	out, err := jws.CompactSerialize()
	must(e.t, err)
	return out
}

// TestClientOnThePlaintextListener: pkg/client, as fiberctl uses it, works
// with the rule on a plaintext listener: its requests pass the browser
// guard, Clone answers a release key, a Clone of the taken session is
// refused without the key and attaches with it, a release by id alone is
// refused and one with the key ends the fiber, and the status is redacted.
func TestClientOnThePlaintextListener(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1"))
	c, err := client.New(client.Config{Addr: e.agent.Addr().String()})
	must(t, err)
	ctx := context.Background()
	resp, err := c.Clone(ctx, api.CloneRequest{GrantUID: uid, Session: "s"})
	if err != nil || resp.ReleaseKey == "" {
		t.Fatalf("Clone = %+v, %v; want a fiber with a release key", resp, err)
	}
	if _, err := c.Clone(ctx, api.CloneRequest{GrantUID: uid, Session: "s"}); !errors.Is(err, core.ErrUnauthenticated) {
		t.Errorf("Clone of the taken session without its key = %v, want unauthenticated", err)
	}
	if at, err := c.Clone(ctx, api.CloneRequest{GrantUID: uid, Session: "s", ReleaseKey: resp.ReleaseKey}); err != nil || at.Kind != api.KindAttach || at.FiberID != resp.FiberID {
		t.Errorf("Clone of the session with its key = %+v, %v; want an attach to %s", at, err, resp.FiberID)
	}
	if err := c.Release(ctx, resp.FiberID); !errors.Is(err, core.ErrUnauthenticated) {
		t.Errorf("Release by id = %v, want unauthenticated", err)
	}
	st, err := c.Status(ctx)
	if err != nil || !st.Redacted || len(st.Grants) != 1 || st.Grants[0].Running != 1 || st.Grants[0].Fibers != nil {
		t.Errorf("Status = %+v, %v; want redacted, one running", st, err)
	}
	if err := c.ReleaseFiber(ctx, api.FiberRequest{FiberID: resp.FiberID, ReleaseKey: resp.ReleaseKey}); err != nil {
		t.Errorf("ReleaseFiber with the key: %v", err)
	}
	if st := e.status(); st.Grants[0].Running != 0 {
		t.Errorf("%d fibers still run after the release", st.Grants[0].Running)
	}
}

// TestRedact: what an unauthenticated caller reads names no fiber, not even
// one that has ended, and the status it was made from is left whole for
// the callers who may read it.
func TestRedact(t *testing.T) {
	f := core.Fence{GrantUID: "g1", Epoch: 2, Seq: 5}
	full := api.Status{Grants: []api.GrantStatus{{
		UID: "g1", Running: 1, Max: 4, LatestFence: &f,
		Fibers:         []api.FiberStatus{{FiberID: "g1/2/5", Endpoint: "tcp://127.0.0.1:20005", Session: "s"}},
		ParkedSessions: []api.ParkedSession{{Session: "p", FiberID: "g1/2/4"}}, Parked: 1,
		Exits: []api.FiberExit{{FiberID: "g1/2/3", Reason: "exit:0"}},
	}}}
	r := redact(full)
	g := r.Grants[0]
	if !r.Redacted || g.Fibers != nil || g.LatestFence != nil || g.ParkedSessions != nil || g.Running != 1 || g.Parked != 1 {
		t.Errorf("redacted grant %+v", g)
	}
	if len(g.Exits) != 1 || g.Exits[0].FiberID != "" || g.Exits[0].Reason != "exit:0" {
		t.Errorf("redacted exits %+v, want the reason without the fiber id", g.Exits)
	}
	if o := full.Grants[0]; o.Exits[0].FiberID != "g1/2/3" || len(o.Fibers) != 1 || o.LatestFence == nil {
		t.Errorf("redact changed the status it was given: %+v", o)
	}
}

// FuzzBrowserCheck feeds arbitrary Host, Origin, Sec-Fetch-Site and
// Content-Type headers to the guard of a plaintext loopback listener on
// 127.0.0.1:8484. It must not panic; what it lets through names the
// listener (its address or localhost, port 8484), is same-origin or
// carries no Origin, and is a JSON POST; a refusal quotes the headers
// short, never raw.
func FuzzBrowserCheck(f *testing.F) {
	for _, s := range [][4]string{
		{"127.0.0.1:8484", "", "", "application/json"},
		{"localhost:8484", "http://localhost:8484", "same-origin", "application/json; charset=utf-8"},
		{"attacker.example:8484", "http://attacker.example:8484", "same-origin", "application/json"},
		{"127.0.0.1:8484", "http://attacker.example", "cross-site", "text/plain;charset=UTF-8"},
		{"127.0.0.1:8484", "null", "", "application/x-www-form-urlencoded"},
		{"[::1]:8484", "", "", "application/json"},
		{"127.0.0.1", "", "none", "application/json"},
		{"127.0.0.1:08484", "http://127.0.0.1:8484/", "", "application/json"},
		{"LOCALHOST:8484", "http://user@localhost:8484", "", "APPLICATION/JSON"},
		{"127.0.0.1:8484\x1b[2J", "\x00", "\n", "\xff"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8484}
	f.Fuzz(func(t *testing.T, host, origin, site, ctype string) {
		r := &http.Request{Method: http.MethodPost, Host: host, Header: http.Header{}}
		for k, v := range map[string]string{"Origin": origin, "Sec-Fetch-Site": site, "Content-Type": ctype} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		status, err := browserCheck(r, local, true)
		if err != nil {
			if status != http.StatusForbidden && status != http.StatusUnsupportedMediaType {
				t.Fatalf("refused with status %d: %v", status, err)
			}
			if msg := err.Error(); len(msg) > 512 || strings.ContainsAny(msg, "\x00\x1b\n\r") {
				t.Fatalf("refusal not short and escaped: %q", msg)
			}
			return
		}
		name, port, perr := net.SplitHostPort(host)
		if perr != nil || port != "8484" || (name != "127.0.0.1" && !strings.EqualFold(name, "localhost")) {
			t.Fatalf("served Host %q", host)
		}
		if origin != "" && !strings.EqualFold(strings.TrimSuffix(origin, "/"), "http://"+host) {
			t.Fatalf("served Origin %q for Host %q", origin, host)
		}
		if site != "" && site != "same-origin" && site != "none" {
			t.Fatalf("served Sec-Fetch-Site %q", site)
		}
		if mt, _, err := mime.ParseMediaType(ctype); err != nil || mt != "application/json" {
			t.Fatalf("served Content-Type %q", ctype)
		}
	})
}

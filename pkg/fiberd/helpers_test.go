package fiberd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr/testr"
	"go.uber.org/goleak"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	homefake "fiberd.io/fiberd/pkg/home/fake"
	"fiberd.io/fiberd/pkg/template"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testIssuer = "https://issuer.test"
	testNode   = "node-1"
)

var testStart = time.Date(2026, 11, 7, 12, 0, 0, 0, time.UTC)

// The fake home satisfies the agent's optional home interfaces the tests
// rely on (it cannot say so itself: it does not import this package).
var (
	_ ScopeLoser      = (*homefake.Home)(nil)
	_ IssuerOverrider = (*homefake.Home)(nil)
)

// testHomeConfig is the fake home's configuration for the agent's tests:
// health on clk, and /dev/null as the one static device every grant gets.
func testHomeConfig(clk clock.PassiveClock) homefake.Config {
	return homefake.Config{Clock: clk, Devices: []string{"/dev/null"}}
}

// newTestHome is a fake home on testHomeConfig(clk).
func newTestHome(clk clock.PassiveClock) *homefake.Home {
	return homefake.New(testHomeConfig(clk))
}

// switchKeys is a KeySource whose keys can be made unverifiable.
type switchKeys struct {
	keys grant.KeySource
	mu   sync.Mutex
	down bool
}

func (s *switchKeys) Key(ctx context.Context, kid string) (*jose.JSONWebKey, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return nil, fmt.Errorf("keys never loaded: %w", core.ErrUnverifiable)
	}
	return s.keys.Key(ctx, kid)
}

func (s *switchKeys) setDown(d bool) {
	s.mu.Lock()
	s.down = d
	s.mu.Unlock()
}

// env is one agent under test with its fakes.
type env struct {
	t        testing.TB
	clk      *clocktesting.FakeClock
	homeCfg  homefake.Config // what newEnv builds home from, after the options
	home     *homefake.Home
	warm     *fake.Backend
	basic    *fake.Backend
	keys     *switchKeys
	signer   *grant.Signer
	key      jose.JSONWebKey // signer's private key
	other    *grant.Signer   // a key the agent does not trust
	zygote   string          // template ref of a zygote template
	plain    string          // template ref of a non-zygote template
	cfg      Config
	agent    *Agent
	tcp      *http.Client
	unix     *http.Client
	tcpBase  string
	stop     func()
	runErr   chan error
	stateDir string
	pressure pressureReader                    // replaces the agent's readPressure when set
	measure  func([]int) (int64, error)        // replaces the agent's measure when set
	scratch  func(int) int64                   // replaces the agent's scratch when set
	parkSize func(*fiberHandle) (int64, error) // replaces the agent's park.size when set
}

type envOption func(*env)

func withHooks(h fake.Hooks) envOption {
	return func(e *env) {
		_ = e.warm.Close()
		e.warm = fake.New(core.TierWarm, h)
	}
}

func withConfig(f func(*Config)) envOption {
	return func(e *env) { f(&e.cfg) }
}

// withHome changes the fake home's configuration before newEnv builds it.
func withHome(f func(*homefake.Config)) envOption {
	return func(e *env) { f(&e.homeCfg) }
}

// newEnv builds and runs an agent on a fake home, fake backends and a fake
// clock, listening on loopback plaintext TCP and a unix socket.
func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	e := &env{t: t, clk: clocktesting.NewFakeClock(testStart)}
	e.homeCfg = testHomeConfig(e.clk)
	e.warm = fake.New(core.TierWarm, fake.Hooks{})
	e.basic = fake.New(core.TierBasic, fake.Hooks{})

	key, err := grant.GenerateKey("EdDSA", "k1")
	must(t, err)
	e.signer, err = grant.NewSigner(key)
	must(t, err)
	e.key = key
	jwks, err := grant.PublicJWKS(key)
	must(t, err)
	static, err := grant.NewStaticKeys(jwks)
	must(t, err)
	e.keys = &switchKeys{keys: static}
	okey, err := grant.GenerateKey("EdDSA", "k1")
	must(t, err)
	e.other, err = grant.NewSigner(okey)
	must(t, err)

	// Short paths: unix socket paths are limited to 108 bytes.
	state, err := os.MkdirTemp("", "fd")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(state) })
	e.stateDir = state
	tdir := filepath.Join(state, "templates")
	must(t, os.MkdirAll(tdir, 0o755))
	e.zygote = writeTemplate(t, tdir, "counter", `{"command":"/bin/true","zygote":true}`)
	e.plain = writeTemplate(t, tdir, "plain", `{"command":"/bin/true","zygote":false}`)

	e.cfg = Config{
		Issuer: testIssuer, NodeID: testNode, Keys: e.keys, Templates: tdir,
		StateDir: state, Listen: "127.0.0.1:0", InsecurePlaintext: true,
		Clock: e.clk, Logger: testr.NewWithInterface(t, testr.Options{Verbosity: 1}),
	}
	for _, o := range opts {
		o(e)
	}
	e.home = homefake.New(e.homeCfg)
	e.cfg.Home = e.home
	if e.warm != nil {
		e.cfg.Warm = e.warm
	}
	if e.basic != nil {
		e.cfg.Basic = e.basic
	}
	e.start()
	return e
}

// noWarm leaves the agent without a WARM backend.
func noWarm() envOption {
	return func(e *env) {
		_ = e.warm.Close()
		e.warm = nil
	}
}

// start runs a fresh agent on e.cfg.
func (e *env) start() {
	t := e.t
	t.Helper()
	a, err := New(context.Background(), e.cfg)
	must(t, err)
	e.agent = a
	if e.pressure != nil {
		a.readPressure = e.pressure // before Run: no Clone reads it yet
	}
	if e.measure != nil {
		a.measure = e.measure
	}
	if e.scratch != nil {
		a.scratch = e.scratch
	}
	if e.parkSize != nil {
		a.park.size = e.parkSize
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.runErr = make(chan error, 1)
	go func() { e.runErr <- a.Run(ctx) }()
	tt := &http.Transport{}
	e.tcp = &http.Client{Transport: tt}
	e.tcpBase = "http://" + a.Addr().String()
	sock := a.SocketPath()
	ut := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	e.unix = &http.Client{Transport: ut}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-e.runErr:
				if err != nil {
					t.Errorf("Run returned %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("Run did not return after its context ended")
			}
			tt.CloseIdleConnections()
			ut.CloseIdleConnections()
		})
	}
	t.Cleanup(e.stop)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeTemplate(t testing.TB, dir, name, spec string) string {
	t.Helper()
	must(t, os.WriteFile(filepath.Join(dir, name+".json"), []byte(spec), 0o644))
	return name + "@sha256:" + template.Digest([]byte(spec))
}

// grantOpt adjusts a grant before it is minted.
type grantOpt func(*core.Grant)

func lease(d time.Duration) grantOpt {
	return func(g *core.Grant) { g.Expiry = g.IssuedAt.Add(d) }
}
func tier(t core.Tier) grantOpt { return func(g *core.Grant) { g.MinTier = t } }
func templ(ref string) grantOpt { return func(g *core.Grant) { g.Template = ref } }
func maxFibers(n int) grantOpt  { return func(g *core.Grant) { g.Fibers.Max = n } }
func issuedAt(at time.Time) grantOpt {
	return func(g *core.Grant) { g.IssuedAt = at; g.Expiry = at.Add(time.Hour) }
}

// mint signs a grant uid for the test node: the zygote template, max 4,
// a one-hour lease from the fake clock's now.
func (e *env) mint(uid string, opts ...grantOpt) string {
	return e.mintWith(e.signer, uid, opts...)
}

func (e *env) mintWith(s *grant.Signer, uid string, opts ...grantOpt) string {
	e.t.Helper()
	now := e.clk.Now().Truncate(time.Second)
	g := core.Grant{UID: uid, Issuer: testIssuer, Audience: testNode, Template: e.zygote,
		Fibers: core.Fibers{Max: 4}, IssuedAt: now, Expiry: now.Add(time.Hour)}
	for _, o := range opts {
		o(&g)
	}
	tok, err := s.Mint(g)
	must(e.t, err)
	return string(tok)
}

// deliver puts a GrantAdded on the lane and waits until the grant is warm.
func (e *env) deliver(token string) string {
	e.t.Helper()
	uid, err := grant.PeekUID([]byte(token))
	must(e.t, err)
	e.home.Deliver(uid, []byte(token))
	e.eventually("grant "+uid+" warm", func() bool { return e.agent.isWarm(uid) && e.home.IsReady(uid) })
	return uid
}

// remove puts a GrantRemoved of uid on the lane.
func (e *env) remove(uid string) {
	e.home.Remove(uid)
}

// loseScope makes the fake home lose its scope with reason, and returns
// once the agent's handler did. It fails the test if the agent registered
// no handler.
func (e *env) loseScope(reason string) {
	e.t.Helper()
	if !e.home.LoseScope(context.Background(), reason) {
		e.t.Fatalf("losing the scope (%s): the agent registered no handler", reason)
	}
}

// eventually polls cond for up to 10 s of wall time.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	for i := 0; i < 1000; i++ {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("timed out waiting for %s", what)
}

// reply is an HTTP answer, decoded.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) clone(t testing.TB) api.CloneResponse {
	t.Helper()
	var c api.CloneResponse
	if err := json.Unmarshal(r.body, &c); err != nil {
		t.Fatalf("clone response %s: %v", r.body, err)
	}
	return c
}

func (r reply) apiError(t testing.TB) api.Error {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	return e
}

func (e *env) do(c *http.Client, method, path string, body io.Reader) reply {
	e.t.Helper()
	base := e.tcpBase
	if c == e.unix {
		base = "http://fiberd"
	}
	req, err := http.NewRequest(method, base+path, body)
	must(e.t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	must(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(e.t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) post(c *http.Client, path string, v any) reply {
	e.t.Helper()
	var b []byte
	switch x := v.(type) {
	case string:
		b = []byte(x)
	default:
		var err error
		b, err = json.Marshal(v)
		must(e.t, err)
	}
	return e.do(c, http.MethodPost, path, bytes.NewReader(b))
}

func (e *env) cloneReq(c *http.Client, req api.CloneRequest) reply {
	e.t.Helper()
	return e.post(c, "/v1/clone", req)
}

func (e *env) status() api.Status {
	e.t.Helper()
	r := e.do(e.unix, http.MethodGet, "/v1/status", nil)
	if r.status != 200 {
		e.t.Fatalf("status: %d %s", r.status, r.body)
	}
	var st api.Status
	must(e.t, json.Unmarshal(r.body, &st))
	return st
}

// watchLines reads NDJSON lines from r into a channel.
func watchLines(r io.Reader) <-chan string {
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"fiberd.io/fiberd/pkg/api"
)

// DefaultTimeout bounds each call but Watch when its context has no
// deadline of its own.
const DefaultTimeout = 30 * time.Second

// maxResponseBody caps every response body read whole (everything but the
// watch stream). A status of many grants with their fibers fits easily.
const maxResponseBody = 8 << 20

// idleConnTimeout drops a kept-alive connection before fiberd's own idle
// timeout (fiberd.DefaultIdleTimeout, 30 s) would close it, so a request is
// never written onto a connection the agent is closing.
const idleConnTimeout = 20 * time.Second

// maxErrorText is how much of a body that is not an api.Error is kept in
// the *Error's message.
const maxErrorText = 512

// Config says how to reach one fiberd.
type Config struct {
	// Addr is the agent's address: "unix:///path/to/fiberd.sock" or an
	// absolute socket path for the unix socket; "host:port",
	// "http://host:port" or "https://host:port" for TCP. Required.
	// A bare host:port speaks TLS when TLS is set and plaintext otherwise;
	// an https URL without TLS uses the system roots and no client
	// certificate.
	Addr string
	// TLS is the client's TLS configuration for a TCP address: the CA the
	// server's certificate chains to and the client certificate fiberd
	// asks for (see TLSConfig). Nil means plaintext, which fiberd only
	// offers on loopback. Ignored for a unix socket.
	TLS *tls.Config
	// Timeout bounds each call but Watch whose context has no deadline.
	// Default DefaultTimeout.
	Timeout time.Duration
	// Transport replaces the transport built from Addr and TLS; tests use
	// it. Default: one built for Addr.
	Transport http.RoundTripper
}

// Validate reports the first field that is wrong and how to fix it.
func (c Config) Validate() error {
	if c.Addr == "" {
		return fmt.Errorf("client: Addr is empty: set unix:///path/to/fiberd.sock or host:port")
	}
	if _, _, err := parseAddr(c.Addr, c.TLS != nil); err != nil {
		return err
	}
	if c.Timeout < 0 {
		return fmt.Errorf("client: Timeout %v is negative: use 0 for the default %v", c.Timeout, DefaultTimeout)
	}
	return nil
}

// Client calls one fiberd. It is safe for concurrent use. The zero value is
// not usable; build one with New.
type Client struct {
	base    string // scheme://host, no trailing slash
	http    *http.Client
	timeout time.Duration
}

// New validates cfg and returns a client. It dials nothing: the first call
// connects.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base, socket, _ := parseAddr(cfg.Addr, cfg.TLS != nil)
	rt := cfg.Transport
	if rt == nil {
		tr := &http.Transport{
			ForceAttemptHTTP2:   false,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     idleConnTimeout,
			TLSHandshakeTimeout: 10 * time.Second,
		}
		if socket != "" {
			d := net.Dialer{}
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", socket)
			}
		} else if cfg.TLS != nil {
			tr.TLSClientConfig = cfg.TLS.Clone()
		}
		rt = tr
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	// No http.Client.Timeout: it would cut the watch stream. Calls bound
	// themselves with their context instead.
	return &Client{base: base, http: &http.Client{Transport: rt}, timeout: timeout}, nil
}

// parseAddr turns an address into the base URL of requests and, for a unix
// socket, the socket's path.
func parseAddr(addr string, useTLS bool) (base, socket string, err error) {
	switch {
	case strings.HasPrefix(addr, "unix://"):
		p := strings.TrimPrefix(addr, "unix://")
		if !strings.HasPrefix(p, "/") {
			return "", "", fmt.Errorf("client: address %q: a unix socket path must be absolute (unix:///path)", addr)
		}
		return "http://fiberd", p, nil
	case strings.HasPrefix(addr, "/"):
		return "http://fiberd", addr, nil
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
		u, err := url.Parse(addr)
		if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return "", "", fmt.Errorf("client: address %q: want scheme://host:port with no path", addr)
		}
		return u.Scheme + "://" + u.Host, "", nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return "", "", fmt.Errorf("client: address %q: want unix:///path or host:port", addr)
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port), "", nil
}

// Clone asks for a fiber of the grant req names. A served Clone returns
// the fiber; a refusal returns an *Error (a miss unwraps to *core.Miss).
// On a listener that does not authenticate, a Clone of a session that has
// a fiber needs req.ReleaseKey (the session's, from the CloneResponse that
// created it) or req.Grant; without either it is an *Error unwrapping to
// core.ErrUnauthenticated.
func (c *Client) Clone(ctx context.Context, req api.CloneRequest) (api.CloneResponse, error) {
	var out api.CloneResponse
	err := c.do(ctx, http.MethodPost, "/v1/clone", req, &out)
	return out, err
}

// Release ends the fiber fiberID. An unknown fiber, or one of an older
// epoch, is an *Error unwrapping to core.ErrNotFound. The id alone is
// enough on a listener that authenticates (the unix socket, TLS); on
// plaintext TCP use ReleaseFiber with the fiber's release key.
func (c *Client) Release(ctx context.Context, fiberID string) error {
	return c.ReleaseFiber(ctx, api.FiberRequest{FiberID: fiberID})
}

// ReleaseFiber ends the fiber req names, with the proof a listener that
// does not authenticate asks for: req.ReleaseKey (the CloneResponse's) or
// req.Grant (a token of the fiber's grant). Without either there it is an
// *Error unwrapping to core.ErrUnauthenticated.
func (c *Client) ReleaseFiber(ctx context.Context, req api.FiberRequest) error {
	return c.do(ctx, http.MethodPost, "/v1/release", req, nil)
}

// Park parks the fiber fiberID: its memory is written to the home's disk,
// the fiber ends, and a Clone naming its session (and grant) resumes it;
// Release of fiberID deletes it. A tier without checkpoints is an *Error
// unwrapping to core.ErrTierGap; a fiber without a session one unwrapping
// to core.ErrInvalid; a busy fiber (409 BUSY) or one without room (507
// INSUFFICIENT_STORAGE) an *Error of that code, the fiber running on. Like
// Release, the id alone is enough only on a listener that authenticates
// (see ParkFiber).
func (c *Client) Park(ctx context.Context, fiberID string) (api.ParkResponse, error) {
	return c.ParkFiber(ctx, api.FiberRequest{FiberID: fiberID})
}

// ParkFiber parks the fiber req names, with the proof of ReleaseFiber.
func (c *Client) ParkFiber(ctx context.Context, req api.FiberRequest) (api.ParkResponse, error) {
	var out api.ParkResponse
	err := c.do(ctx, http.MethodPost, "/v1/park", req, &out)
	return out, err
}

// Status is the agent's status: its epoch, lane health and every admitted
// grant. On a listener that does not authenticate it is redacted
// (Status.Redacted): counts only, no fiber ids, endpoints or sessions.
func (c *Client) Status(ctx context.Context) (api.Status, error) {
	var out api.Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &out)
	return out, err
}

// Healthz reports whether the agent answers GET /healthz with 200.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil)
}

// Watch opens the status stream of GET /v1/watch. Read it with Next until
// it fails; Close it, or end ctx, to stop. ctx bounds the whole stream, not
// just the call.
func (c *Client) Watch(ctx context.Context) (*Watcher, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/watch", nil)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("watch: %w", readError(resp))
	}
	return &Watcher{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// Watcher is an open status stream. It is not safe for concurrent Next
// calls; Close may be called from any goroutine.
type Watcher struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// Next blocks for the next status. It returns io.EOF when the agent ended
// the stream, and the context's error (wrapped) once the watch's context
// ends or Close was called.
func (w *Watcher) Next() (api.Status, error) {
	var s api.Status
	if err := w.dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return s, io.EOF
		}
		return s, fmt.Errorf("watch: %w", err)
	}
	return s, nil
}

// Close ends the stream. It is idempotent.
func (w *Watcher) Close() error {
	w.body.Close()
	return nil
}

// do sends one request with a JSON body (nil for none) and decodes a 200's
// JSON body into out (nil to discard it).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %w", method, path, readError(resp))
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponseBody)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

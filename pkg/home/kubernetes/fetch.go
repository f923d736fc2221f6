package kubernetes

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// maxTokenSize caps a grant token, and so the body of a grant fetch.
const maxTokenSize = grant.MaxTokenSize

// maxSATokenSize caps the service-account token file read per request.
const maxSATokenSize = 64 << 10

// Backoff of the grant fetch: the first retry waits fetchBackoffMin, each
// next one twice as long, never more than fetchBackoffMax.
const (
	fetchBackoffMin = 500 * time.Millisecond
	fetchBackoffMax = 30 * time.Second
	// fetchRequestTimeout bounds one request of the grant fetch; the first
	// fetch's requests also end when GrantFetchTimeout has passed.
	fetchRequestTimeout = 30 * time.Second
)

// errNotYet is a 404 from the controller: it has no grant for this Pod yet.
var errNotYet = errors.New("the controller has no grant for this Pod yet (404)")

// fetcher gets the Pod's grant from the controller and writes it into the
// grants directory.
type fetcher struct {
	url       string // <GrantIssuerURL>/v1/grant
	tokenFile string
	path      string // GrantsDir/<PodUID>.jwt
	client    *http.Client
	transport *http.Transport
}

// newFetcher builds the fetcher of cfg, loading GrantCAFile.
func newFetcher(cfg Config) (*fetcher, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.GrantCAFile != "" {
		pem, err := os.ReadFile(cfg.GrantCAFile)
		if err != nil {
			return nil, fmt.Errorf("kubernetes home: GrantCAFile %s: %w: mount the controller's CA bundle there, or leave GrantCAFile empty for the system roots", cfg.GrantCAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kubernetes home: GrantCAFile %s holds no PEM certificate: give a PEM CA bundle", cfg.GrantCAFile)
		}
		tlsCfg.RootCAs = pool
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        1,
		IdleConnTimeout:     90 * time.Second,
	}
	client := &http.Client{
		Transport: tr,
		Timeout:   fetchRequestTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s refused: the grant fetch is https only", req.URL.Redacted())
			}
			if len(via) >= 5 {
				return errors.New("too many redirects")
			}
			return nil
		},
	}
	return &fetcher{
		url:       strings.TrimRight(cfg.GrantIssuerURL, "/") + "/v1/grant",
		tokenFile: cfg.GrantTokenFile,
		path:      filepath.Join(cfg.GrantsDir, cfg.PodUID+".jwt"),
		client:    client,
		transport: tr,
	}, nil
}

// fetch asks the controller once for the Pod's grant. It returns the token
// and its claims; it writes nothing.
func (f *fetcher) fetch(ctx context.Context) ([]byte, tokenClaims, error) {
	sa, err := core.ReadFileBounded(f.tokenFile, maxSATokenSize)
	if err != nil {
		return nil, tokenClaims{}, fmt.Errorf("service-account token %s: %w", f.tokenFile, err)
	}
	sa = bytes.TrimSpace(sa)
	if len(sa) == 0 {
		return nil, tokenClaims{}, fmt.Errorf("service-account token %s is empty", f.tokenFile)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url, nil)
	if err != nil {
		return nil, tokenClaims{}, err
	}
	req.Header.Set("Authorization", "Bearer "+string(sa))
	req.Header.Set("Accept", "application/jwt")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, tokenClaims{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenSize+1))
	if err != nil {
		return nil, tokenClaims{}, fmt.Errorf("GET %s: reading the body: %w", f.url, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, tokenClaims{}, errNotYet
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, tokenClaims{}, fmt.Errorf("GET %s: refused (%s): %s", f.url, resp.Status, firstLine(body))
	default:
		return nil, tokenClaims{}, fmt.Errorf("GET %s: %s: %s", f.url, resp.Status, firstLine(body))
	}
	if len(body) > maxTokenSize {
		return nil, tokenClaims{}, fmt.Errorf("GET %s: the grant is larger than %d bytes", f.url, maxTokenSize)
	}
	token := bytes.TrimSpace(body)
	claims, err := grant.PeekLease(token)
	if err != nil {
		return nil, tokenClaims{}, fmt.Errorf("GET %s: the answer is not a grant: %w", f.url, err)
	}
	return token, claims, nil
}

// write stores token atomically as GrantsDir/<PodUID>.jwt, mode 0600.
func (f *fetcher) write(token []byte) error {
	if err := core.WriteFileAtomic(f.path, token, 0o600); err != nil {
		return fmt.Errorf("grant file %s: %w", f.path, err)
	}
	return nil
}

// fetchUntil fetches and writes the grant, retrying with backoff until it
// lands or ctx ends; ctx bounds an attempt in flight too, so a deadline on
// it is the time left for every attempt. deadline, when not zero, is when
// ctx ends, by clk: no wait between attempts is longer than half the time
// left (nor shorter than fetchBackoffMin), so the last attempts come before
// it rather than a backoff of up to fetchBackoffMax past it. accept, when
// set, refuses a grant that landed but must not be kept (a renewal that
// renews nothing); it is retried like a failure. Every failure is logged: a
// 404 at V(1), other failures as errors. Once ctx has ended, the error is
// its cause, with the last failure before it.
func (f *fetcher) fetchUntil(ctx context.Context, clk clock.Clock, log logr.Logger, deadline time.Time, accept func(tokenClaims) error) ([]byte, tokenClaims, error) {
	backoff := fetchBackoffMin
	var last error
	for {
		token, claims, err := f.fetch(ctx)
		if err == nil && accept != nil {
			err = accept(claims)
		}
		if err == nil {
			if err = f.write(token); err == nil {
				return token, claims, nil
			}
		}
		if ctx.Err() != nil {
			return nil, tokenClaims{}, ended(ctx, last)
		}
		last = err
		wait := backoff
		if !deadline.IsZero() {
			wait = min(wait, max(deadline.Sub(clk.Now())/2, fetchBackoffMin))
		}
		if errors.Is(err, errNotYet) {
			log.V(1).Info("No grant for this Pod yet; retrying", "url", f.url, "retryIn", wait)
		} else {
			log.Error(err, "Grant fetch failed; retrying", "url", f.url, "retryIn", wait)
		}
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, tokenClaims{}, ended(ctx, last)
		case <-t.C():
		}
		backoff = min(2*backoff, fetchBackoffMax)
	}
}

// ended is fetchUntil's error once ctx has ended: its cause, and the last
// failure before it when there was one.
func ended(ctx context.Context, last error) error {
	cause := context.Cause(ctx)
	if last == nil {
		return cause
	}
	return fmt.Errorf("%w, after: %w", cause, last)
}

// tokenClaims is what the home reads of a grant token without verifying
// it (grant.PeekLease): the UID and the lease.
type tokenClaims = grant.Lease

// firstLine is the first line of an error body, bounded, for logs.
func firstLine(body []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(body))
	if sc.Scan() {
		s := strings.TrimSpace(sc.Text())
		if len(s) > 200 {
			s = s[:200] + "..."
		}
		if s != "" {
			return s
		}
	}
	return "(no body)"
}

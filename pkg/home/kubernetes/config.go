package kubernetes

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/grant"
)

const (
	// DefaultStaleTTL is how long the API server may go without answering
	// for the Pod before the home counts as unhealthy.
	DefaultStaleTTL = 30 * time.Second
	// DefaultGrantsPoll is how often the grants directory is read.
	DefaultGrantsPoll = 2 * time.Second
	// DefaultGrantFetchTimeout is how long New retries the first grant
	// fetch.
	DefaultGrantFetchTimeout = 60 * time.Second
)

const (
	// PodConditionZygoteReady is the Pod condition fiberd sets once a
	// template is warm. The Kubernetes controller lists it as a readiness
	// gate on every grant Pod, so the Pod joins its Service only then.
	PodConditionZygoteReady = "fiberd.io/zygote-ready"
	// ReasonTemplateWarm is the condition's reason while it is True. At
	// least one grant has a warm template.
	ReasonTemplateWarm = "TemplateWarm"
	// ReasonNoWarmTemplate is the condition's reason while it is False.
	// No grant has a warm template yet, or the last one went cold.
	ReasonNoWarmTemplate = "NoWarmTemplate"
)

// Name is what this home is selected by.
const Name = "kubernetes"

// Config is what cmd/fiberd hands New.
type Config struct {
	// Kube is the cluster. Required.
	Kube Kube
	// PodName and PodNamespace name this Pod. Required.
	PodName      string
	PodNamespace string
	// PodUID is this Pod's UID. Required. A Pod read with another UID is
	// a replacement, and the scope is lost.
	PodUID string
	// StaleTTL is how long the API server may go without answering for
	// the Pod before the home is unhealthy. Default DefaultStaleTTL.
	StaleTTL time.Duration
	// Poll is how often the API server is asked. It is also how long one
	// round may take. Default half of StaleTTL. It bounds every other
	// request to the API server too: a readiness patch (and its wait for
	// one in flight), and a read of the Pod in EndpointHost or Devices.
	// Validate refuses it when it is below 100 ms after defaults (a
	// StaleTTL under 200 ms leaves it so), and when it is not below
	// StaleTTL.
	Poll time.Duration
	// GrantsDir is the directory polled for *.jwt files, and the one the
	// grant fetch writes. Empty means no delivery and no grant to admit.
	// fiberd refuses to start this home so, unless a test-hooks build runs
	// under -admin-unsafe, where grants arrive inside Clone requests.
	GrantsDir string
	// GrantsPoll is how often GrantsDir is read. Default DefaultGrantsPoll.
	// Validate refuses it below 10 ms.
	GrantsPoll time.Duration
	// GrantTokenFile is the path of the Pod's bound service-account
	// token, sent to fetch the Pod's grant. Empty means no fetch, and
	// grants arrive only as files. Set, it needs GrantIssuerURL and
	// GrantsDir.
	GrantTokenFile string
	// GrantIssuerURL is the issuer, the controller. Grants are fetched
	// from it with "/v1/grant" appended. It must be https when the fetch
	// is on.
	GrantIssuerURL string
	// GrantCAFile is the PEM CA bundle the grant endpoint's certificate
	// must chain to. Empty means the system roots.
	GrantCAFile string
	// GrantFetchTimeout is how long New retries the first grant fetch.
	// Default DefaultGrantFetchTimeout. It is measured on Clock, and it ends
	// an attempt in flight as well as the wait before the next.
	GrantFetchTimeout time.Duration
	// Cache is the verifier's key cache, refreshed in the background while
	// the home runs. Nil means no issuer keys to refresh.
	Cache *grant.Cache
	// Family picks which Pod IP callers dial. Unix means fibers are
	// reachable from inside the Pod only, and no address is advertised.
	Family endpoint.Family
	// Devices is what the device driver exposed to this Pod, device paths
	// or ids, handed to every grant's engine as its device channel.
	Devices []string
	// CgroupRoot is the cgroup v2 subtree fiberd may carve. Empty means
	// the cgroup this process runs in, under /sys/fs/cgroup, delegated:
	// fiberd moves into its `fiberd` leaf and carves under its `grants`
	// child. When this process has no cgroup v2 or its cgroup cannot be
	// delegated (a cgroup v1 node, a read-only /sys/fs/cgroup), New logs
	// why once and the home runs without per-fiber cgroups: CgroupRoot()
	// is "".
	CgroupRoot string
	// Clock drives the polls and stamps the health. Default the real
	// clock.
	Clock clock.WithTicker
	// Logger receives the home's log lines. Default klog's. logr.Discard()
	// is the zero Logger too, so it means klog's as well; for silence pass
	// a Logger whose sink drops the lines.
	Logger logr.Logger
}

// The shortest Poll and GrantsPoll Validate takes. Anything shorter asks
// the API server, or reads the directory, in a busy loop; a test that needs
// speed still gets rounds every 100 ms.
const (
	minPoll       = 100 * time.Millisecond
	minGrantsPoll = 10 * time.Millisecond
)

// withDefaults returns c with every unset field that has a default filled
// in. It reads nothing but c.
func (c Config) withDefaults() Config {
	if c.StaleTTL == 0 {
		c.StaleTTL = DefaultStaleTTL
	}
	if c.Poll == 0 {
		c.Poll = c.StaleTTL / 2
	}
	if c.GrantsPoll == 0 {
		c.GrantsPoll = DefaultGrantsPoll
	}
	if c.GrantFetchTimeout == 0 {
		c.GrantFetchTimeout = DefaultGrantFetchTimeout
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// fetchOn reports whether the home fetches its own grant.
func (c Config) fetchOn() bool { return c.GrantTokenFile != "" }

// Validate reports the first thing wrong with c, after defaults.
func (c Config) Validate() error {
	pollSet := c.Poll != 0
	c = c.withDefaults()
	switch {
	case c.Kube == nil:
		return errors.New("kubernetes home: Kube is nil: connect with NewKube (or use fake.Kube in tests)")
	case c.PodName == "":
		return errors.New("kubernetes home: PodName is empty: set it from the downward API field metadata.name")
	case c.PodNamespace == "":
		return errors.New("kubernetes home: PodNamespace is empty: set it from the downward API field metadata.namespace")
	case c.PodUID == "":
		return errors.New("kubernetes home: PodUID is empty: set it from the downward API field metadata.uid")
	case c.StaleTTL < 0:
		return fmt.Errorf("kubernetes home: StaleTTL %v is negative: set a positive duration, or 0 for %v", c.StaleTTL, DefaultStaleTTL)
	case c.Poll < 0:
		return fmt.Errorf("kubernetes home: Poll %v is negative: set a positive duration, or 0 for half of StaleTTL", c.Poll)
	case c.Poll < minPoll && pollSet:
		return fmt.Errorf("kubernetes home: Poll %v is below %v: the API server would be asked in a busy loop; set Poll of at least %v, or 0 for half of StaleTTL", c.Poll, minPoll, minPoll)
	case c.Poll < minPoll:
		return fmt.Errorf("kubernetes home: Poll, half of StaleTTL %v, is %v, below %v: the API server would be asked in a busy loop and the home could hardly stay healthy; set StaleTTL of at least %v (or 0 for %v)", c.StaleTTL, c.Poll, minPoll, 2*minPoll, DefaultStaleTTL)
	case c.Poll >= c.StaleTTL:
		return fmt.Errorf("kubernetes home: Poll %v is not shorter than StaleTTL %v, so the home would go stale between polls: set Poll below StaleTTL, or 0 for half of it", c.Poll, c.StaleTTL)
	case c.GrantsPoll < minGrantsPoll:
		return fmt.Errorf("kubernetes home: GrantsPoll %v is below %v: the grants directory would be read in a busy loop; set at least %v, or 0 for %v", c.GrantsPoll, minGrantsPoll, minGrantsPoll, DefaultGrantsPoll)
	case c.GrantFetchTimeout < 0:
		return fmt.Errorf("kubernetes home: GrantFetchTimeout %v is negative: set a positive duration, or 0 for %v", c.GrantFetchTimeout, DefaultGrantFetchTimeout)
	case c.Family != endpoint.Unix && c.Family != endpoint.Inet4 && c.Family != endpoint.Inet6:
		return fmt.Errorf("kubernetes home: Family %v is unknown: use endpoint.Unix, endpoint.Inet4 or endpoint.Inet6", c.Family)
	case c.CgroupRoot != "" && !filepath.IsAbs(c.CgroupRoot):
		return fmt.Errorf("kubernetes home: CgroupRoot %q is not absolute: give the full path of a cgroup v2 directory, or leave it empty to delegate this process's own cgroup", c.CgroupRoot)
	}
	if !c.fetchOn() {
		return nil
	}
	if c.GrantsDir == "" {
		return fmt.Errorf("kubernetes home: GrantTokenFile %q is set but GrantsDir is empty: set GrantsDir to the directory the fetched grant is written to", c.GrantTokenFile)
	}
	if c.GrantIssuerURL == "" {
		return fmt.Errorf("kubernetes home: GrantTokenFile %q is set but GrantIssuerURL is empty: set it to the controller's https URL", c.GrantTokenFile)
	}
	u, err := url.Parse(c.GrantIssuerURL)
	if err != nil {
		return fmt.Errorf("kubernetes home: GrantIssuerURL %q: %v: set it to the controller's https URL", c.GrantIssuerURL, err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("kubernetes home: GrantIssuerURL %q is not an https URL: the grant fetch sends the Pod's token, so give the controller's https://host[:port] URL", c.GrantIssuerURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("kubernetes home: GrantIssuerURL %q has a query or fragment: give the controller's base URL, to which /v1/grant is appended", c.GrantIssuerURL)
	}
	return nil
}

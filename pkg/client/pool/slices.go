package pool

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// APIPort is the name of the pool Service's port that is fiberd's API.
const APIPort = "api"

// DefaultResync is how often a SliceSource recomputes its endpoints from
// its cache even when no EndpointSlice changed.
const DefaultResync = 5 * time.Minute

// SliceOptions shapes a SliceSource. The zero value is the defaults.
type SliceOptions struct {
	// Port is the name of the EndpointSlices' port that is fiberd's API.
	// Default APIPort.
	Port string
	// Resync is the informer's resync period. Default DefaultResync.
	Resync time.Duration
	// Logger receives the source's lines. Default klog.Background().
	Logger logr.Logger
}

// SliceClient lists and watches the EndpointSlices of one namespace.
// client-go's typed client is one (clientset.DiscoveryV1().EndpointSlices(
// namespace), a fake clientset's too); NewSliceClient makes one from a
// rest.Config without the whole clientset.
type SliceClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewSliceClient returns a SliceClient of namespace through rc, on a
// scheme of discovery.k8s.io/v1 alone: a binary that needs nothing else of
// the API (fiberctl) does not link every API group's client and types.
func NewSliceClient(rc *rest.Config, namespace string) (SliceClient, error) {
	s := runtime.NewScheme()
	if err := discoveryv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("endpointslice client: %w", err)
	}
	cfg := rest.CopyConfig(rc)
	cfg.APIPath = "/apis"
	cfg.GroupVersion = &discoveryv1.SchemeGroupVersion
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("endpointslice client: %w", err)
	}
	return &sliceClient{c: c, namespace: namespace, params: runtime.NewParameterCodec(s)}, nil
}

// sliceClient is NewSliceClient's SliceClient.
type sliceClient struct {
	c         *rest.RESTClient
	namespace string
	params    runtime.ParameterCodec
}

func (c *sliceClient) List(ctx context.Context, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	out := &discoveryv1.EndpointSliceList{}
	err := c.c.Get().Namespace(c.namespace).Resource("endpointslices").VersionedParams(&opts, c.params).Do(ctx).Into(out)
	return out, err
}

func (c *sliceClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	req := c.c.Get().Namespace(c.namespace).Resource("endpointslices").VersionedParams(&opts, c.params)
	if opts.TimeoutSeconds != nil {
		req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
	}
	return req.Watch(ctx)
}

// plainListWatch is a ListerWatcher that tells the reflector to list, then
// watch, rather than ask for a streamed watch list: every SliceClient
// serves that, fakes included, and a pool's slices are a short list.
type plainListWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported is the reflector's optional check.
func (plainListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// SliceSource is a Source that watches the EndpointSlices of one Service
// (label kubernetes.io/service-name) in one namespace, through an informer
// of its own: one list, then a watch, so reading it costs no API call. It
// needs list and watch on endpointslices.discovery.k8s.io in the
// namespace. Build one with NewSliceSource, Start it, and Stop it when
// done.
type SliceSource struct {
	namespace, service, port string
	log                      logr.Logger
	informer                 cache.SharedIndexInformer

	mu      sync.Mutex
	snap    Snapshot
	lastErr error // the watch's last error, for WaitSynced's message

	startOnce sync.Once
	stopOnce  sync.Once
	cancel    context.CancelFunc
	done      chan struct{}
}

// NewSliceSource returns a source of the endpoints of Service service in
// namespace, read through c (a client of that namespace's slices). It
// starts nothing: call Start.
func NewSliceSource(c SliceClient, namespace, service string, opts SliceOptions) *SliceSource {
	if opts.Port == "" {
		opts.Port = APIPort
	}
	if opts.Resync == 0 {
		opts.Resync = DefaultResync
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	s := &SliceSource{
		namespace: namespace,
		service:   service,
		port:      opts.Port,
		log:       opts.Logger.WithValues("namespace", namespace, "service", service),
		done:      make(chan struct{}),
	}
	selector := discoveryv1.LabelServiceName + "=" + service
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return c.Watch(ctx, o)
		},
	}
	s.informer = cache.NewSharedIndexInformerWithOptions(plainListWatch{lw}, &discoveryv1.EndpointSlice{},
		cache.SharedIndexInformerOptions{ResyncPeriod: opts.Resync})
	rebuild := func() { s.rebuild() }
	// Neither call fails on an informer that has not started.
	_, _ = s.informer.AddEventHandlerWithResyncPeriod(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { rebuild() },
		UpdateFunc: func(any, any) { rebuild() },
		DeleteFunc: func(any) { rebuild() },
	}, opts.Resync)
	_ = s.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	return s
}

// Start runs the watch until ctx ends or Stop is called. Only the first
// call starts it.
func (s *SliceSource) Start(ctx context.Context) {
	s.startOnce.Do(func() {
		ctx, s.cancel = context.WithCancel(ctx)
		go func() {
			defer close(s.done)
			s.informer.RunWithContext(ctx)
		}()
	})
}

// Stop ends the watch and returns once its goroutines are gone. It is
// idempotent, and a no-op on a source never started.
func (s *SliceSource) Stop() {
	s.stopOnce.Do(func() {
		started := false
		s.startOnce.Do(func() {}) // a Start after Stop starts nothing
		if s.cancel != nil {
			started = true
			s.cancel()
		}
		if started {
			<-s.done
		}
	})
}

// WaitSynced returns once the EndpointSlices were listed, or ctx's error
// with the watch's last error and what to check.
func (s *SliceSource) WaitSynced(ctx context.Context) error {
	if cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		s.rebuild()
		return nil
	}
	s.mu.Lock()
	last := s.lastErr
	s.mu.Unlock()
	msg := fmt.Sprintf("the EndpointSlices of Service %s/%s were not listed in time", s.namespace, s.service)
	if last != nil {
		return fmt.Errorf("%s: last error %v (the client needs list and watch on endpointslices.discovery.k8s.io in %s): %w", msg, last, s.namespace, ctx.Err())
	}
	return fmt.Errorf("%s: %w", msg, ctx.Err())
}

// Snapshot is the endpoints of the slices last seen.
func (s *SliceSource) Snapshot() Snapshot {
	s.mu.Lock()
	snap := s.snap
	s.mu.Unlock()
	snap.Synced = s.informer.HasSynced()
	return snap
}

// rebuild recomputes the endpoints from the informer's cache, moving the
// version on when they changed.
func (s *SliceSource) rebuild() {
	objs := s.informer.GetStore().List()
	sl := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			sl = append(sl, es)
		}
	}
	eps := EndpointsOf(sl, s.port)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snap.Version > 0 && slices.Equal(eps, s.snap.Endpoints) {
		return
	}
	s.snap = Snapshot{Version: s.snap.Version + 1, Endpoints: eps}
	s.log.V(2).Info("pool endpoints", "ready", len(eps), "version", s.snap.Version)
}

// EndpointsOf is the Endpoints the EndpointSlices list: of each IPv4 or
// IPv6 slice with a TCP port named port, each endpoint that is ready (a
// condition left unset counts as ready, as the API defines it) and not
// terminating, with an address and a Pod with a UID as its target, at its
// first address and that port. The result is sorted by Pod UID, one
// endpoint per Pod.
func EndpointsOf(sl []*discoveryv1.EndpointSlice, port string) []Endpoint {
	var out []Endpoint
	for _, es := range sl {
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		num := int32(0)
		for _, p := range es.Ports {
			if p.Name != nil && *p.Name == port && p.Port != nil && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
				num = *p.Port
				break
			}
		}
		if num <= 0 {
			continue
		}
		for _, e := range es.Endpoints {
			c := e.Conditions
			if (c.Ready != nil && !*c.Ready) || (c.Terminating != nil && *c.Terminating) {
				continue
			}
			if len(e.Addresses) == 0 || e.TargetRef == nil || e.TargetRef.Kind != "Pod" || e.TargetRef.UID == "" {
				continue
			}
			ep := Endpoint{
				PodName: e.TargetRef.Name,
				PodUID:  string(e.TargetRef.UID),
				Addr:    net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(num))),
			}
			if e.NodeName != nil {
				ep.Node = *e.NodeName
			}
			out = append(out, ep)
		}
	}
	return normalize(out)
}

// Open returns a Pool over the ready grant Pods of the pool cfg.Namespace/
// cfg.Name, read from the EndpointSlices of the pool's Service through c,
// a client of cfg.Namespace's slices (a SliceSource it starts and waits
// for, within ctx, and stops on Close). cfg.Source must be nil and
// cfg.Namespace set. With a clientset:
//
//	p, err := pool.Open(ctx, cs.DiscoveryV1().EndpointSlices(ns), pool.Config{Namespace: ns, Name: name, TLS: tc})
func Open(ctx context.Context, c SliceClient, cfg Config) (*Pool, error) {
	if cfg.Source != nil {
		return nil, fmt.Errorf("pool %s: Open reads the pool's EndpointSlices: leave Source nil, or use New with it", cfg.qualified())
	}
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("pool %s: Namespace is empty: name the FiberPool's namespace", cfg.qualified())
	}
	src := NewSliceSource(c, cfg.Namespace, cfg.Name, SliceOptions{Logger: cfg.Logger})
	cfg.Source = src
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	// The watch runs until Close, not until ctx ends: ctx bounds the wait
	// for its first list only.
	src.Start(context.WithoutCancel(ctx))
	if err := src.WaitSynced(ctx); err != nil {
		src.Stop()
		p.Close()
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	p.stopSrc = src.Stop
	return p, nil
}

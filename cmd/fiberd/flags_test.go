package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
)

var testEnv = environ{vars: map[string]string{}, hostname: "node-a"}

// standaloneArgs is a minimal valid standalone command line.
var standaloneArgs = []string{"-issuer", "https://issuer.example", "-templates", "/etc/fiberd/templates", "-listen="}

// kubeEnv has the Pod's identity in the environment, as the downward API
// puts it.
var kubeEnv = environ{vars: map[string]string{"POD_NAME": "grant-pod-1", "POD_NAMESPACE": "tenants", "POD_UID": "0b5e0cbe-1d1b-4f5c-9c1e-2f2f2f2f2f2f"}, hostname: "host"}

var kubeArgs = []string{"-home", "kubernetes", "-issuer", "https://issuer.example", "-templates", "/t", "-grants-dir", "/g", "-listen="}

func TestParseFlagsDefaults(t *testing.T) {
	o, err := parseFlags(standaloneArgs, testEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{
		home: "standalone", state: defaultState, runDir: defaultRunDir, nodeID: "node-a",
		issuer: "https://issuer.example", templates: "/etc/fiberd/templates", listenSet: true,
		jwksMaxStale: 24 * time.Hour, staleTTL: 30 * time.Second, clockSkew: time.Minute,
		thrashRate: fiberd.DefaultThrashRate, thrashBurst: fiberd.DefaultThrashBurst,
		pressureThreshold: fiberd.DefaultPressureThreshold,
		endpointFamily:    endpoint.Unix,
		isolation:         backend.IsolationFiber,
		minIsolation:      backend.IsolationNone,
		criu:              backend.DefaultCRIUPath(),
		parkMaxImages:     fiberd.DefaultParkMaxImages,
		parkMaxBytes:      fiberd.DefaultParkMaxBytes,
		parkIdleAfter:     fiberd.DefaultParkIdleAfter,
	}
	want.portRange, _ = endpoint.ParsePortRange(fiberd.DefaultPortRange)
	if !reflect.DeepEqual(o, want) {
		t.Errorf("options\n got %+v\nwant %+v", o, want)
	}
}

func TestParseFlagsModes(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   environ
		check func(t *testing.T, o options)
	}{
		{
			name: "dev", args: []string{"-dev"}, env: testEnv,
			check: func(t *testing.T, o options) {
				if !o.dev || !o.insecurePlaintext || o.issuer != devIssuer || o.listen != fiberd.DefaultListen || o.endpointFamily != endpoint.Inet4 {
					t.Errorf("%+v", o)
				}
				if o.stateSet {
					t.Error("-state counted as given")
				}
			},
		},
		{
			name: "dev with state and a loopback port", args: []string{"-dev", "-state", "/tmp/x", "-listen", "[::1]:0"}, env: testEnv,
			check: func(t *testing.T, o options) {
				if o.state != "/tmp/x" || !o.stateSet || o.runDirSet {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "kubernetes from the environment", args: kubeArgs, env: kubeEnv,
			check: func(t *testing.T, o options) {
				if o.podName != "grant-pod-1" || o.podNamespace != "tenants" || o.nodeID != "grant-pod-1" || o.endpointFamily != endpoint.Inet4 {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			// The downward API's status.podIPs: the family's first
			// address is advertised, without reading the Pod.
			name: "kubernetes pod IPs from the environment", args: kubeArgs,
			env: environ{vars: map[string]string{"POD_NAME": "p", "POD_NAMESPACE": "n", "POD_UID": "u", "POD_IPS": "fd00::7,10.0.0.7,10.0.0.8"}},
			check: func(t *testing.T, o options) {
				if o.podIP != "10.0.0.7" {
					t.Errorf("podIP %q, want the first inet4 address 10.0.0.7", o.podIP)
				}
			},
		},
		{
			name: "kubernetes pod IPs of the inet6 family", args: append(kubeArgs, "-endpoint-family", "inet6", "-pod-ips", "10.0.0.7, fd00::7"), env: kubeEnv,
			check: func(t *testing.T, o options) {
				if o.podIP != "fd00::7" {
					t.Errorf("podIP %q, want fd00::7", o.podIP)
				}
			},
		},
		{
			name: "kubernetes pod IPs without the family", args: append(kubeArgs, "-pod-ips", "fd00::7"), env: kubeEnv,
			check: func(t *testing.T, o options) {
				if o.podIP != "" {
					t.Errorf("podIP %q, want none: the home reads the Pod for an inet4 address", o.podIP)
				}
			},
		},
		{
			name: "kubernetes flags over the environment", args: append(kubeArgs, "-pod-name", "other", "-node-id", "n"), env: kubeEnv,
			check: func(t *testing.T, o options) {
				if o.podName != "other" || o.nodeID != "n" {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "kubernetes with a grant fetch",
			args: append(kubeArgs, "-grant-token-file", "/var/run/secrets/tokens/fiberd", "-grant-issuer-url", "https://ctl.example", "-grant-ca-file", "/ca.pem"),
			env:  kubeEnv,
			check: func(t *testing.T, o options) {
				if o.grantTokenFile == "" || o.grantIssuerURL != "https://ctl.example" {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "TLS listener", args: []string{"-issuer", "https://i", "-templates", "/t", "-listen", "0.0.0.0:8484", "-tls-cert", "/c", "-tls-key", "/k", "-client-ca", "/ca"}, env: testEnv,
			check: func(t *testing.T, o options) {
				if o.insecurePlaintext || o.insecureNonLoopback {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "plaintext on loopback", args: []string{"-issuer", "https://i", "-templates", "/t", "-insecure-plaintext"}, env: testEnv,
			check: func(t *testing.T, o options) {
				if !o.insecurePlaintext || o.insecureNonLoopback {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "plaintext on a named non-loopback address", args: []string{"-issuer", "https://i", "-templates", "/t", "-insecure-plaintext", "-listen", "10.0.0.5:8484"}, env: testEnv,
			check: func(t *testing.T, o options) {
				if !o.insecureNonLoopback {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "offline keys, devices, cgroups off", args: append(standaloneArgs[:4:4], "-issuer-keys", "/k.json", "-devices", "/dev/a, /dev/b", "-cgroup-root", "none", "-listen="), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.issuerKeys != "/k.json" || strings.Join(o.devices, "|") != "/dev/a|/dev/b" || !o.noCgroups || o.cgroupRoot != "" {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "loopback http issuer", args: []string{"-issuer", "http://127.0.0.1:9000", "-templates", "/t", "-listen="}, env: testEnv,
			check: func(t *testing.T, o options) {},
		},
		{
			name: "thrash and endpoints", args: append(standaloneArgs, "-thrash-rate", "50", "-thrash-burst", "10", "-endpoint-family", "inet6", "-endpoint-host", "::1", "-port-range", "30000-30010"), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.thrashRate != 50 || o.thrashBurst != 10 || o.endpointFamily != endpoint.Inet6 || o.portRange.String() != "30000-30010" {
					t.Errorf("%+v", o)
				}
			},
		},
		{
			name: "pressure threshold", args: append(standaloneArgs, "-pressure-threshold", "35.5"), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.pressureThreshold != 35.5 {
					t.Errorf("pressureThreshold %v, want 35.5", o.pressureThreshold)
				}
			},
		},
		{
			name: "isolation", args: append(standaloneArgs, "-isolation", "grant", "-min-isolation", "grant"), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.isolation != backend.IsolationGrant || o.minIsolation != backend.IsolationGrant || o.agentConfig().MinIsolation != backend.IsolationGrant {
					t.Errorf("isolation %q, min %q, want grant and grant", o.isolation, o.minIsolation)
				}
			},
		},
		{
			name: "scratch size", args: append(standaloneArgs, "-scratch-size", "64Mi"), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.scratchSize != 64<<20 {
					t.Errorf("scratch size %d, want %d", o.scratchSize, 64<<20)
				}
			},
		},
		{
			name: "isolation off", args: append(standaloneArgs, "-isolation", "none"), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.isolation != backend.IsolationNone {
					t.Errorf("isolation %q, want none", o.isolation)
				}
			},
		},
		{
			name: "kubernetes isolates fibers by default", args: kubeArgs, env: kubeEnv,
			check: func(t *testing.T, o options) {
				if o.isolation != backend.IsolationFiber || o.ids != (idRange{}) {
					t.Errorf("isolation %q, ids %v under -home kubernetes, want fiber and ids chosen at start", o.isolation, o.ids)
				}
			},
		},
		{
			name: "ids", args: append(kubeArgs, "-ids", "40000-40999"), env: kubeEnv,
			check: func(t *testing.T, o options) {
				if o.ids != (idRange{first: 40000, count: 1000}) {
					t.Errorf("ids %v, want 40000-40999", o.ids)
				}
			},
		},
		{
			name: "dev isolates fibers by default", args: []string{"-dev"}, env: testEnv,
			check: func(t *testing.T, o options) {
				if o.isolation != backend.IsolationFiber {
					t.Errorf("isolation %q under -dev, want fiber", o.isolation)
				}
			},
		},
		{
			name: "parking", args: append(standaloneArgs, "-criu", "/opt/criu/bin/criu", "-park-max-images", "4", "-park-max-bytes", "1048576", "-pressure-park", "-park-idle-after", "2m"), env: testEnv,
			check: func(t *testing.T, o options) {
				c := o.agentConfig().Park
				if o.criu != "/opt/criu/bin/criu" || c.MaxImages != 4 || c.MaxBytes != 1<<20 || !c.Pressure || c.IdleAfter != 2*time.Minute {
					t.Errorf("criu %q, park %+v", o.criu, c)
				}
			},
		},
		{
			name: "no parking", args: append(standaloneArgs, "-criu", "none"), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.criu != "" {
					t.Errorf("-criu none gave %q, want none", o.criu)
				}
			},
		},
		{
			name: "pressure shedding off", args: append(standaloneArgs, "-pressure-threshold", "0"), env: testEnv,
			check: func(t *testing.T, o options) {
				if o.pressureThreshold != 0 {
					t.Errorf("pressureThreshold %v, want 0 (off)", o.pressureThreshold)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, tt.env, io.Discard)
			if err != nil {
				t.Fatalf("parseFlags(%q) = %v", tt.args, err)
			}
			if !o.dev {
				if err := o.validate(); err != nil {
					t.Fatalf("validate(%q) = %v", tt.args, err)
				}
			}
			tt.check(t, o)
		})
	}
}

func TestParseFlagsRefusals(t *testing.T) {
	sa := func(extra ...string) []string { return append(append([]string{}, standaloneArgs...), extra...) }
	ka := func(extra ...string) []string { return append(append([]string{}, kubeArgs...), extra...) }
	type refusal struct {
		name string
		args []string
		env  environ
		flag string // the message must name it
	}
	tests := []refusal{
		{"unknown flag", sa("-bogus"), testEnv, "-bogus"},
		{"double-dash unknown", sa("--nope=1"), testEnv, "-nope"},
		{"positional argument", sa("extra"), testEnv, "extra"},
		{"bad home", sa("-home", "nomad"), testEnv, "-home"},
		{"bad isolation", sa("-isolation", "full"), testEnv, "-isolation"},
		{"relative criu", sa("-criu", "criu"), testEnv, "-criu"},
		{"zero scratch size", sa("-scratch-size", "0"), testEnv, "-scratch-size"},
		{"bad scratch size", sa("-scratch-size", "lots"), testEnv, "-scratch-size"},
		{"negative park max images", sa("-park-max-images", "-1"), testEnv, "-park-max-images"},
		{"negative park max bytes", sa("-park-max-bytes", "-1"), testEnv, "-park-max-bytes"},
		{"negative park idle after", sa("-park-idle-after", "-1s"), testEnv, "-park-idle-after"},
		{"bad min isolation", sa("-min-isolation", "all"), testEnv, "-min-isolation"},
		{"min isolation above isolation", sa("-isolation", "grant", "-min-isolation", "fiber"), testEnv, "-min-isolation"},
		{"min isolation above kubernetes' isolation", ka("-isolation", "none", "-min-isolation", "grant"), kubeEnv, "-min-isolation"},
		{"ids from root", ka("-ids", "0-100"), kubeEnv, "-ids"},
		{"ids not a range", ka("-ids", "32768"), kubeEnv, "-ids"},
		{"no issuer", []string{"-templates", "/t", "-listen="}, testEnv, "-issuer"},
		{"issuer not https", []string{"-issuer", "http://issuer.example", "-templates", "/t", "-listen="}, testEnv, "-issuer"},
		{"issuer not a URL", []string{"-issuer", "issuer", "-templates", "/t", "-listen="}, testEnv, "-issuer"},
		{"relative issuer keys", sa("-issuer-keys", "keys.json"), testEnv, "-issuer-keys"},
		{"issuer CA with offline keys", sa("-issuer-keys", "/k.json", "-issuer-ca-file", "/ca.pem"), testEnv, "-issuer-ca-file"},
		{"no templates", []string{"-issuer", "https://i", "-listen="}, testEnv, "-templates"},
		{"relative templates", []string{"-issuer", "https://i", "-templates", "t", "-listen="}, testEnv, "-templates"},
		{"relative state", sa("-state", "var/fiberd"), testEnv, "-state"},
		{"relative run dir", sa("-run-dir", "run"), testEnv, "-run-dir"},
		{"relative grants dir", sa("-grants-dir", "g"), testEnv, "-grants-dir"},
		{"relative socket", sa("-socket", "f.sock"), testEnv, "-socket"},
		{"no node id", sa(), environ{vars: map[string]string{}}, "-node-id"},
		{"bad duration", sa("-stale-ttl", "soon"), testEnv, "-stale-ttl"},
		{"negative stale ttl", sa("-stale-ttl", "-1s"), testEnv, "-stale-ttl"},
		{"negative stale ttl, kubernetes", ka("-stale-ttl", "-1s"), kubeEnv, "-stale-ttl"},
		{"negative max lease", sa("-max-lease", "-1h"), testEnv, "-max-lease"},
		{"negative clock skew", sa("-clock-skew", "-1s"), testEnv, "-clock-skew"},
		{"zero jwks max stale", sa("-jwks-max-stale", "0s"), testEnv, "-jwks-max-stale"},
		{"bad family", sa("-endpoint-family", "ipx"), testEnv, "-endpoint-family"},
		{"bad port range", sa("-port-range", "9-1"), testEnv, "-port-range"},
		{"endpoint host not an IP", sa("-endpoint-family", "inet4", "-endpoint-host", "node1"), testEnv, "-endpoint-host"},
		{"endpoint host of the other family", sa("-endpoint-family", "inet4", "-endpoint-host", "::1"), testEnv, "-endpoint-host"},
		{"endpoint host with unix", sa("-endpoint-host", "127.0.0.1"), testEnv, "-endpoint-host"},
		{"relative cgroup root", sa("-cgroup-root", "fiberd"), testEnv, "-cgroup-root"},
		{"empty device", sa("-devices", "/dev/a,,/dev/b"), testEnv, "-devices"},
		{"negative thrash rate", sa("-thrash-rate", "-1"), testEnv, "-thrash-rate"},
		{"listen port out of range", sa("-listen", "127.0.0.1:99999", "-insecure-plaintext"), testEnv, "-listen"},
		{"negative thrash burst", sa("-thrash-burst", "-1"), testEnv, "-thrash-burst"},
		{"thrash rate not a number", sa("-thrash-rate", "fast"), testEnv, "-thrash-rate"},
		{"negative pressure threshold", sa("-pressure-threshold", "-5"), testEnv, "-pressure-threshold"},
		{"pressure threshold over 100", sa("-pressure-threshold", "150"), testEnv, "-pressure-threshold"},
		{"pressure threshold NaN", sa("-pressure-threshold", "NaN"), testEnv, "-pressure-threshold"},
		{"tls cert alone", sa("-listen", "127.0.0.1:8484", "-tls-cert", "/c"), testEnv, "-tls-key"},
		{"tls without client ca", sa("-tls-cert", "/c", "-tls-key", "/k"), testEnv, "-client-ca"},
		{"tls and plaintext", sa("-listen", "127.0.0.1:1", "-tls-cert", "/c", "-tls-key", "/k", "-client-ca", "/ca", "-insecure-plaintext"), testEnv, "-insecure-plaintext"},
		{"default listen without TLS", []string{"-issuer", "https://i", "-templates", "/t"}, testEnv, "-listen"},
		{"listen not host:port", sa("-listen", "8484", "-insecure-plaintext"), testEnv, "-listen"},
		{"plaintext on the wildcard", sa("-listen", ":8484", "-insecure-plaintext"), testEnv, "-listen"},
		{"plaintext on 0.0.0.0", sa("-listen", "0.0.0.0:8484", "-insecure-plaintext"), testEnv, "-listen"},
		{"kubernetes flag on standalone", sa("-pod-name", "p"), testEnv, "-pod-name"},
		{"kubeconfig on standalone", sa("-kubeconfig", "/k"), testEnv, "-kubeconfig"},
		{"dev with kubernetes", []string{"-dev", "-home", "kubernetes"}, kubeEnv, "-dev"},
		{"dev with an issuer", []string{"-dev", "-issuer", "https://i"}, testEnv, "-issuer"},
		{"dev with a grants dir", []string{"-dev", "-grants-dir", "/g"}, testEnv, "-grants-dir"},
		{"dev with TLS", []string{"-dev", "-tls-cert", "/c"}, testEnv, "-tls-cert"},
		{"dev on a public address", []string{"-dev", "-listen", "10.1.2.3:8484"}, testEnv, "-listen"},
		{"kubernetes without pod name", ka(), environ{vars: map[string]string{"POD_NAMESPACE": "n", "POD_UID": "u"}}, "-pod-name"},
		{"kubernetes without namespace", ka(), environ{vars: map[string]string{"POD_NAME": "p", "POD_UID": "u"}}, "-pod-namespace"},
		{"kubernetes without pod uid", ka(), environ{vars: map[string]string{"POD_NAME": "p", "POD_NAMESPACE": "n"}}, "-pod-uid"},
		{"kubernetes without grants dir", []string{"-home", "kubernetes", "-issuer", "https://i", "-templates", "/t", "-listen="}, kubeEnv, "-grants-dir"},
		{"kubernetes without templates", []string{"-home", "kubernetes", "-issuer", "https://i", "-grants-dir", "/g", "-listen="}, kubeEnv, "-templates"},
		{"kubernetes without cgroups", ka("-cgroup-root", "none"), kubeEnv, "-cgroup-root"},
		{"token without issuer url", ka("-grant-token-file", "/t"), kubeEnv, "-grant-issuer-url"},
		{"grant issuer url not https", ka("-grant-token-file", "/t", "-grant-issuer-url", "http://ctl"), kubeEnv, "-grant-issuer-url"},
		{"grant issuer url without token", ka("-grant-issuer-url", "https://ctl"), kubeEnv, "-grant-token-file"},
		{"pod ips on standalone", sa("-pod-ips", "10.0.0.1"), testEnv, "-pod-ips"},
		{"pod ips not IPs", ka("-pod-ips", "10.0.0.1,grant-0"), kubeEnv, "-pod-ips"},
	}
	if !fiberd.TestHooks {
		tests = append(tests, refusal{"admin-unsafe without testhooks", sa("-admin-unsafe"), testEnv, "-admin-unsafe"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The flags' own rules, then the Configs' Validate, as run
			// applies them.
			o, err := parseFlags(tt.args, tt.env, io.Discard)
			if err == nil {
				err = o.validate()
			}
			var fe *flagError
			if !errors.As(err, &fe) {
				t.Fatalf("parseFlags(%q), validate = %v, want a *flagError", tt.args, err)
			}
			if !strings.Contains(err.Error(), tt.flag) {
				t.Errorf("error %q does not name %s", err, tt.flag)
			}

			// The command exits 2 with the message on stderr.
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tt.args, tt.env, &stdout, &stderr); code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if !strings.Contains(stderr.String(), tt.flag) {
				t.Errorf("stderr %q does not name %s", stderr.String(), tt.flag)
			}
		})
	}
}

func TestHelpExitsZero(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, testEnv, &stdout, &stderr); code != exitOK {
		t.Fatalf("-h exit %d", code)
	}
	for _, f := range []string{"-dev", "-home", "-grants-dir", "-cgroup-root", "-insecure-plaintext", "-pod-uid"} {
		if !strings.Contains(stderr.String(), f) {
			t.Errorf("usage does not list %s", f)
		}
	}
	if _, err := parseFlags([]string{"-help"}, testEnv, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-help = %v", err)
	}
}

// TestKubernetesWithoutGrantsDir: only a testhooks build under
// -admin-unsafe starts the Kubernetes home with no grants directory, so
// grants arrive inside Clone requests.
func TestKubernetesWithoutGrantsDir(t *testing.T) {
	args := []string{"-home", "kubernetes", "-issuer", "https://i", "-templates", "/t", "-listen=", "-admin-unsafe"}
	o, err := parseFlags(args, kubeEnv, io.Discard)
	if !fiberd.TestHooks {
		if err == nil || !strings.Contains(err.Error(), "-admin-unsafe") {
			t.Fatalf("without testhooks: %v, want -admin-unsafe refused", err)
		}
		return
	}
	if err != nil || !o.adminUnsafe || o.grantsDir != "" {
		t.Fatalf("testhooks build: %+v, %v", o, err)
	}
	if _, err := parseFlags(args[:len(args)-1], kubeEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "-grants-dir") {
		t.Fatalf("testhooks build without -admin-unsafe: %v, want -grants-dir refused", err)
	}
}

// TestZeroMeansTheDefault: a zero -thrash-rate, -thrash-burst or -stale-ttl
// is the Config's default, as the Configs document, not a refusal.
func TestZeroMeansTheDefault(t *testing.T) {
	args := append(append([]string{}, standaloneArgs...), "-thrash-rate", "0", "-thrash-burst", "0", "-stale-ttl", "0s")
	o, err := parseFlags(args, testEnv, io.Discard)
	if err == nil {
		err = o.validate()
	}
	if err != nil {
		t.Fatalf("zeros: %v", err)
	}
}

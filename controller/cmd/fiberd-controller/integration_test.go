//go:build integration

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/controller/issuer"
	"fiberd.io/fiberd/pkg/grant"
	shared "fiberd.io/fiberd/pkg/issuer"
	"fiberd.io/fiberd/test/kubeapi"
)

// TestMain starts no control plane itself: the first test that needs one does, and kubeapi.Main
// stops it after the last. goleak is not run under the integration tag (client-go keeps
// connection goroutines).
func TestMain(m *testing.M) { os.Exit(kubeapi.Main(m)) }

// TestControllerIssuesItsPodsGrants runs the command's manager against a real API server: the
// Reconciler creates a pool's grant Pod pointed at this controller's issuer, and once the Pod is
// bound to a node, its real bound token fetches over TLS a grant that verifies with the keys the
// issuer publishes by OIDC discovery.
func TestControllerIssuesItsPodsGrants(t *testing.T) {
	env := kubeapi.NewEnv(t)
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(env.CP.Config(), client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRD(t, ctx, c)
	env.CreateServiceAccount(t, "fiberd")

	dir := t.TempDir()
	certFile, keyFile, roots := selfSigned(t, dir)
	port := freePort(t)
	url := "https://127.0.0.1:" + strconv.Itoa(port)
	t.Setenv("KUBECONFIG", env.CP.Kubeconfig())
	o, err := parseFlags([]string{
		"-leader-elect=false", "-metrics-bind-address=0", "-health-probe-bind-address=0",
		"-issuer-url=" + url, "-issuer-bind-address=127.0.0.1:" + strconv.Itoa(port),
		"-issuer-tls-cert=" + certFile, "-issuer-tls-key=" + keyFile,
		"-issuer-keys-namespace=" + env.Namespace,
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, o, testr.New(t)) }()
	defer func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("run did not return within 30 s of its context ending")
		}
	}()

	fp := &v1alpha1.FiberPool{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: env.Namespace},
		Spec: v1alpha1.FiberPoolSpec{
			Template:  v1alpha1.TemplateSpec{Name: "counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Image: "fiberd:dev"},
			Replicas:  ptr.To[int32](1),
			FibersMax: 3,
			Lease:     &metav1.Duration{Duration: 2 * time.Minute},
		},
	}
	if err := c.Create(ctx, fp); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	poll(t, ctx, "the Reconciler creates web-0", func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: env.Namespace, Name: "web-0"}, &pod) == nil
	})
	if args := pod.Spec.Containers[0].Args; !slices.Contains(args, "-grant-issuer-url="+url) || !slices.Contains(args, "-issuer="+url) {
		t.Fatalf("web-0's fiberd is not pointed at the controller's issuer %s: %q", url, args)
	}
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: env.Namespace},
		Target: corev1.ObjectReference{Kind: "Node", Name: kubeapi.DefaultNode}}
	if err := env.Admin.CoreV1().Pods(env.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
		t.Fatal(err)
	}
	token := env.Token(t, "fiberd", kubeapi.TokenOptions{Pod: &pod, Audiences: []string{url}})

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var body []byte
	poll(t, ctx, "the issuer hands web-0 its grant", func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+shared.PathGrant, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK
	})
	cache, err := grant.NewCache(url, grant.CacheOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: url, Audience: "web-0", Keys: cache})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(ctx, body)
	if err != nil {
		t.Fatalf("the grant does not verify with the issuer's discovered keys: %v", err)
	}
	if g.UID != string(pod.UID) || g.Fibers.Max != 3 || g.Lease() != 2*time.Minute {
		t.Fatalf("grant %+v, want pod %s's, fibers.max 3, lease 2m", g, pod.UID)
	}
	var sec corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: env.Namespace, Name: issuer.DefaultSecretName}, &sec); err != nil {
		t.Fatalf("the keys Secret: %v", err)
	}
}

func poll(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := wait.PollUntilContextCancel(pctx, 100*time.Millisecond, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: not within 60 s", what)
	}
}

// installCRD applies deploy/controller's CRD and waits until FiberPools are served.
func installCRD(t *testing.T, ctx context.Context, c client.Client) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "controller", "fiberd.io_fiberpools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &crd); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("crd: %v", err)
	}
	poll(t, ctx, "FiberPools served", func() bool { return c.List(ctx, &v1alpha1.FiberPoolList{}) == nil })
}

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "issuer test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// freePort is a TCP port of 127.0.0.1 free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

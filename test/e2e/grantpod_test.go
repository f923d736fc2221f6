//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"fiberd.io/fiberd/test/kubeapi"
)

// The grant is fetched with the Pod's bound token, the template warms, the readiness gate turns
// True, fiberctl clones a fiber on the Pod IP, and the grant is renewed by half its lease.
func TestGrantPod(t *testing.T) {
	const lease = 20 * time.Second
	r := newRig(t, rigOpts{podIP: nextPodIP(), lease: lease})

	// Fetched: the grant file of the Pod's UID, issued for the Pod, with the issuer's lease.
	eventually(t, waitLong, "the grant file "+string(r.pod.UID)+".jwt", func() (bool, string) {
		tok, _, _ := r.grantFile()
		return tok != nil, "not written"
	})
	_, iat0, exp0 := r.grantFile()
	if got := exp0.Sub(iat0); got != lease {
		t.Errorf("fetched grant has lease %v, want the issuer's %v", got, lease)
	}
	r.waitWarm()

	// Readiness, read back through the API as the endpoints controller would.
	eventually(t, 30*time.Second, "condition "+readinessGate+" True with reason "+reasonWarm, func() (bool, string) {
		c := r.condition()
		if c == nil {
			return false, "no condition"
		}
		return c.Status == corev1.ConditionTrue && c.Reason == reasonWarm, fmt.Sprintf("%+v", *c)
	})

	// fiberctl clone naming the Pod UID; the fiber answers HTTP on the Pod IP.
	f := r.clone()
	t.Logf("fiber %s at %s (pid %d)", f.id, f.endpoint, f.pid)

	// Renewal: a new grant lands by half the lease of the one before.
	_, iat0, _ = r.grantFile()
	half := iat0.Add(lease / 2)
	var iat1 time.Time
	eventually(t, time.Until(half)+5*time.Second, "the grant renewed by half its lease", func() (bool, string) {
		_, iat, _ := r.grantFile()
		iat1 = iat
		return iat.After(iat0), "still issued at " + iat.String()
	})
	// iat is whole seconds; the renewal is due at iat0 + lease/2.
	if d := iat1.Sub(iat0); d > lease/2+time.Second {
		t.Errorf("renewed grant issued %v after the previous one, want at most half the lease (%v)", d, lease/2)
	}
	// The fiber is untouched by the renewal, and the agent took the new lease.
	r.check(apiResponse(f))
	// The file lane reads the renewed file within its poll (2 s).
	eventually(t, 10*time.Second, "the agent holding the renewed lease", func() (bool, string) {
		g, ok := r.podGrant()
		return ok && g.LeaseExpiry.After(exp0), fmt.Sprintf("grant %+v, want a lease past %v", g, exp0)
	})

	// The issuer minted at least twice, logged each grant, and neither process logged a token.
	if n := strings.Count(r.issuer.output(), "grant issued"); n < 2 {
		t.Errorf("the issuer logged %d grants, want at least 2", n)
	}
	grantTok, _ := os.ReadFile(r.dir + "/grant-token")
	cur, _, _ := r.grantFile()
	for _, p := range []*proc{r.issuer, r.fiberd} {
		for what, secret := range map[string]string{"the bound token": string(grantTok), "the grant": strings.TrimSpace(string(cur))} {
			if secret != "" && strings.Contains(p.output(), secret) {
				t.Errorf("%s logged %s", p.name, what)
			}
		}
	}
}

// A Pod the controller has not given a grant yet (no fiberd.io/template annotation) gets 404 from
// the issuer, and fiberd keeps asking until the annotations appear.
func TestGrantNotYet(t *testing.T) {
	r := newRig(t, rigOpts{podIP: nextPodIP(), noGrantYet: true, beforeServe: func(r *rig) {
		eventually(t, 30*time.Second, "the issuer answering 404 for the Pod", func() (bool, string) {
			_, ok := r.issuer.logHas("grant refused", "status=404", "no "+annTemplate+" annotation yet")
			return ok, "no such refusal logged"
		})
		if tok, _, _ := r.grantFile(); tok != nil {
			t.Fatal("a grant file exists before the Pod has a grant")
		}
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:"2"}}}`, annTemplate, r.tplRef, annFibersMax)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := r.env.Admin.CoreV1().Pods(r.env.Namespace).Patch(ctx, podName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}})
	r.waitWarm()
	if g, _ := r.podGrant(); g.Max != 2 {
		t.Errorf("grant fibers.max %d, want the annotation's 2", g.Max)
	}
	r.clone()
}

// Each way the Pod's scope goes away bumps the epoch: old fiber ids answer 404 and the fibers'
// processes are gone, while fiberd stays up.
func TestScopeLoss(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim string
		cause func(t *testing.T, r *rig)
	}{{
		name:  "pod deleted",
		cause: func(t *testing.T, r *rig) { r.env.DeletePod(t, podName) },
	}, {
		name: "pod replaced",
		cause: func(t *testing.T, r *rig) {
			r.env.DeletePod(t, podName)
			created := apply(t, r.env, manifest(t, "grant-pod.yaml"), placement{
				namespace: r.env.Namespace,
				edit:      func(obj runtime.Object) bool { r.editPod(obj.(*corev1.Pod)); return true },
			})
			if created[0].(*corev1.Pod).UID == r.pod.UID {
				t.Fatal("the replacement Pod has the old UID")
			}
		},
	}, {
		name:  "namespace terminating",
		cause: func(t *testing.T, r *rig) { r.env.DeleteNamespace(t) },
	}, {
		name:  "resource claim deleted",
		claim: "dev-claim",
		cause: func(t *testing.T, r *rig) { r.env.DeleteResourceClaim(t, "dev-claim") },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpts{podIP: nextPodIP(), claim: tc.claim})
			r.waitWarm()
			fibers := []fiber{r.clone(), r.clone()}
			epoch := r.status().Epoch

			tc.cause(t, r)
			eventually(t, 30*time.Second, "the epoch bumped", func() (bool, string) {
				st := r.status()
				return st.Epoch > epoch, fmt.Sprintf("epoch %d", st.Epoch)
			})
			r.assertEnded(fibers)
			if !r.fiberd.alive() {
				t.Fatalf("fiberd exited on scope loss: %v", r.fiberd.err)
			}
			if _, ok := r.fiberd.logHas("Scope lost"); !ok {
				t.Errorf("fiberd did not log the scope loss")
			}
		})
	}
}

// Stopping the API server turns the lane stale within the stale TTL and capacity misses into SHED;
// starting it again turns them back to DEFERRED_FALLBACK.
func TestAPIServerOutage(t *testing.T) {
	const staleTTL = 6 * time.Second
	cp := kubeapi.Start(t, kubeapi.Options{})
	r := newRig(t, rigOpts{cp: cp, podIP: nextPodIP(), fibersMax: 1, staleTTL: staleTTL})
	r.waitWarm()
	r.clone() // at fibers.max from here on

	if ce := r.cloneErr(); !ce.IsDeferred() || ce.Status != http.StatusServiceUnavailable {
		t.Fatalf("at fibers.max with the API server up: %v, want 503 DEFERRED_FALLBACK", ce)
	}

	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	eventually(t, staleTTL+staleTTL/2+5*time.Second, "the lane stale", func() (bool, string) {
		st := r.status()
		return !st.Lane.Healthy, fmt.Sprintf("lane %+v", st.Lane)
	})
	if d := time.Since(stopped); d > staleTTL+2*time.Second {
		t.Errorf("the lane went stale %v after the API server stopped, want within the stale TTL %v (plus a poll)", d, staleTTL)
	}
	ce := r.cloneErr()
	if !ce.IsShed() || ce.Status != http.StatusTooManyRequests || ce.RetryAfter() <= 0 {
		t.Errorf("at fibers.max with the API server down: %v (retry after %v), want 429 SHED with Retry-After", ce, ce.RetryAfter())
	}
	if ce.Body.Issuer != r.issuerURL {
		t.Errorf("the miss names issuer %q, want %q", ce.Body.Issuer, r.issuerURL)
	}

	if err := cp.Restart(cp.Options()); err != nil {
		t.Fatal(err)
	}
	eventually(t, staleTTL+15*time.Second, "the lane healthy again", func() (bool, string) {
		st := r.status()
		return st.Lane.Healthy, fmt.Sprintf("lane %+v", st.Lane)
	})
	if ce := r.cloneErr(); !ce.IsDeferred() || ce.Status != http.StatusServiceUnavailable {
		t.Errorf("at fibers.max with the API server back: %v, want 503 DEFERRED_FALLBACK", ce)
	}
	if !r.fiberd.alive() {
		t.Fatal("fiberd exited during the outage")
	}
}

// Stopping the issuer keeps fiberd serving on the current grant until its lease ends; then the
// grant lapses, and an issuer back again renews it.
func TestIssuerOutage(t *testing.T) {
	const lease = 20 * time.Second
	r := newRig(t, rigOpts{podIP: nextPodIP(), lease: lease, fibersMax: 8})
	r.waitWarm()
	r.clone()

	if err := r.issuer.stop(t); err != nil {
		t.Logf("issuer exit: %v", err)
	}
	_, iat, exp := r.grantFile()
	t.Logf("issuer stopped; current grant issued %v, lease ends %v", iat.Format(time.TimeOnly), exp.Format(time.TimeOnly))

	// Past the renewal point (half the lease), before the end: still serving.
	sleepUntil(iat.Add(lease/2 + 2*time.Second))
	r.clone()
	sleepUntil(exp.Add(-3 * time.Second))
	r.clone()
	if _, newIat, _ := r.grantFile(); !newIat.Equal(iat) {
		t.Fatalf("a grant issued %v appeared with the issuer stopped", newIat)
	}

	// The lease ended: the grant lapses (its lease's timer yields it) and capacity misses follow,
	// DEFERRED since the API server is healthy.
	eventually(t, 15*time.Second, "the lapsed grant refused", func() (bool, string) {
		resp, err := r.fiberctlClone()
		if err == nil {
			return false, "still served " + resp.FiberID
		}
		return true, ""
	})
	if ce := r.cloneErr(); !ce.IsMiss() {
		t.Errorf("after the lease ended: %v, want a capacity miss", ce)
	}
	if !r.fiberd.alive() {
		t.Fatal("fiberd exited while the issuer was down")
	}

	// The issuer returns; the home's retries land a new grant and clones are served again.
	r.startIssuer()
	eventually(t, 60*time.Second, "a new grant after the issuer returned", func() (bool, string) {
		_, newIat, _ := r.grantFile()
		return newIat.After(iat), "none yet"
	})
	eventually(t, 30*time.Second, "clones served again", func() (bool, string) {
		resp, err := r.fiberctlClone()
		if err != nil {
			return false, err.Error()
		}
		r.check(resp)
		return true, ""
	})
}

// fiberd with the Pod's service account but without RBAC for pods/status logs a clear error, stays
// up and serves; the readiness condition is never written.
func TestRBACWithoutPodStatus(t *testing.T) {
	r := newRig(t, rigOpts{podIP: nextPodIP(), dropRule: "pods/status"})
	r.waitWarm()
	var line string
	eventually(t, 30*time.Second, `fiberd logs that it cannot patch "pods/status"`, func() (bool, string) {
		l, ok := r.fiberd.logHas(`cannot patch resource \"pods/status\"`)
		if !ok {
			l, ok = r.fiberd.logHas(`cannot patch resource "pods/status"`)
		}
		line = l
		return ok, "no such line"
	})
	t.Logf("operator sees: %s", line)
	time.Sleep(3 * time.Second)
	if !r.fiberd.alive() {
		t.Fatalf("fiberd exited without pods/status: %v", r.fiberd.err)
	}
	if err := r.client.Healthz(context.Background()); err != nil {
		t.Errorf("fiberd /healthz without pods/status: %v", err)
	}
	r.clone()
	if c := r.condition(); c != nil {
		t.Errorf("the Pod shows %+v though fiberd may not patch its status", *c)
	}
}

func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

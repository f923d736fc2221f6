package backend

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// impl is one backend with one template flavour: the conformance suite
// runs against each.
type impl struct {
	name string
	tier core.Tier
	kind kind
}

var impls = []impl{
	{"proc-c", core.TierWarm, kindC},
	{"proc-python", core.TierWarm, kindPython},
	{"exec-c", core.TierBasic, kindC},
	{"exec-python", core.TierBasic, kindPython},
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestFibers clones 50 fibers, half on unix sockets and half on TCP, checks
// each answers HTTP with its own fence, pid and payload, then releases them
// and checks the exits and that no process is left.
func TestFibers(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			b := newBackend(t, im.tier)
			if b.Tier() != im.tier {
				t.Fatalf("Tier = %v, want %v", b.Tier(), im.tier)
			}
			uid := uidFor(t)
			warm(t, b, uid, im.kind.spec(t), "")
			if !b.Warmed(uid) {
				t.Fatal("Warmed = false after Warm")
			}
			ctx := ctxT(t)
			const n = 50
			eps := make([]endpoint, n+1)
			fibers := make([]Fiber, n+1)
			for i := 1; i <= n; i++ {
				eps[i] = listen(t, i%2 == 0)
				f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, uint64(i)), Listener: eps[i].file, Payload: []byte{byte(i), 0xfe}})
				if err != nil {
					t.Fatalf("Clone %d: %v", i, err)
				}
				if f.Fence != fence(uid, uint64(i)) || f.PID <= 1 {
					t.Fatalf("Clone %d = %+v", i, f)
				}
				fibers[i] = f
			}
			if _, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, 1), Listener: eps[1].file}); !errors.Is(err, core.ErrInvalid) {
				t.Fatalf("Clone of a running fence: %v, want ErrInvalid", err)
			}

			var wg sync.WaitGroup
			errs := make(chan error, 2*n)
			for i := 1; i <= n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for want := 1; want <= 2; want++ {
						body, err := get(eps[i], "/")
						if err != nil {
							errs <- err
							return
						}
						m := fields(body)
						wantF := map[string]string{
							"fence":   fence(uid, uint64(i)).String(),
							"pid":     strconv.Itoa(fibers[i].PID),
							"count":   strconv.Itoa(want),
							"payload": hex.EncodeToString([]byte{byte(i), 0xfe}),
						}
						for k, v := range wantF {
							if m[k] != v {
								errs <- fmt.Errorf("fiber %d (%s): %s = %q, want %q (body %q)", i, eps[i].network, k, m[k], v, body)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if t.Failed() {
				return
			}

			for i := 1; i <= n; i++ {
				if err := b.Kill(ctx, fibers[i].Fence); err != nil {
					t.Fatalf("Kill %d: %v", i, err)
				}
				e := nextExit(t, b)
				if e.Fence != fibers[i].Fence || e.GrantUID != uid || e.Template || !e.Reason.Killed {
					t.Fatalf("exit after Kill %d = %+v", i, e)
				}
				waitGone(t, fibers[i].PID)
			}
			if err := b.Kill(ctx, fibers[1].Fence); !errors.Is(err, core.ErrNotFound) {
				t.Fatalf("Kill of a released fiber: %v, want ErrNotFound", err)
			}
			if err := b.Stop(ctx, uid); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if b.Warmed(uid) {
				t.Fatal("Warmed = true after Stop")
			}
			if _, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, 99), Listener: eps[1].file}); !errors.Is(err, ErrCold) {
				t.Fatalf("Clone after Stop: %v, want ErrCold", err)
			}
			noStrays(t, uid)
		})
	}
}

// TestFiberEnds checks that a fiber that crashes or exits is reported with
// its signal or code, that the template keeps serving, and that Stop
// reports the remaining fibers as killed.
func TestFiberEnds(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			b := newBackend(t, im.tier)
			uid := uidFor(t)
			warm(t, b, uid, im.kind.spec(t), "")
			ctx := ctxT(t)
			clone := func(seq uint64, unix bool) (Fiber, endpoint) {
				ep := listen(t, unix)
				f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, seq), Listener: ep.file})
				if err != nil {
					t.Fatalf("Clone %d: %v", seq, err)
				}
				return f, ep
			}
			crash, crashEP := clone(1, true)
			exit7, exit7EP := clone(2, false)
			survivor, survivorEP := clone(3, true)

			if body, err := get(crashEP, "/crash"); err == nil {
				t.Fatalf("GET /crash answered %q", body)
			}
			if e := nextExit(t, b); e.Fence != crash.Fence || e.Reason.Signal != "SIGABRT" || e.Reason.Killed {
				t.Fatalf("exit of the crashing fiber = %+v, want signal SIGABRT", e)
			}
			waitGone(t, crash.PID)
			_, _ = get(exit7EP, "/exit/7")
			if e := nextExit(t, b); e.Fence != exit7.Fence || e.Reason != (ExitReason{Code: 7}) {
				t.Fatalf("exit of the exiting fiber = %+v, want exit:7", e)
			}
			if body, err := get(survivorEP, "/"); err != nil || fields(body)["fence"] != survivor.Fence.String() {
				t.Fatalf("survivor: %q, %v", body, err)
			}
			if !b.Warmed(uid) {
				t.Fatal("template went cold after a fiber crashed")
			}
			f4, ep4 := clone(4, false)
			if body, err := get(ep4, "/"); err != nil || fields(body)["fence"] != f4.Fence.String() {
				t.Fatalf("fiber cloned after the crash: %q, %v", body, err)
			}
			if err := b.Stop(ctx, uid); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			got := map[core.Fence]ExitReason{}
			for range 2 {
				e := nextExit(t, b)
				got[e.Fence] = e.Reason
			}
			for _, f := range []Fiber{survivor, f4} {
				if !got[f.Fence].Killed {
					t.Errorf("fiber %s after Stop: %+v, want killed", f.Fence, got[f.Fence])
				}
			}
			noStrays(t, uid)
		})
	}
}

// zygotePID finds the zygote of a grant: the child of this process that
// carries the grant's uid in its environment.
func zygotePID(t *testing.T, uid string) int { return zygotePIDOf(t, uid) }

func zygotePIDOf(t testing.TB, uid string) int {
	t.Helper()
	want := "FIBERD_GRANT_UID=" + uid + "\x00"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); !ok || ppid != os.Getpid() {
			continue
		}
		env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		if strings.Contains(string(env), want) {
			return pid
		}
	}
	t.Fatalf("no zygote of grant %s among this process's children", uid)
	return 0
}

// TestZygoteDies kills the zygote and checks that its fibers end with
// TemplateDied, the template goes cold and can be warmed again.
func TestZygoteDies(t *testing.T) {
	for _, k := range []kind{kindC, kindPython} {
		t.Run(k.name, func(t *testing.T) {
			b := newBackend(t, core.TierWarm)
			uid := uidFor(t)
			spec := k.spec(t)
			warm(t, b, uid, spec, "")
			ctx := ctxT(t)
			var fibers []Fiber
			for i := uint64(1); i <= 3; i++ {
				ep := listen(t, i%2 == 0)
				f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, i), Listener: ep.file})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := get(ep, "/"); err != nil {
					t.Fatal(err)
				}
				fibers = append(fibers, f)
			}
			if err := syscall.Kill(zygotePID(t, uid), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			died := map[core.Fence]bool{}
			for range fibers {
				e := nextExit(t, b)
				if e.Template || !e.Reason.TemplateDied {
					t.Fatalf("fiber exit = %+v, want TemplateDied", e)
				}
				died[e.Fence] = true
			}
			if e := nextExit(t, b); !e.Template || e.GrantUID != uid || e.Reason.Signal != "SIGKILL" {
				t.Fatalf("template exit = %+v, want Template with SIGKILL", e)
			}
			for _, f := range fibers {
				if !died[f.Fence] {
					t.Errorf("no exit for %s", f.Fence)
				}
				waitGone(t, f.PID)
			}
			if b.Warmed(uid) {
				t.Fatal("Warmed = true after the zygote died")
			}
			ep := listen(t, true)
			if _, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, 9), Listener: ep.file}); !errors.Is(err, ErrCold) {
				t.Fatalf("Clone of a cold template: %v, want ErrCold", err)
			}
			noStrays(t, uid)

			warm(t, b, uid, spec, "")
			f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, 10), Listener: ep.file})
			if err != nil {
				t.Fatalf("Clone after re-warm: %v", err)
			}
			if body, err := get(ep, "/"); err != nil || fields(body)["fence"] != f.Fence.String() {
				t.Fatalf("fiber after re-warm: %q, %v", body, err)
			}
		})
	}
}

// TestWarmRefusals covers the ways Warm fails and checks nothing is left.
func TestWarmRefusals(t *testing.T) {
	tests := []struct {
		name    string
		tier    core.Tier
		spec    func(t *testing.T) template.Spec
		timeout time.Duration
		want    error
		wantMsg string
	}{
		{name: "proc needs a zygote", tier: core.TierWarm, spec: func(t *testing.T) template.Spec {
			return template.Spec{Command: counterC(t)}
		}, want: core.ErrTierGap},
		{name: "missing command", tier: core.TierWarm, spec: func(t *testing.T) template.Spec {
			return template.Spec{Command: "no-such-command-fiberd", Zygote: true}
		}, wantMsg: "not found in PATH"},
		{name: "exec missing command", tier: core.TierBasic, spec: func(t *testing.T) template.Spec {
			return template.Spec{Command: "/nonexistent/bin/x"}
		}, wantMsg: "no such file"},
		{name: "exits before READY", tier: core.TierWarm, spec: func(t *testing.T) template.Spec {
			return template.Spec{Command: "/bin/sh", Args: []string{"-c", "echo boom >&2; exit 3"}, Zygote: true}
		}, want: ErrCold, wantMsg: "boom"},
		{name: "never READY", tier: core.TierWarm, timeout: 300 * time.Millisecond, spec: func(t *testing.T) template.Spec {
			return template.Spec{Command: "/bin/sleep", Args: []string{"60"}, Zygote: true}
		}, wantMsg: "no READY within"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			if tt.timeout != 0 {
				cfg.WarmTimeout = tt.timeout
			}
			var b Backend
			var err error
			if tt.tier == core.TierWarm {
				b, err = NewProc(cfg)
			} else {
				b, err = NewExec(cfg)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			uid := uidFor(t)
			err = b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid}, Spec: tt.spec(t), RunDir: t.TempDir()})
			if err == nil {
				t.Fatal("Warm succeeded")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("Warm: %v, want %v", err, tt.want)
			}
			if tt.wantMsg != "" && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tt.wantMsg)) {
				t.Fatalf("Warm: %v, want it to mention %q", err, tt.wantMsg)
			}
			if b.Warmed(uid) {
				t.Fatal("Warmed after a failed Warm")
			}
			noStrays(t, uid)
		})
	}
}

// TestSDKRefusesWithoutControlSocket runs both counters without fiberd:
// they must refuse to serve rather than wait on a missing socket.
func TestSDKRefusesWithoutControlSocket(t *testing.T) {
	for _, k := range []kind{kindC, kindPython} {
		for _, fd3 := range []string{"closed", "regular file", "stream socket"} {
			t.Run(k.name+"/"+fd3, func(t *testing.T) {
				spec := k.spec(t)
				cmd := exec.Command(spec.Command, spec.Args...)
				cmd.Env = spec.EnvList()
				switch fd3 {
				case "regular file":
					f, err := os.CreateTemp(t.TempDir(), "x")
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					cmd.ExtraFiles = []*os.File{f}
				case "stream socket":
					ep := listen(t, false)
					cmd.ExtraFiles = []*os.File{ep.file}
				}
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 2 {
					t.Fatalf("counter without a control socket: %v, want exit 2 (output %q)", err, out)
				}
				if !strings.Contains(string(out), "fiberd") {
					t.Fatalf("refusal does not say why: %q", out)
				}
			})
		}
	}
}

// TestCloseIdempotent checks Close twice and that Exits is closed.
func TestCloseIdempotent(t *testing.T) {
	for _, tier := range []core.Tier{core.TierWarm, core.TierBasic} {
		var b Backend
		var err error
		if tier == core.TierWarm {
			b, err = NewProc(testConfig())
		} else {
			b, err = NewExec(testConfig())
		}
		if err != nil {
			t.Fatal(err)
		}
		uid := uidFor(t) + strings.ToLower(string(tier))
		warm(t, b, uid, kindC.spec(t), "")
		ep := listen(t, true)
		if _, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file}); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("%s Close: %v", tier, err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("%s second Close: %v", tier, err)
		}
		for range b.Exits() {
		}
		if err := b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid}, Spec: kindC.spec(t), RunDir: t.TempDir()}); !errors.Is(err, ErrCold) {
			t.Fatalf("%s Warm after Close: %v, want ErrCold", tier, err)
		}
		noStrays(t, uid)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{}, ""},
		{Config{WarmTimeout: -1}, "WarmTimeout"},
		{Config{KillTimeout: -1}, "KillTimeout"},
		{Config{LogMaxBytes: -1}, "LogMaxBytes"},
		{Config{Shell: "sh"}, "Shell"},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("Validate(%+v) = %v, want mention of %q", tt.cfg, err, tt.want)
		}
	}
	d := Config{}.withDefaults()
	if d.WarmTimeout != 30*time.Second || d.KillTimeout != 10*time.Second || d.LogMaxBytes != 1<<20 || d.Shell != "/bin/sh" || d.Path != DefaultPath {
		t.Errorf("defaults = %+v", d)
	}
}

// A zygote starts with LD_BIND_NOW=1, so its fibers never run the dynamic
// linker's lazy binding; a template that sets LD_BIND_NOW itself ("" to
// bind lazily) keeps its own value, and only that one.
func TestZygoteBindsNow(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"default", nil, "LD_BIND_NOW=1"},
		{"the template binds lazily", map[string]string{"LD_BIND_NOW": ""}, "LD_BIND_NOW="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newBackend(t, core.TierWarm)
			uid := uidFor(t)
			spec := kindC.spec(t)
			spec.Env = tc.env
			warm(t, p, uid, spec, "")
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", zygotePIDOf(t, uid)))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, kv := range strings.Split(string(b), "\x00") {
				if strings.HasPrefix(kv, "LD_BIND_NOW=") {
					got = append(got, kv)
				}
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("the zygote's environment has %q, want exactly %q", got, tc.want)
			}
		})
	}
}

package backend

import (
	"strings"
	"testing"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

func TestParseMessage(t *testing.T) {
	tests := []struct {
		in   string
		want message
		ok   bool
	}{
		{"READY", message{kind: msgReady}, true},
		{"READY now", message{kind: msgReady}, true}, // a feature fiberd does not know
		{"READY spares", message{kind: msgReady, spares: true}, true},
		{"READY  spares", message{}, false},
		{"SPARED s7 4242", message{kind: msgSpared, fence: "s7", spare: true, pid: 4242}, true},
		{"SPARED g/1/2 4242", message{}, false},
		{"CLONED s7 4242", message{}, false},
		{"ERROR s7 fork: no memory", message{kind: msgError, fence: "s7", spare: true, reason: "fork: no memory"}, true},
		{"EXITED s12 exit:0", message{kind: msgExited, fence: "s12", spare: true}, true},
		{"EXITED sx exit:0", message{}, false},
		{"CLONED g/1/2 4242", message{kind: msgCloned, fence: "g/1/2", pid: 4242}, true},
		{"CLONED g/1/2 1", message{}, false},
		{"CLONED g/1/2 x", message{}, false},
		{"CLONED g/1 4242", message{}, false},
		{"ERROR g/1/2 fork: no memory", message{kind: msgError, fence: "g/1/2", reason: "fork: no memory"}, true},
		{"EXITED g/1/2 exit:7", message{kind: msgExited, fence: "g/1/2", exit: ExitReason{Code: 7}}, true},
		{"EXITED g/1/2 signal:SIGSEGV", message{kind: msgExited, fence: "g/1/2", exit: ExitReason{Signal: "SIGSEGV"}}, true},
		{"EXITED g/1/2 exit:256", message{}, false},
		{"EXITED g/1/2 signal:", message{}, false},
		{"EXITED g/1/2 crashed", message{}, false},
		{"HELLO", message{}, false},
		{"EXITED g/1/2 exit:0\n", message{}, false},
		{"", message{}, false},
	}
	for _, tt := range tests {
		got, err := parseMessage([]byte(tt.in))
		if (err == nil) != tt.ok {
			t.Errorf("parseMessage(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if tt.ok && got != tt.want {
			t.Errorf("parseMessage(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestFormatClone(t *testing.T) {
	f := core.Fence{GrantUID: "g", Epoch: 3, Seq: 9}
	if got := formatClone(f, nil); got != "CLONE g/3/9 -" {
		t.Errorf("formatClone(nil) = %q", got)
	}
	if got := formatClone(f, []byte{0xab, 0x01}); got != "CLONE g/3/9 ab01" {
		t.Errorf("formatClone = %q", got)
	}
	if n := len(formatClone(core.Fence{GrantUID: strings.Repeat("a", 63), Epoch: ^uint64(0), Seq: ^uint64(0)}, make([]byte, MaxPayload))); n > maxMessage {
		t.Errorf("largest CLONE is %d bytes, over maxMessage %d", n, maxMessage)
	}
}

func TestTakeMessages(t *testing.T) {
	f := core.Fence{GrantUID: "g", Epoch: 3, Seq: 9}
	if got := formatTake(f, []byte{0xab}); got != "TAKE g/3/9 ab" {
		t.Errorf("formatTake = %q", got)
	}
	if got := formatSpare(spareName(4)); got != "SPARE s4" {
		t.Errorf("formatSpare = %q", got)
	}
}

func TestExitReasonString(t *testing.T) {
	for r, want := range map[ExitReason]string{
		{}:                                "exit:0",
		{Code: 3}:                         "exit:3",
		{Signal: "SIGKILL"}:               "signal:SIGKILL",
		{TemplateDied: true}:              "template died",
		{Signal: "SIGKILL", Killed: true}: "killed",
	} {
		if got := r.String(); got != want {
			t.Errorf("%+v.String() = %q, want %q", r, got, want)
		}
	}
}

func TestFiberdEnvWins(t *testing.T) {
	env := fiberdEnv("/bin", WarmRequest{
		Grant:   core.Grant{UID: "g"},
		Spec:    template.Spec{Command: "/x", Env: map[string]string{"FIBERD_GRANT_UID": "evil", "LISTEN_FDS": "9", "A": "1", "PATH": "/opt"}},
		Devices: core.DeviceChannel{Devices: []string{"/dev/a", "/dev/b"}, Claims: []string{"c"}},
	})
	got := strings.Join(env, " ")
	want := "PATH=/bin A=1 PATH=/opt FIBERD_GRANT_UID=g FIBERD_DEVICES=/dev/a,/dev/b FIBERD_DEVICE_CLAIMS=c"
	if got != want {
		t.Errorf("env = %q, want %q", got, want)
	}
}

// A zygote's environment is a template's with LD_BIND_NOW=1 before the
// spec's variables, so a spec's own LD_BIND_NOW comes later and wins (exec
// keeps the last value of a repeated key); an exec template keeps lazy
// binding.
func TestZygoteEnv(t *testing.T) {
	req := WarmRequest{Grant: core.Grant{UID: "g"}, Spec: template.Spec{Command: "/x", Env: map[string]string{"A": "1"}}}
	if got, want := strings.Join(zygoteEnv("/bin", req), " "), "PATH=/bin LD_BIND_NOW=1 A=1 FIBERD_GRANT_UID=g FIBERD_DEVICES= FIBERD_DEVICE_CLAIMS="; got != want {
		t.Errorf("zygote env = %q, want %q", got, want)
	}
	req.Spec.Env["LD_BIND_NOW"] = ""
	if got, want := strings.Join(zygoteEnv("/bin", req), " "), "PATH=/bin LD_BIND_NOW=1 A=1 LD_BIND_NOW= FIBERD_GRANT_UID=g FIBERD_DEVICES= FIBERD_DEVICE_CLAIMS="; got != want {
		t.Errorf("zygote env with the spec's LD_BIND_NOW = %q, want %q", got, want)
	}
	delete(req.Spec.Env, "LD_BIND_NOW")
	if env := strings.Join(fiberdEnv("/bin", req), " "); strings.Contains(env, "LD_BIND_NOW") {
		t.Errorf("an exec template's env %q binds now", env)
	}
}

// FuzzParseMessage: a zygote's messages are the template's code talking;
// parsing must never panic, and anything accepted must name a valid fence
// or, where the protocol allows one (ERROR, EXITED, SPARED), a spare:
// CLONED names a fence, SPARED a spare, and their pids are above 1.
func FuzzParseMessage(f *testing.F) {
	for _, s := range []string{"READY", "READY spares", "CLONED g/1/2 42", "ERROR g/1/2 why", "EXITED g/1/2 exit:0", "EXITED g/1/2 signal:SIGKILL",
		"CLONED  ", "EXITED a/b/c exit:-1", "SPARED s3 42", "ERROR s0 why", "EXITED s12 exit:0", "CLONED s1 42", "SPARED g/1/2 42"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMessage(b)
		if err != nil || m.kind == msgReady {
			return
		}
		switch {
		case m.spare != isSpareName(m.fence):
			t.Fatalf("accepted %q: spare %v for %q", b, m.spare, m.fence)
		case m.spare && m.kind == msgCloned:
			t.Fatalf("accepted %q: CLONED naming a spare", b)
		case !m.spare && m.kind == msgSpared:
			t.Fatalf("accepted %q: SPARED naming no spare", b)
		case !m.spare:
			if _, err := core.ParseFence(m.fence); err != nil {
				t.Fatalf("accepted %q with bad fence %q", b, m.fence)
			}
		}
		if (m.kind == msgCloned || m.kind == msgSpared) && m.pid <= 1 {
			t.Fatalf("accepted %q with pid %d", b, m.pid)
		}
	})
}

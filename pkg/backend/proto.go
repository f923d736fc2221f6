package backend

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"fiberd.io/fiberd/pkg/core"
)

// The zygote protocol's words. Each message is one SOCK_SEQPACKET datagram
// of ASCII words separated by single spaces.
const (
	msgReady  = "READY"  // zygote -> fiberd: READY [spares]: initialised, ready to clone (and to fork spares)
	msgClone  = "CLONE"  // fiberd -> zygote: CLONE <fence> <payload-hex|->
	msgCloned = "CLONED" // zygote -> fiberd: CLONED <fence> <pid>
	msgError  = "ERROR"  // zygote -> fiberd: ERROR <fence|spare> <reason...>
	msgExited = "EXITED" // zygote -> fiberd: EXITED <fence|spare> <exit:N|signal:NAME>
	msgSpare  = "SPARE"  // fiberd -> zygote: SPARE <spare>
	msgSpared = "SPARED" // zygote -> fiberd: SPARED <spare> <pid>, with [hand-over socket] or [hand-over socket, pidfd]
	msgTake   = "TAKE"   // fiberd -> spare: TAKE <fence> <payload-hex|->, with [listener]; no answer

	// featureSpares is the word after READY of a zygote that forks
	// spares on SPARE and hands them over on TAKE.
	featureSpares = "spares"
)

// spareName is the name fiberd gives the nth spare of a zygote in SPARE,
// "s<n>". It cannot be a fence, which holds slashes.
func spareName(n uint64) string { return "s" + strconv.FormatUint(n, 10) }

// isSpareName reports whether s is a spare's name, "s" and 1 to 20 digits.
func isSpareName(s string) bool {
	if len(s) < 2 || len(s) > 21 || s[0] != 's' {
		return false
	}
	for _, c := range s[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// maxMessage is the largest message either side sends or reads: a CLONE of
// MaxPayload bytes in hex plus its words fits with room to spare.
const maxMessage = 16384

// message is one parsed zygote -> fiberd message.
type message struct {
	kind   string
	spares bool       // READY: the zygote forks spares
	fence  string     // CLONED, ERROR, EXITED, SPARED: a fence, or for a spare its name
	spare  bool       // fence is a spare's name
	pid    int        // CLONED, SPARED
	reason string     // ERROR
	exit   ExitReason // EXITED
}

// formatClone builds "CLONE <fence> <payload-hex|->".
func formatClone(f core.Fence, payload []byte) string {
	p := "-"
	if len(payload) > 0 {
		p = hex.EncodeToString(payload)
	}
	return msgClone + " " + f.String() + " " + p
}

// formatSpare builds "SPARE <spare>".
func formatSpare(name string) string { return msgSpare + " " + name }

// formatTake builds "TAKE <fence> <payload-hex|->".
func formatTake(f core.Fence, payload []byte) string {
	return msgTake + formatClone(f, payload)[len(msgClone):]
}

// parseMessage reads one message from a zygote. A zygote is the template's
// code, so its messages are untrusted: anything malformed is an error and is
// logged and dropped by the caller.
func parseMessage(b []byte) (message, error) {
	s := string(b)
	if strings.ContainsAny(s, "\x00\n") {
		return message{}, fmt.Errorf("zygote message holds NUL or newline")
	}
	kind, rest, _ := strings.Cut(s, " ")
	switch kind {
	case msgReady:
		m := message{kind: kind}
		for _, w := range strings.Fields(rest) {
			// Words fiberd does not know are features of a newer
			// protocol: ignored, so such a zygote still serves.
			if w == featureSpares {
				m.spares = true
			}
		}
		if rest != "" && rest != strings.Join(strings.Fields(rest), " ") {
			return message{}, fmt.Errorf("zygote message %q: READY's words must be separated by single spaces", trunc(s))
		}
		return m, nil
	case msgCloned, msgError, msgExited, msgSpared:
	default:
		return message{}, fmt.Errorf("zygote message %q: unknown", trunc(s))
	}
	fence, arg, ok := strings.Cut(rest, " ")
	if !ok || arg == "" {
		return message{}, fmt.Errorf("zygote message %q: want %s <fence> <argument>", trunc(s), kind)
	}
	m := message{kind: kind, fence: fence, spare: isSpareName(fence)}
	switch {
	case kind == msgSpared && !m.spare:
		return message{}, fmt.Errorf("zygote message %q: SPARED names a spare, s<n>", trunc(s))
	case kind == msgCloned && m.spare:
		return message{}, fmt.Errorf("zygote message %q: CLONED names a fence", trunc(s))
	case !m.spare:
		if _, err := core.ParseFence(fence); err != nil {
			return message{}, fmt.Errorf("zygote message %q: %v", trunc(s), err)
		}
	}
	switch kind {
	case msgCloned, msgSpared:
		pid, err := strconv.Atoi(arg)
		if err != nil || pid <= 1 {
			return message{}, fmt.Errorf("zygote message %q: pid must be a number above 1", trunc(s))
		}
		m.pid = pid
	case msgError:
		m.reason = arg
	case msgExited:
		r, err := parseStatus(arg)
		if err != nil {
			return message{}, fmt.Errorf("zygote message %q: %v", trunc(s), err)
		}
		m.exit = r
	}
	return m, nil
}

// parseStatus reads "exit:N" (0..255) or "signal:NAME".
func parseStatus(s string) (ExitReason, error) {
	if v, ok := strings.CutPrefix(s, "exit:"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 255 {
			return ExitReason{}, fmt.Errorf("exit status %q: want exit:0..255", s)
		}
		return ExitReason{Code: n}, nil
	}
	if v, ok := strings.CutPrefix(s, "signal:"); ok && v != "" && !strings.Contains(v, " ") {
		return ExitReason{Signal: v}, nil
	}
	return ExitReason{}, fmt.Errorf("exit status %q: want exit:N or signal:NAME", s)
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// zygoteEnv is fiberdEnv for a zygote, with LD_BIND_NOW=1 after PATH, so
// before the spec's env, which may set it otherwise ("" binds lazily): the
// dynamic linker then resolves every symbol once, when the zygote starts,
// instead of in every fiber at its first call of each function, where
// each resolution runs the linker's symbol lookup from cold caches and
// writes a page the fiber shares with its zygote, a copy-on-write fault
// (docs/design.md, decision 87). Fibers inherit the variable.
func zygoteEnv(path string, req WarmRequest) []string {
	return slices.Insert(fiberdEnv(path, req), 1, "LD_BIND_NOW=1")
}

// fiberdEnv is the environment a template's process starts with: PATH, the
// spec's env, then fiberd's own variables, which win over the spec's (exec
// keeps the last value of a repeated key).
func fiberdEnv(path string, req WarmRequest) []string {
	env := []string{"PATH=" + path}
	for _, kv := range req.Spec.EnvList() {
		if strings.HasPrefix(kv, "FIBERD_") || strings.HasPrefix(kv, "LISTEN_") {
			continue // fiberd's to set
		}
		env = append(env, kv)
	}
	return append(env,
		"FIBERD_GRANT_UID="+req.Grant.UID,
		"FIBERD_DEVICES="+strings.Join(req.Devices.Devices, ","),
		"FIBERD_DEVICE_CLAIMS="+strings.Join(req.Devices.Claims, ","),
	)
}

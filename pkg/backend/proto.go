package backend

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"fiberd.io/fiberd/pkg/core"
)

// The zygote protocol's words. Each message is one SOCK_SEQPACKET datagram
// of ASCII words separated by single spaces.
const (
	msgReady  = "READY"  // zygote -> fiberd: initialised, ready to clone
	msgClone  = "CLONE"  // fiberd -> zygote: CLONE <fence> <payload-hex|->
	msgCloned = "CLONED" // zygote -> fiberd: CLONED <fence> <pid>
	msgError  = "ERROR"  // zygote -> fiberd: ERROR <fence> <reason...>
	msgExited = "EXITED" // zygote -> fiberd: EXITED <fence> <exit:N|signal:NAME>
)

// maxMessage is the largest message either side sends or reads: a CLONE of
// MaxPayload bytes in hex plus its words fits with room to spare.
const maxMessage = 16384

// message is one parsed zygote -> fiberd message.
type message struct {
	kind   string
	fence  string     // CLONED, ERROR, EXITED
	pid    int        // CLONED
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
		if rest != "" {
			return message{}, fmt.Errorf("zygote message %q: READY takes no arguments", trunc(s))
		}
		return message{kind: kind}, nil
	case msgCloned, msgError, msgExited:
	default:
		return message{}, fmt.Errorf("zygote message %q: unknown", trunc(s))
	}
	fence, arg, ok := strings.Cut(rest, " ")
	if !ok || arg == "" {
		return message{}, fmt.Errorf("zygote message %q: want %s <fence> <argument>", trunc(s), kind)
	}
	if _, err := core.ParseFence(fence); err != nil {
		return message{}, fmt.Errorf("zygote message %q: %v", trunc(s), err)
	}
	m := message{kind: kind, fence: fence}
	switch kind {
	case msgCloned:
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

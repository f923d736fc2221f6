package endpoint

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"fiberd.io/fiberd/pkg/core"
)

// The URL schemes of an endpoint, and the networks Parse returns.
const (
	// SchemeUnix is the scheme of a unix socket endpoint, unix:///abs/path.
	SchemeUnix = "unix"
	// SchemeTCP is the scheme of a TCP endpoint, tcp://host:port.
	SchemeTCP = "tcp"
)

// MaxUnixPath is the longest unix socket path the kernel binds (the size
// of sun_path on Linux). Parse and ListenUnix refuse longer ones up front,
// rather than leaving it to an EINVAL from bind.
const MaxUnixPath = 108

// UnixURL is the endpoint URL of the unix socket at path, "unix://" followed
// by the path. path should be absolute: Parse refuses a relative one. The
// path is not escaped; Parse reads everything after "unix://" as the path.
func UnixURL(path string) string {
	return SchemeUnix + "://" + path
}

// TCPURL is the endpoint URL of host:port, such as tcp://10.0.0.7:20001 or
// tcp://[fd00::7]:20001 (an IPv6 host is bracketed). It does not check its
// arguments; Parse does.
func TCPURL(host string, port int) string {
	return SchemeTCP + "://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// Parse reads an endpoint URL and returns what net.Dial takes: network
// "unix" with the socket's absolute path, or network "tcp" with host:port
// (an IPv6 host bracketed). It refuses, with an error wrapping
// core.ErrInvalid that quotes the URL: another scheme, a relative, empty,
// over-long (MaxUnixPath) or NUL-holding unix path, and for tcp a missing or
// out-of-range port, an empty host, an IPv6 host without brackets, a
// bracketed host that is not IPv6, a host that is neither an IP literal nor
// a DNS name, and any user info, path, query or fragment. Schemes are
// lower case. The agent's clients, tests and pkg/client call it; the
// endpoint comes from fiberd, but a client should not trust it blindly.
func Parse(url string) (network, address string, err error) {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return "", "", invalid(url, "no scheme: want unix:///path or tcp://host:port")
	}
	switch scheme {
	case SchemeUnix:
		if err := checkUnixPath(rest); err != nil {
			return "", "", invalid(url, err.Error())
		}
		return "unix", rest, nil
	case SchemeTCP:
		address, err := parseHostPort(rest)
		if err != nil {
			return "", "", invalid(url, err.Error())
		}
		return "tcp", address, nil
	}
	return "", "", invalid(url, fmt.Sprintf("scheme %q: want unix or tcp", scheme))
}

func invalid(url, why string) error {
	return fmt.Errorf("endpoint %q: %s: %w", url, why, core.ErrInvalid)
}

// checkUnixPath refuses what cannot name a unix socket file.
func checkUnixPath(path string) error {
	switch {
	case path == "":
		return fmt.Errorf("empty unix socket path")
	case !strings.HasPrefix(path, "/"):
		return fmt.Errorf("unix socket path %q is not absolute", path)
	case strings.IndexByte(path, 0) >= 0:
		return fmt.Errorf("unix socket path holds a NUL byte")
	case len(path) > MaxUnixPath:
		return fmt.Errorf("unix socket path is %d bytes, longer than %d", len(path), MaxUnixPath)
	}
	return nil
}

// parseHostPort checks host:port and returns it in canonical form.
func parseHostPort(s string) (string, error) {
	if strings.ContainsAny(s, "/?#@") {
		return "", fmt.Errorf("tcp endpoint carries user info, a path, a query or a fragment")
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("want host:port with an IPv6 host in brackets: %v", err)
	}
	port, err := parsePort(portStr)
	if err != nil {
		return "", err
	}
	bracketed := strings.HasPrefix(s, "[")
	if err := checkHost(host, bracketed); err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// parsePort reads a decimal port 1-65535: digits only, no sign, no leading
// zero.
func parsePort(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("missing port")
	}
	if len(s) > 5 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("port %q is not a decimal 1-65535", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("port %q is not a decimal 1-65535", s)
		}
	}
	p, _ := strconv.Atoi(s)
	if p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %d is outside 1-65535", p)
	}
	return p, nil
}

// checkHost accepts an IP literal (IPv6 only in brackets, optionally with a
// zone) or a DNS name.
func checkHost(host string, bracketed bool) error {
	if host == "" {
		return fmt.Errorf("empty host")
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if bracketed != addr.Is6() {
			if bracketed {
				return fmt.Errorf("host %q is bracketed but not IPv6", host)
			}
			return fmt.Errorf("IPv6 host %q must be bracketed", host)
		}
		return nil
	}
	if bracketed {
		return fmt.Errorf("host %q is bracketed but not IPv6", host)
	}
	if !isDNSName(host) {
		return fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
	}
	return nil
}

// isDNSName reports whether s is a DNS name of letters, digits and hyphens
// in dot-separated labels of 1 to 63 characters that neither start nor end
// with a hyphen, at most 253 characters long, with an optional trailing
// dot. A name of only digits and dots is refused: it would be a malformed
// IPv4 address.
func isDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	allDigits := true
	for label := range strings.SplitSeq(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-':
				allDigits = false
			default:
				return false
			}
		}
	}
	return !allDigits
}

// IsLoopbackHost reports whether host, the host part of a host:port or of a
// URL (brackets removed), is "localhost" or a loopback IP address. An empty
// host is the wildcard, not loopback. Whoever allows plaintext only on
// loopback asks it: the agent's Config and flags for the API listener, and
// pkg/grant for an http:// issuer.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

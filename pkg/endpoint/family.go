package endpoint

import "fmt"

// Family is the kind of address fibers are reached at. The zero value is
// Unix.
type Family int

const (
	// Unix is a unix socket under the run directory. It is reachable from
	// the same host (or Pod) only, and no address is advertised.
	Unix Family = iota
	// Inet4 is a TCP port on an IPv4 address.
	Inet4
	// Inet6 is a TCP port on an IPv6 address.
	Inet6
)

// String is "unix", "inet4" or "inet6", the form ParseFamily reads.
func (f Family) String() string {
	switch f {
	case Unix:
		return "unix"
	case Inet4:
		return "inet4"
	case Inet6:
		return "inet6"
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// ParseFamily reads "unix", "inet4" or "inet6". Anything else is an error
// that lists the three.
func ParseFamily(s string) (Family, error) {
	switch s {
	case "unix":
		return Unix, nil
	case "inet4":
		return Inet4, nil
	case "inet6":
		return Inet6, nil
	}
	return 0, fmt.Errorf("unknown endpoint family %q: want unix, inet4 or inet6", s)
}

// Package endpoint owns how a fiber is reached: the address family
// (Family: unix, inet4, inet6), the endpoint URL a Clone answers with
// (unix:///abs/path.sock or tcp://host:port, IPv6 hosts bracketed), and the
// listeners fiberd binds for its fibers before it forks them.
//
// An endpoint URL is built with UnixURL or TCPURL and read back with Parse,
// which returns the network and address net.Dial takes and refuses relative
// unix paths, missing ports and malformed hosts. Callers' clients parse it
// the same way.
//
// TCP ports come from an operator's range (ParsePortRange, "20000-20999")
// through an Allocator, which never hands out a held port twice.
// Allocator.Listen picks a port, binds it and skips ports something else on
// the host already holds. ListenUnix binds a unix socket with mode 0600,
// replacing a stale socket file. The listener's descriptor is what the
// runtime passes to the fiber as fd 3.
//
// Who imports it: the runtime (pkg/backend) binds listeners, the agent
// (pkg/fiberd) builds the allocator from its flags, homes name the family
// they advertise, and pkg/client parses endpoint URLs. It imports only
// pkg/core of the project.
package endpoint

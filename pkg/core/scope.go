package core

import "fmt"

// ScopeClaim is one fact of where a home runs, such as the namespace, the
// Pod, its UID, the service account, the node or a resource claim. Homes
// report them in Scope; the agent shows them in its status.
type ScopeClaim struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Device channel kinds.
const (
	// DeviceKindNone is a channel that hands the template no devices.
	DeviceKindNone = ""
	// DeviceKindStatic is a fixed set of devices configured on the node.
	DeviceKindStatic = "static"
	// DeviceKindDRA is devices allocated through a Kubernetes DRA
	// ResourceClaim; Claims names the claims.
	DeviceKindDRA = "dra"
)

// DeviceChannel is what a home hands a grant's template as its devices. The
// runtime passes Devices to the zygote as FIBERD_DEVICES and Claims as
// FIBERD_DEVICE_CLAIMS, each comma-separated. The zero value is no channel.
type DeviceChannel struct {
	// Kind is DeviceKindNone, DeviceKindStatic or DeviceKindDRA.
	Kind string `json:"kind,omitempty"`
	// Devices are device paths or ids.
	Devices []string `json:"devices,omitempty"`
	// Claims are the names of the ResourceClaims the devices come from.
	Claims []string `json:"claims,omitempty"`
}

// Fit is the device channel a grant's template gets for the grant's
// device request req, out of channel c that the home offers. A grant that
// requests nothing (Count 0) gets c whole. Otherwise a static channel must
// hold at least Count devices, and the template gets the first Count of
// them, no more; a DRA channel is handed as it is, since its claims were
// allocated for the Pod the grant runs in (the scheduler counted them),
// but it must name a claim or hold Count devices. Class is not checked:
// a static channel's devices carry no class. It fails with an error
// wrapping ErrNoCapacity when c cannot serve req: the agent refuses to
// warm the grant (a capacity miss) and tries again later, as a home's
// devices may still come.
func (c DeviceChannel) Fit(req DeviceRequest) (DeviceChannel, error) {
	if req.Count <= 0 {
		return c, nil
	}
	if c.Kind == DeviceKindDRA && len(c.Claims) > 0 {
		return c, nil
	}
	if len(c.Devices) < req.Count {
		what := "no devices"
		if n := len(c.Devices); n > 0 {
			what = fmt.Sprintf("%d device(s)", n)
		}
		return DeviceChannel{}, fmt.Errorf("the grant requests %d device(s) of class %q, this home offers %s: %w", req.Count, req.Class, what, ErrNoCapacity)
	}
	out := c
	out.Devices = append([]string(nil), c.Devices[:req.Count]...)
	return out, nil
}

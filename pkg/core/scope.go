package core

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

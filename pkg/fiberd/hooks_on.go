//go:build testhooks

package fiberd

// TestHooks is true in a binary built with the testhooks tag: Config's
// AdminUnsafe is allowed, the admin socket has the routes POST /issuer and
// POST /scope-lost, and cmd/fiberd may start the Kubernetes home with an
// empty grants directory under -admin-unsafe.
const TestHooks = true

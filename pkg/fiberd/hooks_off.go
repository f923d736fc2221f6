//go:build !testhooks

package fiberd

// TestHooks is false in a binary built without the testhooks tag: Validate
// refuses AdminUnsafe and the admin socket's test-only routes do not exist.
// cmd/fiberd reads it to decide whether -admin-unsafe is accepted.
const TestHooks = false

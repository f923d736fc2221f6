// Package fake is an in-memory backend.Backend for fast tests of the agent
// (pkg/fiberd) and of anything else that drives a backend.
//
// A Backend keeps the same books a real backend keeps, warm grants and
// running fibers by fence, and follows the backend.Backend contract: Clone
// needs a warm grant (else backend.ErrCold), a fence runs once, Kill and
// Stop queue an Exit with Reason.Killed before they return, Exits is an
// unbounded queue closed by Close. It runs no process and starts no
// zygote.
//
// Limits, on purpose:
//   - No process is started: Fiber.PID is a made-up number, the listener's
//     descriptor is neither kept nor served (nothing answers on the
//     endpoint), Devices, Cgroup, Leaf and RunDir are recorded and not
//     touched.
//   - Warm refuses a spec that is not a zygote with core.ErrTierGap when the
//     backend's tier is WARM, as the proc backend does; nothing else of the
//     spec is checked beyond its Validate.
//   - Isolation is what SetIsolation says (IsolationNone by default); Warm
//     checks MinIsolation and "network": "none" against it and records the
//     grant's level as the real backends compute it, nothing is isolated.
//   - Fibers end only when a test says so: Exit (a fiber ends on its own)
//     and DieTemplate (a zygote dies) drive what a real process would.
//   - Checkpoints (backend.Checkpointer) are absent until EnableCheckpoint:
//     then Park writes an image directory holding one file of the size
//     given, ends the fiber with an Exit saying Parked, and Resume brings
//     an image it wrote back as a running fiber whose Request is the parked
//     fiber's (its payload, as a real image holds it); the image's grant,
//     epoch and template and the request's form are checked as the proc
//     backend checks them, nothing of a process is. Both keep the contract
//     of pkg/backend/backendtest.CheckpointerContract.
//
// Per-method error injection and blocking: Hooks run before the fake does
// its own work; a hook's non-nil error is returned as the method's error
// and nothing is changed, and a hook may block (on ctx) to hold a call in
// flight, as a test of the agent's epoch bump mid-Clone does.
package fake

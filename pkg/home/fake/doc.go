// Package fake is an in-memory home.Home for tests of the agent: grants
// arrive on a channel the test feeds (Deliver, Remove), the control plane's
// health is a core.SourceHealth on the test's clock, readiness is recorded,
// devices are a static list, and the scope is lost when the test says so
// (LoseScope). It satisfies the agent's optional ScopeLoser and
// IssuerOverrider interfaces structurally (pkg/fiberd's tests assert it;
// this package cannot, as pkg/fiberd's tests import it).
//
// What the test may set (Config): a cgroup root, a home without a lane
// (NoLane: grants arrive only inside Clone requests), and an own grant
// with its self-admission UID (SelfAdmitUID, OwnGrant, SetOwnGrant). The
// test can read back what the agent did: readiness (Ready, IsReady) and
// how many times it closed the home (Closes).
//
// What it leaves out: no endpoint host; device release is not observed;
// events are delivered in order, without the polling delay of a file lane.
//
// Who imports it: test/conformance and pkg/fiberd's tests. It imports
// pkg/home and pkg/core.
package fake

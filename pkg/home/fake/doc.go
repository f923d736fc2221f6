// Package fake is an in-memory home.Home for tests of the agent: grants
// arrive on a channel the test feeds (Deliver, Remove), the control plane's
// health is a core.SourceHealth on the test's clock, readiness is recorded,
// devices are a static list, and the scope is lost when the test says so
// (LoseScope). It satisfies the agent's optional ScopeLoser and
// IssuerOverrider interfaces structurally.
//
// What it leaves out: no cgroup root unless the test sets one (Config),
// no own grant, no endpoint host; events are delivered in order, without
// the polling delay of a file lane.
//
// Who imports it: test/conformance. It imports pkg/home and pkg/core.
package fake

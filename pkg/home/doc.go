// Package home is the seam between the agent and where it runs: the Home
// interface every home implements, the GrantEvent of a home's lane, and the
// file lane that every file-fed home shares.
//
// Homes live in sub-packages (pkg/home/standalone, pkg/home/kubernetes) and
// import this package; the agent (pkg/fiberd) imports it to drive them. A
// home never imports pkg/fiberd: the agent's optional interfaces
// (ScopeLoser, EndpointHoster, IssuerOverrider) are satisfied structurally.
package home

// Package fiberd is the agent: it wires a home, the grant verifier, the
// ledger and a backend into the daemon that serves Clone.
//
// This file set holds the optional interfaces a home may satisfy, which the
// agent discovers with type assertions: ScopeLoser, EndpointHoster and
// IssuerOverrider. Homes never import this package; they satisfy the
// interfaces structurally. cmd/fiberd imports it.
package fiberd

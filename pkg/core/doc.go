// Package core holds fiberd's domain types and the pure rules every other
// package shares: the grant and its lease, the fence that names a fiber, the
// staleness rule of a control plane (SourceHealth), the facts of a home's
// scope, the device channel a template is handed, the persistent epoch, and
// the small closed set of outcome errors the API maps to HTTP.
//
// # Lifecycles
//
// A grant is delivered (a home's lane or a Clone request carries its token),
// verified (pkg/grant checks signature, issuer, audience and claims),
// admitted (the agent keeps a ledger entry for it), warm (its template's
// zygote said READY) and finally yielded (revoked by its lane, lease lapsed,
// or the agent stops).
//
// A fiber is created (a place under fibers.max reserved and a fence minted), running (the
// runtime forked it and the ledger committed it) and then released (by the
// caller, by a yield, or by an epoch bump) or exited (it ended on its own).
//
// # Who imports it
//
// Every package of the project may import core. core imports nothing of the
// project and no client-go: it depends only on the standard library, logr and
// k8s.io/utils/clock, so its rules are testable with a fake clock.
package core

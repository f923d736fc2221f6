// Package client is the Go client of fiberd's HTTP API (docs/api.md):
// Clone, Release, Park, Status, Watch and Healthz, over the agent's unix
// socket or over TCP, plaintext on loopback or TLS 1.3 with a client
// certificate.
//
// On a plaintext TCP address fiberd does not authenticate its callers:
// Status is redacted to counts, ReleaseFiber and ParkFiber must carry the
// fiber's release key (CloneResponse.ReleaseKey) or a token of its grant,
// and a Clone of a session that already has a fiber, running (an attach)
// or parked (a resume), must carry the session's release key
// (CloneRequest.ReleaseKey, the key the Clone that created it answered) or
// a token of its grant (docs/api.md, "Callers who do not authenticate").
//
// A refusal comes back as an *Error carrying the HTTP status and the
// api.Error body the server sent. It unwraps to the outcome class of
// pkg/core, so callers match it the same way the agent produced it:
// errors.Is(err, core.ErrNotFound), or core.IsMiss(err) for a SHED or
// DEFERRED_FALLBACK miss.
//
// A Client calls one fiberd. pkg/client/pool routes Clones across the
// grant Pods of a FiberPool, one Client per Pod.
//
// Importers: cmd/fiberctl, pkg/client/pool, the process and end-to-end
// tests, benchmarks. It imports pkg/api and pkg/core, never pkg/fiberd.
package client

// Package pool routes Clones across the grant Pods of a FiberPool: it
// keeps the pool's ready Pods from the EndpointSlices of the pool's
// Service, picks a Pod with room for each Clone, retries another on a miss
// within the caller's deadline, and sends Release and Park to the Pod that
// served the fiber. It never writes to the API server, and reads it only
// through one watch per Pool, not per call.
//
// # The pool's endpoints
//
// The controller keeps, for each pool, a headless Service named like the
// pool whose selector is the pool's label and fiberd.io/serving "true", with
// one port named "api" (docs/design.md decision 106). Its EndpointSlices
// (label kubernetes.io/service-name) list the grant Pods that are Ready
// (the readiness gate fiberd.io/zygote-ready) and not draining. SliceSource
// watches them (an informer with resync) and keeps the endpoints that are
// ready (a condition left unset counts as ready, as the API defines it),
// not terminating, with an address, the "api" port and a Pod as target;
// the Pod's UID is the grant UID a Clone names there. It reads through a
// SliceClient: client-go's typed client, or NewSliceClient's, which links
// discovery.k8s.io/v1 alone. Open starts one for a Pool and stops it on
// Close. Any other Source will do: StaticSource is a fixed list.
//
// # Which Pod
//
// A Clone with a session goes to the Pod that served the session last
// (remembered for the last Config.Sessions sessions), so an attach finds
// its fiber and a resume its parked image; a session this client has not
// seen goes to the Pod ranked first by rendezvous hashing of the session
// over the listed Pods' UIDs, which every client computes alike, so the
// process that created a session and another that attaches to it pick the
// same Pod while the Pods do not change, and a Pod joining or leaving moves
// only its share of sessions. A Clone without a session goes to a Pod that
// neither missed nor failed in the last Config.Cooldown, with the fewest of
// this client's Clones under way, ties broken at random.
//
// # Misses and failures
//
// A SHED or DEFERRED_FALLBACK miss, a 429 or 5xx answer, a Pod that cannot
// be reached, or one that has not answered within Config.AttemptTimeout
// moves the Clone on to the next Pod of the order: each Pod is asked at most
// once per Clone, and the whole call ends with the caller's deadline. The
// request's deadlineMs is lowered to each attempt's bound, so a Pod that is
// merely slow gives the Clone up (and starts no fiber) when the client
// does. Any other refusal (INVALID, UNAUTHENTICATED, FORBIDDEN) would be
// the same on every Pod and is returned at once. When no Pod serves, the
// *Error lists each Pod's answer; core.IsMiss finds a miss among them.
// A session's Clone fails over too: when the Pod of its session misses or
// is gone, another Pod creates the session anew (the response's Kind is
// "create", not "attach" or "resume"), and the session's Pod is that one
// from then on.
//
// # Release and Park
//
// A fiber id is "uid/epoch/seq", and a grant Pod's grant UID is its Pod
// UID: the id names the Pod that served the fiber. Release and Park go to
// that Pod, found among the listed Pods and those that left the endpoints
// in the last Config.Forget (a draining Pod leaves them at once but keeps
// its fibers until they are released), so no map of fibers is kept.
//
// # Who imports it
//
// cmd/fiberctl (clone, release and park -pool) and callers of a pool. It
// imports pkg/client, pkg/api, pkg/core and client-go (test/layout allows
// it here), never the controller module: the EndpointSlices and the label
// names are the whole contract.
package pool

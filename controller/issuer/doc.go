// Package issuer is the controller's grant issuer: it hands each FiberPool grant Pod the grant
// its pool promises, in exchange for the Pod's bound service-account token, and signs with keys
// it rotates and publishes by OIDC discovery.
//
// # The exchange
//
// The wire protocol, the token review and the Pod checks are pkg/issuer's, shared with the
// development issuer (cmd/grant-issuer): GET <issuer URL>/v1/grant with the Pod's projected token
// (audience: the issuer URL) as a bearer token; the token is reviewed with the TokenReview API,
// must be bound to a Pod, and that Pod is read from the API server (not a cache) and must have
// the token's UID, service account and node, and no deletion under way. PoolPolicy then requires
// the Pod to be a grant Pod of a live FiberPool (label fiberd.io/pool and a controller owner
// reference to that pool, whose UID matches) and gives the terms: the Pod's fiberd.io/template
// annotation, fibers.max, fibers.warm, wBudget and lease from the pool's spec. The grant is for
// exactly that Pod: jti the Pod's UID, aud its name (fiberd's node id in a grant Pod), iss the
// issuer URL.
//
// Answers: 200 the grant; 404 while the Pod is not scheduled or has no template annotation yet
// (the home retries); 403 when the Pod may not have a grant (not a pool's, its pool gone,
// replaced or being deleted, the Pod gone, replaced or terminating, a lease over MaxLease); 401
// for a token the review does not authenticate; 503 while the keys are not loaded or the API
// server cannot be asked.
//
// # Revocation
//
// There is no revocation list: a grant is revoked by refusing its renewal. fiberd renews at half
// its lease, so once a Pod is deleted, replaced or terminating, or its pool is deleted, the
// grant it holds stays valid to the end of its lease: at most one lease (the pool's, at most
// MaxLease) after the revocation. fiberd has a faster path of its own for the Pod's end: its
// Kubernetes home polls its Pod (every 15 s by default) and, once it sees it terminating, gone or
// replaced, loses its scope and releases every running fiber at once (pkg/home/kubernetes,
// pkg/fiberd scopeLost); the grant stays admitted until its lease lapses, but serves nothing new
// in a Pod that is going away. Deleting a pool deletes its Pods (owner references), so it takes
// the same path. A refusal for any other reason (a Pod moved out of its pool, a pool replaced
// under the same name) has only the lease. A draining Pod (fiberd.io/serving "false") is not
// revoked: it serves the fibers it holds until the controller deletes it.
//
// # Keys
//
// KeyRing keeps the signing keys in one Secret in the controller's namespace
// (DefaultSecretName, data key SecretDataKey). A new key is written to the Secret, and so
// published in the JWKS, Prepublish before it signs; it signs for RotationPeriod; the key it
// replaces stays published for MaxLease + Margin after it stopped signing, so every grant it
// signed expires first. Every replica reads the Secret every Resync and serves from it; the
// replica that finds a change due writes it with the resourceVersion it read, and a replica that
// loses that race reads the winner's ring, so replicas never fight and a restart serves the
// same keys. The first key of a new ring signs at once: no fiberd knows the issuer's keys yet,
// and one that meets an unknown kid refreshes them.
//
// # Metrics
//
// fiberd_issuer_grant_requests_total{code} counts the answers to /v1/grant by HTTP status, and
// fiberd_issuer_published_keys is the number of keys in the JWKS, in controller-runtime's
// registry (the controller's -metrics-bind-address).
//
// # Who imports it
//
// cmd/fiberd-controller, which runs an Issuer as a manager Runnable on every replica. It imports
// pkg/issuer, pkg/grant and pkg/core from fiberd, the API and controller/pool (for its label and
// annotation names), and controller-runtime.
package issuer

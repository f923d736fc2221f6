// Package issuer is the HTTP side of a fiberd grant issuer: OIDC discovery,
// the JWKS, and GET /v1/grant, which hands a grant Pod its grant in exchange
// for the Pod's bound service-account token. It is shared by the development
// issuer (cmd/grant-issuer, whose Policy reads the Pod's annotations) and the
// controller's issuer (fiberd.io/fiberd/controller/issuer, whose Policy reads
// the Pod's FiberPool), so both speak the wire protocol fiberd's Kubernetes
// home fetches its grant with (pkg/home/kubernetes, fetch.go) and check the
// token the same way.
//
// # The grant exchange
//
// A request to /v1/grant carries "Authorization: Bearer <token>". The Server
//
//  1. reviews the token with the TokenReview API, asking for
//     Config.Audience (the issuer's own URL by default), and requires it to
//     be authenticated for that audience;
//  2. requires the token to be bound to a Pod: the review's
//     status.user.extra holds exactly one ExtraPodName and one ExtraPodUID,
//     and the user name is "system:serviceaccount:<namespace>:<account>";
//  3. GETs that Pod from the API server (never from a cache, so a Pod that
//     is gone, replaced or terminating is seen at once) and requires its UID
//     to be the token's, its spec.serviceAccountName to be the token's
//     account, no deletion under way, a node (spec.nodeName), and, when the
//     review names one (ExtraNodeName, Kubernetes 1.30 and later), that
//     node;
//  4. asks Config.Policy for the Pod's Terms (template, fibers, wBudget,
//     lease), and mints the grant for exactly that Pod: UID (jti) = the Pod
//     UID, audience = the Pod name (fiberd's node id under -home
//     kubernetes), issuer = Config.IssuerURL, issued now, expiring after
//     the lease, signed by Config.Keys' current signing key.
//
// A grant names its Pod by UID, which is unique in the cluster over time, and
// by name; the namespace and node it was checked against are logged with the
// grant, not carried in it (the grant format has no claim for them).
//
// # Status codes
//
//   - 200, Content-Type application/jwt: the compact grant token.
//   - 404: the Policy has no grant for this Pod yet (NotYet): the home
//     retries with backoff.
//   - 403: the token is authenticated but cannot have a grant: not bound to
//     a Pod, the Pod is gone, replaced (other UID), terminating, runs as
//     another service account or on another node than the token's; or the
//     Policy refused (Refuse). The home treats 403 as a refusal.
//   - 401: no bearer token, or the review did not authenticate it for the
//     audience.
//   - 405: a method other than GET or HEAD.
//   - 503: the API server could not be asked, the Policy could not decide
//     (Unavailable, or any error that is not a Refusal), or no signing key is
//     loaded yet; the home retries.
//   - 500: minting failed.
//
// Every answer but 200 is logged with its reason, the Pod when known and the
// caller's address; every grant is logged with its Pod, node, kid and
// expiry. The token is never logged, neither is the minted grant.
//
// # Keys
//
// Config.Keys is read on every request, so an issuer that rotates keys
// (NewKeySet for each new set) publishes its new JWKS and signs with its new
// key from the next request on. StaticKeys serves one fixed set.
//
// # Who imports it
//
// cmd/grant-issuer (through its internal/issuer) and the controller module's
// issuer. It imports k8s.io/api and apimachinery (not client-go: the caller
// hands it a Cluster), go-jose, pkg/grant and pkg/core.
package issuer

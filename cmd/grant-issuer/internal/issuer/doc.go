// Package issuer is the HTTP side of the development grant issuer
// (cmd/grant-issuer serve): OIDC discovery, the JWKS, and GET /v1/grant, which
// hands a grant Pod its grant in exchange for the Pod's bound service-account
// token.
//
// The production issuer is the controller's (fiberd.io/fiberd/controller/
// issuer), which mints each grant Pod's grant from its FiberPool and rotates
// its keys. This one exists so the Kubernetes story can be run and tested
// end to end without the controller; it keeps no state of its own and reads
// everything it mints from the Pod. Both are pkg/issuer's Server: this
// package gives it one fixed key and a Policy that reads the annotations.
//
// # The grant exchange
//
// A request to /v1/grant carries "Authorization: Bearer <token>". The server
//
//  1. reviews the token with the TokenReview API, asking for Config.Audience
//     (the issuer's own URL by default), and requires it to be authenticated
//     for that audience;
//  2. requires the token to be bound to a Pod: the review's
//     status.user.extra holds exactly one "authentication.kubernetes.io/pod-name"
//     and one "authentication.kubernetes.io/pod-uid", and the user name is
//     "system:serviceaccount:<namespace>:<account>";
//  3. GETs that Pod and requires its UID to be the token's, its
//     spec.serviceAccountName to be the token's account, no deletion under
//     way, and a node (the token's, when the review names one);
//  4. reads the grant from the Pod's annotations and mints it: UID = the Pod
//     UID, audience = the Pod name, issuer = Config.IssuerURL, lease =
//     Config.Lease, template = AnnotationTemplate, fibers.max =
//     AnnotationFibersMax.
//
// # Status codes
//
//   - 200, Content-Type application/jwt: the compact grant token.
//   - 404: the Pod is not scheduled yet, or has no AnnotationTemplate
//     annotation (key absent). That
//     annotation is the grant annotation: its absence means the controller
//     has not assigned this Pod a grant yet, so the home retries.
//   - 403: the token is authenticated but cannot have a grant: not bound to a
//     Pod, the Pod is gone, replaced (other UID), terminating, runs as
//     another service account or on another node than the token's; or the
//     grant annotations are unusable:
//     AnnotationTemplate present but empty or malformed, AnnotationFibersMax
//     absent, empty, not an integer or below 1. The home treats 403 as a
//     refusal, so a Pod whose controller wrote half a grant is told so
//     rather than left waiting.
//   - 401: no bearer token, or the review did not authenticate it for the
//     audience.
//   - 405: a method other than GET or HEAD.
//   - 503: the API server could not be asked (TokenReview or Pod read
//     failed), so the answer is unknown now; the home retries.
//   - 500: minting failed.
//
// Every answer but 200 is logged with its reason, the Pod when known and the
// caller's address. The token is never logged, neither is the minted grant.
//
// # Who imports it
//
// cmd/grant-issuer only. It imports client-go, pkg/issuer, pkg/grant and
// pkg/core.
package issuer

// Package api holds the wire types of fiberd's HTTP API (docs/api.md):
// the bodies of /v1/clone, /v1/release, /v1/park, /v1/status, /v1/watch and
// the error body every refusal carries. The server (pkg/fiberd) and the
// client (pkg/client) both import it, so neither imports the other.
//
// Decoding is strict on the server: an unknown field at any depth is a 400.
// The input rules a client can check before sending are here too
// (MaxRequestBody, MaxPayload, MaxSession, ValidSession).
// It imports only pkg/core.
package api

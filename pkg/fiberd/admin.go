package fiberd

import (
	"net/http"
)

// adminHandler is the admin socket's API, StateDir/private/admin.sock (the
// directory is 0700, the socket 0600): GET /healthz always; in a testhooks
// build also POST /issuer and POST /scope-lost (see adminTestRoutes).
func (a *Agent) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", a.handleHealthz)
	a.adminTestRoutes(mux)
	return mux
}

//go:build testhooks

package fiberd

import (
	"fmt"
	"net/http"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// issuerRequest is the body of the admin socket's POST /issuer.
type issuerRequest struct {
	Reachable *bool `json:"reachable"`
}

// adminTestRoutes adds the test-only routes of a testhooks build. Both
// answer 403 unless Config.AdminUnsafe:
//
//   - POST /issuer {"reachable":bool} forces the home's control-plane
//     liveness through IssuerOverrider.SetIssuerReachable; 501 when the
//     home has no override.
//   - POST /scope-lost bumps the epoch as a lost scope does, releasing
//     every running fiber; it answers {"epoch":N}.
func (a *Agent) adminTestRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /issuer", func(w http.ResponseWriter, r *http.Request) {
		if !a.cfg.AdminUnsafe {
			writeJSON(w, http.StatusForbidden, api.Error{Code: "FORBIDDEN", Message: "test hook refused: fiberd runs without -admin-unsafe"})
			return
		}
		var req issuerRequest
		if err := a.decode(w, r, &req); err != nil {
			a.writeError(w, err)
			return
		}
		if req.Reachable == nil {
			a.writeError(w, fmt.Errorf("body needs \"reachable\": true or false: %w", core.ErrInvalid))
			return
		}
		o, ok := a.home.(IssuerOverrider)
		if !ok {
			writeJSON(w, http.StatusNotImplemented, api.Error{Code: "NOT_IMPLEMENTED", Message: "home " + a.home.Name() + " has no issuer override"})
			return
		}
		o.SetIssuerReachable(*req.Reachable)
		a.notify()
		writeJSON(w, http.StatusOK, map[string]bool{"reachable": *req.Reachable})
	})
	mux.HandleFunc("POST /scope-lost", func(w http.ResponseWriter, r *http.Request) {
		if !a.cfg.AdminUnsafe {
			writeJSON(w, http.StatusForbidden, api.Error{Code: "FORBIDDEN", Message: "test hook refused: fiberd runs without -admin-unsafe"})
			return
		}
		n := a.bumpEpoch(r.Context(), "admin socket")
		writeJSON(w, http.StatusOK, map[string]uint64{"epoch": n})
	})
}

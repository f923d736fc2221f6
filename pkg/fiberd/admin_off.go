//go:build !testhooks

package fiberd

import "net/http"

// adminTestRoutes adds nothing without the testhooks tag: POST /issuer and
// POST /scope-lost do not exist (404).
func (a *Agent) adminTestRoutes(*http.ServeMux) {}

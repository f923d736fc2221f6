// Package fiberd is the agent: the library behind the fiberd daemon. It
// wires a home (pkg/home/...), the grant verifier (pkg/grant), the ledger
// (pkg/core) and the backends (pkg/backend) by hand, and serves Clone on an
// HTTP API.
//
// # Lifecycle
//
// A grant goes delivered -> verified -> admitted -> warm -> yielded. All of
// a grant's state lives in one slot per grant UID, and one reconcile per
// UID at a time (reconcile.go), run by a work queue, is the only code that
// admits, warms or yields it. Events only record what they learned and
// queue the UID: the home's lane delivering a token (GrantAdded) or
// removing one (GrantRemoved), a Clone carrying a token not yet admitted,
// a zygote's death, the lease's end and a revocation's end (timers on the
// injected clock). Grants reconcile in parallel, each on its own
// goroutine, so a template that never warms holds up only its own grant.
//
// A reconcile verifies a delivered token (lifting the grant's revocation),
// admits a wanted grant in the ledger (a renewal, same UID and template,
// only updates the lease), acquires the home's Devices and the grant's
// cgroup, warms its template on a backend within the lease, and calls
// PublishReady(uid, true). A warm that fails is retried with exponential
// back-off (1 s doubling to 1 min); a zygote that dies is warmed again at
// once. GrantRemoved revokes the grant at once and in the state directory
// (StateDir/private/denied.json), for Config.DenyFor at least and past the
// latest lease seen, cancels its reconcile in flight, and its reconcile
// yields it (fibers released, zygote stopped) and calls PublishReady(uid,
// false); a revoked grant stays refused across a restart until the lane
// delivers it again. A lease that ends is yielded the same way.
//
// A Clone carrying a token the slot does not hold yet offers it and waits
// for the slot's reconcile, within the Clone's deadline; when the deadline
// passes first the Clone is a capacity miss, never a fault.
//
// A fiber goes created -> running -> released | exited. Clone checks its
// caller's thrash budget, the memory pressure of the grant's cgroup (PSI "some
// avg10" of memory.pressure above Config.PressureThreshold, read at most
// once a second per grant) and that the template is warm, then takes the
// session's gate (a running session is attached, not created twice),
// reserves a place (fibers.max is never exceeded) and mints the fence,
// binds the fiber's listener, carves its leaf cgroup, forks it on the
// backend under the deadline, and commits; the commit is refused when the
// grant entry or the epoch changed meanwhile, and the new fiber is then
// released. A Clone refused before the fork mints no fence. A fiber that
// exits frees its place.
//
// The epoch lives in StateDir/private/epoch: one more on every New, and one
// more on a scope loss (a ScopeLoser home, or the admin hook), which
// releases every running fiber while grants stay admitted and warm. Fiber
// ids of an older epoch answer 404.
//
// # Start and stop
//
// New prepares, in order (docs/architecture.md, Start and stop): private state dir (0700), the sweep of what
// a crashed run left (the processes and cgroups StateDir/private/procs
// records, pkg/procrec; cgroups only under the home's cgroup root),
// verifier, cgroup tree, endpoint host (asked once of an EndpointHoster
// home), epoch bump, ledger and revocations, then the admin socket and API
// listeners are bound. Before any of it, the state, run and socket
// directories must be fiberd's alone (statedir.go: owned by its effective
// uid, below directories of root's or its own, none writable by others
// unless sticky), and the agent holds the state directory's lock
// (StateDir/private/lock) from before the sweep to the end of Run: a
// second agent on it fails with ErrStateInUse. Run starts the home, the lane,
// the grants' reconciles, the resync, the W budget's measurements and the
// backends' exit loops, then serves; when its context ends (or a server
// fails: Run then returns its error) it stops accepting, ends watch
// streams, releases every fiber, stops every zygote, closes the backends
// and the home, and returns.
//
// # Isolation
//
// The backends isolate grants and fibers (pkg/backend, Config.Isolation
// there). New logs once, in one line, what each backend gives on this host
// and what is missing; the status (api.Status.Isolation, and each grant's
// and fiber's Isolation) and the metrics (fiberd_backend_isolation,
// fiberd_grant_isolation) show it. With Config.MinIsolation a grant that
// would get less (its backend gives less here, or its template says
// "isolation": "shared") is a tier gap, refused before it is admitted or by
// the backend's Warm (isolation.go).
//
// Locks: see the Agent type. No lock is held across I/O, a process start
// or a call into the home, a backend or the verifier; the session gate and
// the park turn, gates rather than locks, are held across a fork, a resume
// or a dump of their own session, bounded by the caller's context.
//
// # API and authentication
//
// POST /v1/clone, /v1/release, /v1/park; GET /v1/status, /v1/watch
// (NDJSON), /healthz, /metrics. Bodies are capped (api.MaxRequestBody)
// before they are read and decoded strictly. Outcomes: 200 served; 429 SHED
// with Retry-After; 503 DEFERRED_FALLBACK; 412 tier gap; 400 malformed (413
// oversized, 408 a body not received in time); 401 unverified (or a
// release, park, attach or resume without proof, below); 403 a browser's
// request; 404 unknown or older-epoch fiber; 409 a park of a busy fiber;
// 415 a plaintext POST that is not JSON; 507 a park without room; 500
// runtime fault. A capacity miss (unknown, denied or lapsed grant, at
// fibers.max, template not warm) is DEFERRED_FALLBACK while the home's lane is healthy
// and SHED while stale; an unverifiable token (issuer keys never loaded or
// stale), the thrash budget and memory pressure are always SHED. Every miss
// body names its code and the issuer.
//
// Callers are authenticated by their connection: the unix socket (mode
// 0600) and a TLS 1.3 listener requiring client certificates count as
// authenticated; a plaintext TCP listener (InsecurePlaintext, loopback
// unless InsecureAllowNonLoopback) does not. Only authenticated callers may
// self-admit: a Clone naming the home's SelfAdmitUID is served with the
// home's OwnGrant in place of the token presented. On the plaintext
// listener (guard.go, docs/design.md decision 26) a request a browser would
// send is refused (a Host that is not the listener's address: 403; a
// cross-site Origin or Sec-Fetch-Site: 403, also on TLS; a POST that is not
// application/json: 415), the status and watch are redacted to counts, and
// a release or park must name the fiber's release key (every Clone answers
// it: an HMAC, under a secret drawn when the API handler is built, of the
// fiber id its session was created as, or of its own without a session)
// or a token of its grant (401 otherwise). Sessions are their creators':
// there a Clone of a session that has a fiber, running (an attach) or
// parked (a resume), must name the session's release key or carry a token
// of its grant, else it is refused (401) and the session's fiber is left
// as it was; the key stays the same across parks and resumes, so its
// creator can resume its session there. A Clone's grantUID must be a grant
// UID and its session printable and at most api.MaxSession bytes, and a
// releaseKey needs a session (400).
//
// Every listener has the timeouts of Config.Limits (headers, body, answer,
// idle keep-alive; the watch stream is exempt but for each line's write and
// sends an empty line every WatchKeepAlive) and a cap on open connections,
// past which connections wait in the kernel's accept queue (limits.go).
// Connections that have not authenticated have their own bounded share
// and never hold the places of those that have (listeners.go): the TLS
// listener does each handshake itself, within HeaderTimeout, in a pool of
// MaxHandshakes of its own (a full pool closes its oldest handshake for a
// new connection), and hands net/http only handshaken connections, at most
// MaxConns; the plaintext listener holds at most MaxConnsPerIP connections
// of one remote address, answering more 429 SHED.
//
// No caller can spend another's budget (callers.go). A caller is the
// grant of a Clone's token that verifies, else its connection's: the unix
// socket peer's uid (SO_PEERCRED, read once per connection), the TLS
// client certificate (its SHA-256), the plaintext listener's remote
// address (an IPv6 one by its /64). Each has a thrash budget of its own
// (ThrashRate, ThrashBurst), charged before the grant is looked up, so a
// Clone naming a grant that does not exist costs its caller only; the
// budgets of the 4096 callers that cloned last are remembered. Each holds
// at most Limits.MaxWatches watch streams; one more is 429 SHED.
//
// The admin socket StateDir/private/admin.sock serves GET /healthz. A build
// with the testhooks tag (TestHooks) adds POST /issuer {"reachable":bool}
// and POST /scope-lost, which answer 403 unless Config.AdminUnsafe.
//
// # Parking (the CHECKPOINT tier)
//
// When the WARM backend is a backend.Checkpointer whose CRIU works (asked
// once by New, said in the log, the status and fiberd_checkpoint_available)
// its grants serve at tier CHECKPOINT: POST /v1/park of a fiber with a
// session writes its processes to an image under StateDir/private/parked
// and ends it, freeing its place under fibers.max; the session stays parked on the
// grant's slot (status, watch, metrics). A Clone naming the session
// resumes it (kind resume): a reservation and a new fence as for a new
// fiber, the image restored into a new leaf, listening where it did (TCP,
// its port held while parked) or on a new unix socket. Images are deleted
// when the session resumes, when the parked fiber id is released, when the
// grant is yielded, when the epoch moves, and at every start. A failed
// resume is a miss; the image goes only when it is unusable. Config.Park
// bounds each grant's images and, with Pressure, lets a Clone that memory
// pressure would shed park the grant's largest idle fiber instead (park.go,
// parking.go, park_pressure.go; docs/design.md decisions 50-58).
//
// # Optional home interfaces
//
// A home may satisfy ScopeLoser, EndpointHoster and IssuerOverrider,
// declared here; homes never import this package and satisfy them
// structurally.
//
// # The W budget
//
// A grant's wBudget bounds the private memory each fiber dirties: the
// fiber's leaf's memory.max where the grant's cgroup has the memory
// controller, else the agent's measurement (budget.go). A fiber over it is
// ended; the grant's status lists its exit ("over wBudget: ..."), and
// fiberd_fiber_exits_total counts it.
//
// Who imports it: cmd/fiberd, and tests. It imports pkg/home, pkg/grant,
// pkg/backend, pkg/cgroup, pkg/procrec, pkg/endpoint, pkg/template,
// pkg/api and pkg/core.
package fiberd

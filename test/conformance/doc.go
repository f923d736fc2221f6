// Package conformance is one suite of the agent's promises, run against
// every home and backend: a new home or backend passes it before it is
// called done. Each promise runs on a fresh agent (pkg/fiberd, on the real
// clock) with a fresh home and backend:
//
//   - idempotent session attach: Clones of a running session attach to its
//     fiber, a burst of them makes one fiber;
//   - fences strictly increasing: in the agent's epoch, across refusals
//     (which mint none) and a revocation and redelivery;
//   - epoch bump ends every fiber: at a restart, and at run time (the admin
//     socket's POST /scope-lost, in a testhooks build); old ids answer 404;
//   - revocation by lease end: the grant is yielded, its fibers end, its
//     Clones miss, the home is told it is not ready;
//   - admission completeness: every delivered grant is warmed, a Clone's
//     token is admitted, a forged one is 401, a template the node lacks is
//     a miss naming it, a removed grant is refused by token;
//   - W budget: a fiber over its grant's wBudget is ended, the reason in
//     the status, its exit and the metrics;
//   - tier floor: a grant above the tier its template is served at is a
//     412, never served lower; so is a grant on a node that serves grants
//     isolated at least at a level (-min-isolation) its backend does not
//     give, never served less isolated;
//   - device budget: a template gets the devices its grant asks for, and a
//     grant asking for more than the home offers is a miss;
//   - zygote loss: its fibers end ("template died"), the grant is warmed
//     again and served (backends with zygotes);
//   - scope loss: a home's own signal bumps the epoch, ending every fiber,
//     grants stay warm (homes with a scope);
//   - a Clone of a parked session resumes it: POST /v1/park ends the fiber
//     and keeps its session; a Clone of it is a resume under a newer fence
//     with the session's release key, the fiber's memory as it was;
//   - sessions are their creators', parked too: on the plaintext listener
//     a park and a Clone of a parked session need the session's key or a
//     token of its grant (401 otherwise, nothing minted, still parked);
//   - an image lives as long as its session can come back: it survives its
//     zygote's death, and is deleted by the resume, the release of the
//     parked fiber id, the grant's revocation and an epoch bump (a restart,
//     and POST /scope-lost in a testhooks build).
//
// The park promises run on each backend's Parking variant, with a working
// CHECKPOINT tier: the fake with EnableCheckpoint and proc with CRIU
// (FIBERD_CRIU, else where `make criu` puts it; they skip without CRIU or
// root, saying so, unless FIBERD_CRIU_REQUIRED=1), and skip on backends
// that cannot park (exec, isolated grants).
//
// The homes: the fake home (pkg/home/fake), the standalone home (its file
// lane, without cgroups) and, in the integration build, the Kubernetes home
// of a grant Pod on a real kube-apiserver (test/kubeapi), carving a cgroup
// v2 subtree. The backends: the fake (pkg/backend/fake), proc (WARM) and
// exec (BASIC) running the C counter of examples/templates, and, with the
// fake home, proc with grants of fibers.warm 2 (Clones take spare fibers;
// each grant's spares are waited for once it is warm) and proc and exec
// isolating every fiber (fiberd's default on a
// standalone host; they skip where the host does not isolate, unless
// FIBERD_ISOLATION_REQUIRED=1). Run it with
// `make conformance` (every home and backend, testhooks and integration
// builds); `go test ./test/conformance` runs it without the Kubernetes home
// and without the run-time epoch bump.
//
// Nothing imports it; it imports the agent, the homes, the backends and
// their fakes, pkg/client, and test/kubeapi in the integration build.
package conformance

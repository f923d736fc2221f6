// Command bench measures fiberd against the alternatives, side by side on
// one machine, in one run, and writes what it measured as a JSON result
// file, a Markdown table and PNG plots.
//
// Usage (from the checkout):
//
//	go run ./bench -out docs/bench -doc docs/benchmarks.md    # the full run
//	go run ./bench -quick -out /tmp/bench                     # a smoke run, about a minute
//	go run ./bench -skip-kube ...                             # without kube-apiserver and etcd
//	go run ./bench -only-node -out /tmp/bench-node            # the real-node comparison alone
//
// First, before fiberd starts, the host floor: what this machine charges
// any design of fibers, measured by bench/testdata/hostfloor.c (built with
// cc): processes forked, exited and reaped per second (one loop, and one per
// CPU at once), a copy-on-write fault, the round trip to a process blocked
// in read (back to back and after 200 ms idle), and a walk through 256 KiB
// of memory (back to back and after 200 ms idle). Every Clone makes one
// process, so the fork rate is a ceiling on any closed loop; the idle
// samples say how cold a spare woken on an idle machine finds the caches.
//
// What it measures, through the real agent (pkg/fiberd in this process,
// with the standalone home, called over its unix socket with pkg/client):
//
//   - clone to first HTTP byte: Clone, dial the fiber's endpoint, send GET,
//     read one byte; for warm C, warm Python (zygote templates, tier WARM)
//     and exec C (cold start, tier BASIC); "a Pod per worker (API server
//     only)" on a real kube-apiserver as the cluster would start it without a
//     kubelet: create the Pod, write its status (phase Running, podIP) as the
//     kubelet would, and GET it until Running with an IP is seen; and "a Pod
//     per worker (real node)" on a node of test/kubenode (kubelet,
//     containerd, runc, CNI bridge, kube-scheduler, on a control plane of its
//     own, last): create a Pod of the C template (image
//     fiberd.local/counter-pod:dev from hack/images.sh), time until its Pod
//     IP answers the first HTTP byte. p50, p90, p99 and each one's ratio to
//     warm C's. The real-node row needs root and `make node-tools`; without
//     them, or with -skip-node, it says "not measured" and why;
//   - a burst of 50 concurrent clones, and a closed loop at 1, 2, 4 and 16
//     callers (clone, first byte, release) in clones per second;
//   - spare fibers (a grant's fibers.warm): the warm C and Python
//     templates again, on a second agent whose grants keep 8 spares (clone
//     to first byte, closed loop) or 50 (burst), each phase and burst round
//     started once every spare is ready, each row noting how many of its
//     Clones a spare served; the W=8 rows again on an agent with
//     -isolation fiber, each sample paired with one of the agent without
//     isolation (what isolation adds when a spare serves the Clone); and
//     the memory the waiting spares hold (their summed Private_Dirty, from
//     the agent's status);
//   - density: the summed Pss of /proc/<pid>/smaps_rollup of N fibers and
//     their zygote against N independent processes (cold exec) of the same
//     template;
//   - API server load: apiserver_request_total read from the API server's
//     /metrics before and after N clones through an agent whose home is the
//     Kubernetes home of a grant Pod on that API server, and over an idle
//     window, which gives the home's requests per poll period;
//   - the Kubernetes home's timings: the grant fetch at start (from a small
//     https issuer run in this process, serving /v1/grant after a
//     TokenReview), the readiness patch after warm, and scope loss detection
//     (the Pod deleted until OnScopeLost fires).
//
// Progress goes to stderr: a line per phase and a counter. The templates
// are the checkout's examples (examples/templates), built and specified as
// fiberd -dev does (internal/devkit). kube-apiserver and etcd come from
// ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin (hack/kube-tools.sh)
// and are run by hack/kube-up.sh; when they are missing bench stops unless
// -skip-kube is given, which marks those rows "not measured".
//
// The program reads the wall clock: timing is what it is for. Its pure
// parts (percentiles, tables, the smaps, metrics and host floor parsers)
// are tested by go test ./bench, which also builds and runs the host floor
// probe briefly.
package main

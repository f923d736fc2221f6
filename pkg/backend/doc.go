// Package backend runs fibers: it warms a grant's template and clones fibers
// of it, each a real process serving on a listener fiberd bound beforehand.
//
// # Vocabulary and lifecycle
//
// A grant's template is warm once Warm succeeded: for the proc backend, its
// zygote (the template started once, initialised, waiting) said READY; for
// the exec backend, its command was found. A warm grant goes cold when Stop
// ends it or, for proc, when its zygote dies.
//
// A fiber is created by Clone and is then running; it ends released (Kill or
// Stop) or exited (on its own, or with its zygote). Every ending produces
// exactly one Exit on Exits, queued after the fiber's processes are gone and
// its leaf cgroup is removed. A zygote that dies without Stop also produces
// one Exit with Template set, after its fibers' Exits.
//
// # The two backends
//
// Proc (tier WARM) starts one zygote per grant: stdin /dev/null, stdout and
// stderr into RunDir/zygote.log (capped at Config.LogMaxBytes), environment
// PATH, the spec's env, FIBERD_GRANT_UID, FIBERD_DEVICES and
// FIBERD_DEVICE_CLAIMS, a new session, and with a Cgroup it is born in
// <Cgroup>/zygote (CLONE_INTO_CGROUP). Its control socket, a unix
// SOCK_SEQPACKET socket, is descriptor 3. The protocol, one datagram per
// message:
//
//	zygote -> fiberd  READY [spares]
//	fiberd -> zygote  CLONE <fence> <payload-hex|->   + SCM_RIGHTS [listener, leaf?]
//	zygote -> fiberd  CLONED <fence> <pid> [+ SCM_RIGHTS [pidfd]]  |  ERROR <fence> <reason>
//	zygote -> fiberd  EXITED <fence> exit:<N>|signal:<SIGNAME>
//	fiberd -> zygote  SPARE <spare>
//	zygote -> fiberd  SPARED <spare> <pid> + SCM_RIGHTS [hand-over socket, pidfd?]  |  ERROR <spare> <reason>
//	zygote -> fiberd  EXITED <spare> exit:<N>|signal:<SIGNAME>
//	fiberd -> spare   TAKE <fence> <payload-hex|->    + SCM_RIGHTS [listener], on the hand-over socket
//
// Spares (a grant's fibers.warm, see Sparer and spare_linux.go) are fibers
// forked ahead by a zygote that said "READY spares", set up but for their
// identity and waiting on a socket of their own; a Clone that finds one
// puts it in the leaf and sends it TAKE instead of CLONE.
//
// The leaf is an O_PATH descriptor of the fiber's cgroup.procs: it carries
// none of fiberd's rights, and the child opens /proc/self/fd/<leaf> for
// writing with its own credentials (the kernel checks the opener). For an
// isolated grant fiberd gives the grant's user the cgroup.procs of the
// grant's cgroup and of each leaf, so it may move its own child from the
// zygote's leaf to the fiber's, and nothing from outside the grant. CLONED's pid is in the
// zygote's PID namespace; a pidfd of the fiber attached to it lets fiberd
// find the process in its own (without one, fiberd looks the pid up among
// the zygote's children, by NSpid).
//
// The zygote forks; the child starts a new session, enters the leaf (writes
// "0" to cgroup.procs opened through the leaf descriptor), gets the listener as
// descriptor 3 with LISTEN_FDS=1, LISTEN_PID=<its pid>, FIBERD_FENCE and
// FIBERD_PAYLOAD, and only then runs user code; the zygote answers CLONED
// once that set-up succeeded. sdk/zygote/c and sdk/zygote/python implement
// this side. A zygote that closes the socket or dies makes the grant cold:
// pending Clones fail with ErrCold and every fiber is killed (reason
// TemplateDied). When fiberd closes the socket, the SDKs kill their fibers
// and exit.
//
// Exec (tier BASIC) fork+execs the template per Clone: same environment
// plus LISTEN_FDS=1, FIBERD_FENCE, FIBERD_PAYLOAD, the listener as
// descriptor 3, a new session, born in the leaf (CLONE_INTO_CGROUP, so it is
// there before its first instruction), output to RunDir/fibers.log. Since
// the environment is fixed before the fork, LISTEN_PID is set by a one-line
// shim, Config.Shell -c 'LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"',
// which keeps its pid across the exec; so any socket-activated server works
// unchanged.
//
// # Isolation
//
// With Config.Isolation above IsolationNone, and the privilege (root, or
// CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID, with user namespaces), a
// backend isolates grants; Backend.Isolation says how far it can, found
// by a probe at creation, and one log line at V(1) says what is missing
// when it is less than asked (the agent says it once at start, at Info).
// A grant's zygote (or each exec fiber) starts as nsinit,
// this package's binary again, in new user, mount, PID, IPC and UTS
// namespaces (and network with "network": "none"), as a uid and gid of
// its own from Config.IDs mapped to themselves, with no supplementary
// group and no_new_privs; nsinit mounts the grant's /proc, tmpfs scratch
// directories and message queues, shows the grant its own cgroup at
// /sys/fs/cgroup, sets the host name to the grant's UID, brings loopback
// up, starts in RunDir/home (owned by that uid) and execs the template
// from a descriptor fiberd opened. The mounts it covers were covered in a
// mount namespace built once by the backend and copied for the grant, so
// the kernel locks them. See isolate_linux.go and nsinit_linux.go.
//
// Isolated grants share the host's network (but with "network": "none"),
// so the endpoint guard keeps their fibers' TCP endpoints apart: each
// isolated fiber's listener is marked (SO_MARK, GuardMark) at Clone and
// Resume, and an nftables table of the backend's refuses a new connection
// from one grant's uid to another grant's marked listener. Without nft,
// Isolation().EndpointsApart is false and Missing says so. See
// guard_linux.go.
//
// The PID namespaces, for whoever walks or checkpoints them (CRIU): at
// IsolationGrant and above the zygote is PID 1 of the grant's namespace,
// a child of fiberd's; at IsolationFiber each fiber of a zygote is PID 1 of
// a namespace of its own, a child of the grant's (the SDKs do it:
// unshare(CLONE_NEWPID), fork, setns back), with its own mount and IPC
// namespaces, and the zygote keeps CAP_SYS_ADMIN in the grant's user
// namespace for that; an exec fiber is PID 1 of its own namespace, a
// child of fiberd's. A PID 1 dies with its namespace's processes: the
// kernel ends every fiber with its zygote, and every process a fiber
// started with the fiber. Fiber.PID is always fiberd's view.
//
// # Cgroups and killing
//
// The caller (the agent) creates the grant's cgroup and each fiber's leaf
// (pkg/cgroup Tree.Grant, Grant.Fiber) and passes their paths. With a leaf,
// a fiber is killed through the leaf's cgroup.kill, which also reaches
// processes it started; without, by SIGKILL to its process group (it leads
// its own session). Once a Clone succeeded the backend owns the leaf and
// removes it when the fiber ends. Proc also owns <Cgroup>/zygote.
//
// A fiber of a dead (or stopped) zygote is reparented to the nearest child
// subreaper, else to the init of the pid namespace: fiberd when it is PID 1
// of a grant Pod, and on a host too once the command has marked it a child
// subreaper (cmd/fiberd does at start-up). Proc therefore reaps the fibers
// it knew of: it opens a pidfd on each when the zygote reports it (CLONED)
// and, once the zygote is gone and its fibers killed, waits on those pidfds
// (waitid P_PIDFD, polled, bounded by Config.KillTimeout) before it queues
// their Exits. A fiber that is not fiberd's child (the host's init has it)
// is left to its parent; one still running at the bound is logged. Proc
// never waits for any child or a bare pid, so no exit status is taken from
// the zygotes' or the exec backend's own waiters. Processes a fiber started
// itself, orphaned when the fiber dies first, are not reaped by the
// backend.
//
// # Parking (CHECKPOINT)
//
// Proc also implements Checkpointer when Config.CRIU names a working CRIU
// (4.2 or later; hack/criu.sh builds one): Park writes a running fiber's
// process tree to an image directory with criu dump and ends the fiber
// (its Exit says Parked); Resume restores an image with criu restore as a
// running fiber of the same grant under a new fence, in a new leaf, with a
// listener fiberd hands it as descriptor 3. An image carries a manifest
// (grant, epoch, fence, template, spec digest, listener, file sizes),
// written last; Resume refuses an image of another grant, epoch or
// template, or a damaged one, with ErrImageUnusable. A resumed fiber is
// fiberd's child rather than the zygote's: a watcher goroutine reaps it
// by pidfd, and the processes it leaves behind (reparented to fiberd) are
// reaped from its leaf, or without a leaf from its session. criu restore
// runs from a thread the backend keeps for it (spawn_linux.go), and a
// resume without a leaf is recorded in WarmRequest.Records while criu runs
// (procrec's restore record) and after. A fiber that leads its own pid namespace is parked
// with its namespace and resumed into a new one; a fiber inside a pid
// namespace it does not lead cannot be parked. See checkpoint.go and
// docs/operations.md.
//
// # Who imports it
//
// pkg/fiberd wires a Backend per tier and is its only caller. backend
// imports pkg/core, pkg/template and pkg/cgroup.
package backend

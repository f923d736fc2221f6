/*
 * fiberzygote: the template side of fiberd's zygote protocol, in C.
 *
 * A zygote is a template that initialises once and then forks one fiber per
 * request from fiberd. fiberd starts the zygote with a SOCK_SEQPACKET control
 * socket as descriptor 3 (FZ_CONTROL_FD). The zygote does its expensive
 * initialisation, then calls fz_serve, which says READY and from then on:
 *
 *   fiberd -> zygote  "CLONE <fence> <payload-hex|->" with SCM_RIGHTS
 *                     [listener] or [listener, leaf], the leaf being an
 *                     O_PATH descriptor of the fiber's cgroup.procs
 *   zygote -> fiberd  "CLONED <fence> <pid>" with SCM_RIGHTS [pidfd of the
 *                     child], once the child is set up
 *                     "ERROR <fence> <reason>" when it could not be
 *                     "EXITED <fence> exit:<code>" or
 *                     "EXITED <fence> signal:<SIGNAME>" when the child ended
 *
 * The child, before any user code runs: on Linux asks for SIGKILL when its
 * zygote dies (PR_SET_PDEATHSIG; fiberd starts the zygote the same way, so
 * a fiberd killed with SIGKILL leaves no fiber running), starts a new session (so the fiber
 * and its descendants form one process group), enters the leaf cgroup by
 * opening /proc/self/fd/<leaf> for writing and writing "0" to it (with its
 * own credentials: the descriptor carries none), moves the listener to
 * descriptor 3, closes
 * the control socket, and sets LISTEN_FDS=1, LISTEN_PID=<its pid>,
 * FIBERD_FENCE and FIBERD_PAYLOAD (the payload's hex; unset when there is
 * none). Then it calls on_fiber and exits with its return value.
 *
 * When fiberd starts the zygote with FIBERD_ISOLATION=fiber (it then also
 * leaves it CAP_SYS_ADMIN in the grant's user namespace), every child is
 * PID 1 of a PID namespace of its own: fz_serve calls unshare(CLONE_NEWPID)
 * before the fork and setns back to its own namespace after it. Before user
 * code the child also enters mount and IPC namespaces of its own, mounts a
 * /proc of its PID namespace and a tmpfs on /tmp, /var/tmp and /dev/shm
 * (each of FIBERD_SCRATCH_SIZE bytes, when fiberd gives that), and drops
 * every capability. Like any PID 1, such a fiber is not ended by
 * a signal it sends itself unless it handles it (abort() then ends it with
 * SIGSEGV), and the processes it starts end with it. The pid in CLONED is
 * the child's pid in the zygote's namespace; the pidfd names it for fiberd.
 *
 * Spares: fz_serve says "READY spares". On "SPARE <name>" it forks a spare,
 * a child that does the set-up above that needs no identity (parent-death
 * signal, session, isolation), closes the control socket and blocks on one
 * end of a new SOCK_SEQPACKET pair; the zygote sends fiberd the other end
 * with "SPARED <name> <pid>" (and a pidfd). fiberd then puts the spare in
 * its fiber's leaf and sends it "TAKE <fence> <payload-hex|->" with
 * [listener] on that socket; the spare moves the listener to descriptor 3,
 * sets the environment as above and calls on_fiber exactly as a cloned
 * child does (nothing is answered). A spare whose socket fiberd
 * closes exits 0. The zygote reaps spares like fibers and reports them
 * with "EXITED <name> ...", also after they became fibers. See
 * docs/templates.md.
 *
 * fz_serve reaps every child, so a fiber that crashes is reported as EXITED
 * and the zygote keeps serving. On Linux fz_serve also makes the zygote a
 * child subreaper, so processes a fiber started and left behind when it
 * ended are reparented to the zygote and reaped there (not left as zombies
 * of fiberd); the fibers themselves do not inherit the setting. When
 * fiberd closes the control socket the zygote kills its fibers' process
 * groups, reaps them and fz_serve returns 0.
 */
#ifndef FIBERZYGOTE_H
#define FIBERZYGOTE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The descriptor fiberd hands a zygote its control socket on. */
#define FZ_CONTROL_FD 3

/* The descriptor a fiber finds its listening socket on. */
#define FZ_LISTEN_FD 3

/* What a fiber is told about itself. Valid for the life of the fiber. */
struct fz_fiber {
	const char *fence;            /* "uid/epoch/seq", also in FIBERD_FENCE */
	const unsigned char *payload; /* decoded payload bytes; NULL when none */
	size_t payload_len;           /* 0 when none */
	int listen_fd;                /* always FZ_LISTEN_FD */
};

/* Runs in the forked child. Its return value is the fiber's exit code. */
typedef int (*fz_fiber_fn)(const struct fz_fiber *fiber, void *arg);

/*
 * fz_serve runs the zygote loop on control_fd (normally FZ_CONTROL_FD) until
 * fiberd closes it, then returns 0. In each forked child it calls
 * on_fiber(fiber, arg) and never returns there.
 *
 * It refuses to serve, printing why to stderr and returning -1 with errno
 * set, when control_fd is not a unix SOCK_SEQPACKET socket (the zygote was
 * not started by fiberd) or its set-up fails. It blocks SIGCHLD in the
 * calling thread; fibers start with the signal mask the caller had.
 */
int fz_serve(int control_fd, fz_fiber_fn on_fiber, void *arg);

/* Runs in a spare before it waits; 0 when it went well. */
typedef int (*fz_spare_fn)(void *arg);

/*
 * fz_serve_spares is fz_serve with a rehearsal: in every spare, once it is
 * set up and before it waits for TAKE, it calls on_spare(arg) (when not
 * NULL), where the template does what its fibers do first without effects
 * outside the process, for instance answering one request over a
 * socketpair, so the pages that touches are mapped and copied before the
 * Clone instead of after it. on_spare must return; a spare whose rehearsal
 * returns non-zero exits 127 (fiberd counts it as a spare that failed to
 * start). The SDK rehearses its own part of the hand-over in every spare
 * either way. fz_serve(fd, f, arg) is fz_serve_spares(fd, f, NULL, arg).
 */
int fz_serve_spares(int control_fd, fz_fiber_fn on_fiber, fz_spare_fn on_spare, void *arg);

/*
 * fz_socket_activated reports whether the process was started by the exec
 * backend (or any systemd-style activator) with a listener on descriptor 3:
 * LISTEN_FDS=1 and LISTEN_PID equal to getpid(). A template that can run
 * both ways checks it first and serves directly when it is true.
 */
int fz_socket_activated(void);

#ifdef __cplusplus
}
#endif

#endif

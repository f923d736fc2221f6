/* fiberzygote: see fiberzygote.h for the protocol. */
#define _GNU_SOURCE
#include "fiberzygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#ifdef __linux__
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define FZ_MSG_MAX 16384 /* a CLONE carries at most 4096 payload bytes as hex */
#define FZ_FENCE_MAX 255
#define FZ_MAX_FDS 4

struct fz_child {
	pid_t pid;
	char fence[FZ_FENCE_MAX + 1];
};

struct fz_state {
	int ctl;
	int sfd;
	int pidns; /* the zygote's own PID namespace when fibers get their own (FIBERD_ISOLATION=fiber), else -1 */
	sigset_t oldmask;
	struct fz_child *kids;
	size_t nkids, capkids;
};

static void fz_log(const char *fmt, const char *a, const char *b)
{
	fprintf(stderr, "fiberzygote: ");
	fprintf(stderr, fmt, a, b);
	fputc('\n', stderr);
}

static int fz_send(struct fz_state *st, const char *msg)
{
	ssize_t n;
	do {
		n = send(st->ctl, msg, strlen(msg), MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -1 : 0;
}

/* fz_send_fd sends msg with fd attached (SCM_RIGHTS), or alone when fd < 0. */
static int fz_send_fd(struct fz_state *st, const char *msg, int fd)
{
	if (fd < 0)
		return fz_send(st, msg);
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cm;
	memset(&cm, 0, sizeof(cm));
	struct iovec iov = {.iov_base = (void *)msg, .iov_len = strlen(msg)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	ssize_t n;
	do {
		n = sendmsg(st->ctl, &mh, MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -1 : 0;
}

static const char *fz_signame(int sig, char *buf, size_t len)
{
	static const struct { int sig; const char *name; } names[] = {
		{SIGHUP, "SIGHUP"}, {SIGINT, "SIGINT"}, {SIGQUIT, "SIGQUIT"},
		{SIGILL, "SIGILL"}, {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
		{SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"}, {SIGKILL, "SIGKILL"},
		{SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
		{SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
		{SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].sig == sig)
			return names[i].name;
	snprintf(buf, len, "SIG%d", sig);
	return buf;
}

static int fz_add_kid(struct fz_state *st, pid_t pid, const char *fence)
{
	if (st->nkids == st->capkids) {
		size_t cap = st->capkids ? st->capkids * 2 : 64;
		struct fz_child *k = realloc(st->kids, cap * sizeof(*k));
		if (!k)
			return -1;
		st->kids = k;
		st->capkids = cap;
	}
	st->kids[st->nkids].pid = pid;
	snprintf(st->kids[st->nkids].fence, sizeof(st->kids[st->nkids].fence), "%s", fence);
	st->nkids++;
	return 0;
}

/* Reap every child that has ended and report the ones that were fibers.
 * Other children (orphans of fibers, reparented to the subreaper zygote)
 * are reaped and ignored. */
static int fz_reap(struct fz_state *st, int block)
{
	int status;
	pid_t pid;
	while ((pid = waitpid(-1, &status, block ? 0 : WNOHANG)) > 0) {
		for (size_t i = 0; i < st->nkids; i++) {
			if (st->kids[i].pid != pid)
				continue;
			char msg[FZ_FENCE_MAX + 64], sb[16];
			if (WIFSIGNALED(status))
				snprintf(msg, sizeof(msg), "EXITED %s signal:%s", st->kids[i].fence,
					 fz_signame(WTERMSIG(status), sb, sizeof(sb)));
			else
				snprintf(msg, sizeof(msg), "EXITED %s exit:%d", st->kids[i].fence,
					 WEXITSTATUS(status));
			st->kids[i] = st->kids[--st->nkids];
			if (st->ctl >= 0 && fz_send(st, msg) < 0)
				return -1;
			break;
		}
		if (block && st->nkids == 0)
			break;
	}
	return 0;
}

static int fz_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int fz_unhex(const char *s, unsigned char **out, size_t *outlen)
{
	size_t n = strlen(s);
	*out = NULL;
	*outlen = 0;
	if (strcmp(s, "-") == 0)
		return 0;
	if (n == 0 || n % 2)
		return -1;
	unsigned char *b = malloc(n / 2);
	if (!b)
		return -1;
	for (size_t i = 0; i < n / 2; i++) {
		int hi = fz_hexval(s[2 * i]), lo = fz_hexval(s[2 * i + 1]);
		if (hi < 0 || lo < 0) {
			free(b);
			return -1;
		}
		b[i] = (unsigned char)(hi << 4 | lo);
	}
	*out = b;
	*outlen = n / 2;
	return 0;
}

static void fz_refuse(struct fz_state *st, const char *fence, const char *why)
{
	char msg[FZ_FENCE_MAX + 512];
	snprintf(msg, sizeof(msg), "ERROR %s %s", fence, why);
	fz_send(st, msg);
}

/* fz_enter_leaf moves the calling process into the fiber's cgroup leaf.
 * leaf_fd names the leaf's cgroup.procs (fiberd sends an O_PATH descriptor,
 * which carries no right of fiberd's): the file is opened anew through
 * /proc/self/fd, with this process's own credentials, and "0" written to it.
 * Returns 0 or an errno. */
static int fz_enter_leaf(int leaf_fd)
{
	char path[32];
	int f, e = 0;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", leaf_fd);
	f = open(path, O_WRONLY | O_CLOEXEC);
	if (f < 0)
		return errno;
	if (write(f, "0", 1) != 1)
		e = errno ? errno : EIO;
	close(f);
	return e;
}

#ifdef __linux__
/* The scratch directories a fiber gets a tmpfs of its own on. */
static const char *const fz_scratch[] = {"/tmp", "/var/tmp", "/dev/shm"};

/* The options of a fiber's scratch tmpfs mounts: "mode=1777", and the size
 * fiberd gives in FIBERD_SCRATCH_SIZE (bytes). Set by the zygote before it
 * forks (fz_scratch_options), read by fibers. */
static char fz_tmpfs_opts[64] = "mode=1777";

static void fz_scratch_options(void)
{
	const char *size = getenv("FIBERD_SCRATCH_SIZE");
	if (!size || !*size || strlen(size) > 20 || strspn(size, "0123456789") != strlen(size))
		return;
	snprintf(fz_tmpfs_opts, sizeof(fz_tmpfs_opts), "mode=1777,size=%s", size);
}

/* fz_isolate_fiber runs in a fiber that is PID 1 of a PID namespace of its
 * own: a mount and IPC namespace of its own, a /proc of its PID namespace,
 * a tmpfs on each scratch directory, then no capability left (the zygote
 * keeps CAP_SYS_ADMIN for this; the fiber must not). Returns 0 or an errno. */
static int fz_isolate_fiber(void)
{
	if (unshare(CLONE_NEWNS | CLONE_NEWIPC) < 0)
		return errno;
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return errno;
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		return errno;
	for (size_t i = 0; i < sizeof(fz_scratch) / sizeof(fz_scratch[0]); i++) {
		struct stat sb;
		if (stat(fz_scratch[i], &sb) < 0 || !S_ISDIR(sb.st_mode))
			continue;
		/* The grant's scratch goes first, so that a parked fiber's image
		 * holds one tmpfs per directory, not two (each costs criu a tar
		 * run); a failure (nothing mounted there) is no matter: the
		 * fiber's own goes on top either way. */
		(void)umount2(fz_scratch[i], MNT_DETACH);
		if (mount("tmpfs", fz_scratch[i], "tmpfs", MS_NOSUID | MS_NODEV, fz_tmpfs_opts) < 0)
			return errno;
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		return errno;
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof(data));
	if (syscall(SYS_capset, &hdr, data) < 0)
		return errno;
	return 0;
}
#endif

/* In the child, first half of the set-up before user code: the parent-death
 * signal, a new session, the fiber's isolation, and no descriptor of the
 * zygote's left but what the caller keeps. A spare does this when it is
 * forked, a cloned fiber right away. Returns 0 or an errno. */
static int fz_child_prepare(struct fz_state *st, pid_t zygote)
{
#ifdef __linux__
	/* A fiber ends with its zygote (which ends with fiberd): SIGKILL when
	 * the parent dies. The zygote may have died before the prctl; then the
	 * parent is another process already. (0 is a parent outside this pid
	 * namespace: nothing to compare with.) */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
		return errno;
	pid_t pp = getppid();
	if (pp != zygote && pp != 0)
		_exit(127);
#else
	(void)zygote;
#endif
	if (setsid() < 0)
		return errno;
#ifdef __linux__
	if (st->pidns >= 0) {
		close(st->pidns);
		st->pidns = -1;
		int e = fz_isolate_fiber();
		if (e)
			return e;
	}
#endif
	close(st->sfd);
	st->sfd = -1;
	return 0;
}

/* In the child, second half: enter the leaf, the listener on descriptor 3
 * (the control socket, when still open there, is closed), the fiber's
 * environment and the caller's signal mask. Returns 0 or an errno. */
static int fz_child_finish(struct fz_state *st, int listen_fd, int leaf_fd, const char *fence, const char *hex)
{
	char buf[32];
	if (leaf_fd >= 0) {
		int e = fz_enter_leaf(leaf_fd);
		if (e)
			return e;
		close(leaf_fd);
		if (listen_fd == leaf_fd)
			return EBADF;
	}
	if (st->ctl >= 0 && st->ctl != FZ_LISTEN_FD)
		close(st->ctl);
	if (listen_fd != FZ_LISTEN_FD) {
		if (dup2(listen_fd, FZ_LISTEN_FD) < 0) /* replaces the control socket when it is 3 */
			return errno;
		close(listen_fd);
	} else if (fcntl(FZ_LISTEN_FD, F_SETFD, 0) < 0) {
		return errno;
	}
	st->ctl = -1;
	int fl = fcntl(FZ_LISTEN_FD, F_GETFL);
	if (fl < 0 || fcntl(FZ_LISTEN_FD, F_SETFL, fl & ~O_NONBLOCK) < 0) /* servers expect a blocking accept */
		return errno;
	snprintf(buf, sizeof(buf), "%d", (int)getpid());
	if (setenv("LISTEN_FDS", "1", 1) || setenv("LISTEN_PID", buf, 1) || setenv("FIBERD_FENCE", fence, 1))
		return errno;
	if (strcmp(hex, "-") == 0)
		unsetenv("FIBERD_PAYLOAD");
	else if (setenv("FIBERD_PAYLOAD", hex, 1))
		return errno;
	if (sigprocmask(SIG_SETMASK, &st->oldmask, NULL) < 0)
		return errno;
	return 0;
}

/* In the child: the whole set-up of a cloned fiber. Returns 0 or an errno. */
static int fz_child_setup(struct fz_state *st, pid_t zygote, int listen_fd, int leaf_fd, const char *fence, const char *hex)
{
	int e = fz_child_prepare(st, zygote);
	return e ? e : fz_child_finish(st, listen_fd, leaf_fd, fence, hex);
}

/* fz_fork forks one fiber. With st->pidns (FIBERD_ISOLATION=fiber) the
 * child is PID 1 of a PID namespace of its own: unshare(CLONE_NEWPID) puts
 * the zygote's next child there, and setns back to the zygote's own
 * namespace afterwards keeps the one after that out of it. Returns the
 * child's pid (0 in the child), or -1 with why filled. */
static pid_t fz_fork(struct fz_state *st, char *why, size_t len)
{
#ifdef __linux__
	if (st->pidns >= 0 && unshare(CLONE_NEWPID) < 0) {
		snprintf(why, len, "isolation: unshare(CLONE_NEWPID): %s", strerror(errno));
		return -1;
	}
#endif
	pid_t pid = fork();
	int e = errno;
	if (pid == 0)
		return 0;
#ifdef __linux__
	if (st->pidns >= 0 && setns(st->pidns, CLONE_NEWPID) < 0) {
		/* Every later fiber would land in this one's namespace: stop. */
		fz_log("isolation: setns back to the zygote's PID namespace failed (%s)%s; exiting", strerror(errno), "");
		if (pid > 0)
			kill(pid, SIGKILL);
		_exit(70);
	}
#endif
	if (pid < 0)
		snprintf(why, len, "fork: %s", strerror(e));
	return pid;
}

static void fz_clone(struct fz_state *st, char *args, int *fds, int nfds, fz_fiber_fn on_fiber, void *arg)
{
	char *fence = strtok(args, " ");
	char *hex = strtok(NULL, " ");
	char *extra = strtok(NULL, " ");
	unsigned char *payload = NULL;
	size_t plen = 0;
	int sync[2] = {-1, -1};
	char why[256];

	if (!fence || strlen(fence) > FZ_FENCE_MAX) {
		fz_log("%s%s", "CLONE without a usable fence; ignored", "");
		goto out;
	}
	if (!hex || extra) {
		fz_refuse(st, fence, "malformed CLONE: want CLONE <fence> <payload-hex|->");
		goto out;
	}
	if (nfds < 1 || nfds > 2) {
		fz_refuse(st, fence, "CLONE must carry the listener and at most a leaf cgroup descriptor");
		goto out;
	}
	if (fz_unhex(hex, &payload, &plen) < 0) {
		fz_refuse(st, fence, "payload is not hex");
		goto out;
	}
	if (pipe2(sync, O_CLOEXEC) < 0) {
		snprintf(why, sizeof(why), "pipe: %s", strerror(errno));
		fz_refuse(st, fence, why);
		goto out;
	}
	fflush(NULL);
	pid_t zygote = getpid();
	pid_t pid = fz_fork(st, why, sizeof(why));
	if (pid < 0) {
		fz_refuse(st, fence, why);
		goto out;
	}
	if (pid == 0) {
		close(sync[0]);
		int e = fz_child_setup(st, zygote, fds[0], nfds > 1 ? fds[1] : -1, fence, hex);
		unsigned char rep[1 + sizeof(int)] = {0};
		if (e) {
			rep[0] = 1;
			memcpy(rep + 1, &e, sizeof(int));
		}
		if (write(sync[1], rep, sizeof(rep)) < 0) { /* the zygote is gone; nothing to report */ }
		close(sync[1]);
		if (e)
			_exit(127);
		struct fz_fiber f = {.fence = fence, .payload = payload, .payload_len = plen, .listen_fd = FZ_LISTEN_FD};
		exit(on_fiber(&f, arg) & 0xff);
	}
	close(sync[1]);
	sync[1] = -1;
	unsigned char rep[1 + sizeof(int)];
	ssize_t n;
	do {
		n = read(sync[0], rep, sizeof(rep));
	} while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(rep) || rep[0] != 0) {
		int e = 0;
		if (n == (ssize_t)sizeof(rep))
			memcpy(&e, rep + 1, sizeof(int));
		snprintf(why, sizeof(why), "fiber set-up failed (new session, cgroup entry, isolation, descriptor 3): %s",
			 e ? strerror(e) : "child died");
		waitpid(pid, NULL, 0);
		fz_refuse(st, fence, why);
		goto out;
	}
	if (fz_add_kid(st, pid, fence) < 0) {
		kill(-pid, SIGKILL);
		waitpid(pid, NULL, 0);
		fz_refuse(st, fence, "out of memory");
		goto out;
	}
	snprintf(why, sizeof(why), "CLONED %s %d", fence, (int)pid);
	{
		/* A pidfd lets fiberd find the fiber whatever PID namespace the
		 * zygote is in; without one (an old kernel) the pid must do. */
		int pidfd = -1;
#ifdef SYS_pidfd_open
		pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
		fz_send_fd(st, why, pidfd);
		if (pidfd >= 0)
			close(pidfd);
	}
out:
	if (sync[0] >= 0)
		close(sync[0]);
	if (sync[1] >= 0)
		close(sync[1]);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	free(payload);
}

/* fz_send_fds sends msg with fds attached (SCM_RIGHTS) on sock. */
static int fz_send_fds(int sock, const char *msg, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 2)];
		struct cmsghdr align;
	} cm;
	memset(&cm, 0, sizeof(cm));
	struct iovec iov = {.iov_base = (void *)msg, .iov_len = strlen(msg)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > 0) {
		mh.msg_control = cm.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	ssize_t n;
	do {
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -1 : 0;
}

/* fz_rehearse runs in a spare before it waits: what fz_spare_wait and
 * fz_child_finish will do after TAKE, on values of its own (parse a TAKE,
 * decode a payload, format the pid, set and unset the environment, read the
 * signal mask), so the pages that touches (libc's code, which a forked
 * child maps only when it first runs it, and the heap and environment it
 * shares with the zygote until it writes them) are mapped and copied now
 * rather than on the Clone's path. No identity is set: the values are
 * placeholders that TAKE overwrites. */
static void fz_rehearse(void)
{
	char m[] = "TAKE -/0/0 00", buf[32];
	unsigned char *payload = NULL;
	size_t plen = 0;
	sigset_t cur;
	if (strncmp(m, "TAKE ", 5) == 0 && !memchr(m, 0, strlen(m))) {
		char *fence = strtok(m + 5, " "), *hex = strtok(NULL, " ");
		(void)strtok(NULL, " ");
		if (fence && hex && strlen(fence) <= FZ_FENCE_MAX && fz_unhex(hex, &payload, &plen) == 0)
			free(payload);
	}
	snprintf(buf, sizeof(buf), "%d", (int)getpid());
	if (setenv("LISTEN_FDS", "1", 1) || setenv("LISTEN_PID", buf, 1) || setenv("FIBERD_FENCE", "-", 1) ||
	    setenv("FIBERD_PAYLOAD", "00", 1)) { /* out of memory: the take will say so */ }
	unsetenv("FIBERD_PAYLOAD");
	sigprocmask(SIG_BLOCK, NULL, &cur);
}

/* fz_spare_wait runs in a spare, set up but for its identity: it blocks on
 * its hand-over socket until fiberd takes it (TAKE <fence> <payload-hex|->
 * with [listener], fiberd having put it in its leaf already; a leaf sent
 * too is entered), finishes the set-up and becomes the fiber. Nothing is
 * answered: a spare that cannot become the fiber says why on stderr and
 * exits 127. It exits 0 when fiberd closes the socket first. */
static void fz_spare_wait(struct fz_state *st, int hs, fz_fiber_fn on_fiber, void *arg)
{
	static char msg[FZ_MSG_MAX + 1];
	union {
		char buf[CMSG_SPACE(sizeof(int) * FZ_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {.iov_base = msg, .iov_len = FZ_MSG_MAX};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
	ssize_t n;
	do {
		n = recvmsg(hs, &mh, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n <= 0)
		_exit(0); /* not wanted any more */
	int fds[FZ_MAX_FDS], nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		int *in = (int *)CMSG_DATA(c);
		for (int i = 0; i < k; i++) {
			if (nfds < FZ_MAX_FDS)
				fds[nfds++] = in[i];
			else
				close(in[i]);
		}
	}
	msg[n] = 0;
	close(hs); /* nothing more comes, and nothing is answered */
	char *fence = NULL, *hex = NULL, *extra = NULL;
	if (strncmp(msg, "TAKE ", 5) == 0 && !memchr(msg, 0, (size_t)n) && !(mh.msg_flags & MSG_TRUNC)) {
		fence = strtok(msg + 5, " ");
		hex = strtok(NULL, " ");
		extra = strtok(NULL, " ");
	}
	if (!fence || !hex || extra || strlen(fence) > FZ_FENCE_MAX || nfds < 1 || nfds > 2) {
		fz_log("spare: malformed TAKE (want TAKE <fence> <payload-hex|-> with [listener]): %.64s%s; exiting", msg + 5, "");
		_exit(127);
	}
	unsigned char *payload = NULL;
	size_t plen = 0;
	if (fz_unhex(hex, &payload, &plen) < 0) {
		fz_log("spare for %s: payload is not hex%s; exiting", fence, "");
		_exit(127);
	}
	int e = fz_child_finish(st, fds[0], nfds > 1 ? fds[1] : -1, fence, hex);
	if (e) {
		fz_log("spare for %s: fiber set-up failed (cgroup entry, descriptor 3): %s; exiting", fence, strerror(e));
		_exit(127);
	}
	struct fz_fiber f = {.fence = fence, .payload = payload, .payload_len = plen, .listen_fd = FZ_LISTEN_FD};
	exit(on_fiber(&f, arg) & 0xff);
}

/* fz_spare forks a spare on "SPARE <id>": a child set up as a fiber is,
 * but for its identity, blocked on a hand-over socket of its own whose
 * other end goes to fiberd with "SPARED <id> <pid>". */
static void fz_spare(struct fz_state *st, char *args, int *fds, int nfds, fz_fiber_fn on_fiber, fz_spare_fn on_spare,
		     void *arg)
{
	char *id = strtok(args, " ");
	char *extra = strtok(NULL, " ");
	int sync[2] = {-1, -1}, hs[2] = {-1, -1};
	char why[256];
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	if (!id || strlen(id) > FZ_FENCE_MAX) {
		fz_log("%s%s", "SPARE without a usable id; ignored", "");
		return;
	}
	if (extra) {
		fz_refuse(st, id, "malformed SPARE: want SPARE <id>");
		return;
	}
	if (pipe2(sync, O_CLOEXEC) < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, hs) < 0) {
		snprintf(why, sizeof(why), "pipe or socketpair: %s", strerror(errno));
		fz_refuse(st, id, why);
		goto out;
	}
	fflush(NULL);
	pid_t zygote = getpid();
	pid_t pid = fz_fork(st, why, sizeof(why));
	if (pid < 0) {
		fz_refuse(st, id, why);
		goto out;
	}
	if (pid == 0) {
		close(sync[0]);
		close(hs[0]);
		int e = fz_child_prepare(st, zygote);
		close(st->ctl);
		st->ctl = -1;
		unsigned char rep[1 + sizeof(int)] = {0};
		if (e) {
			rep[0] = 1;
			memcpy(rep + 1, &e, sizeof(int));
		}
		if (write(sync[1], rep, sizeof(rep)) < 0) { /* the zygote is gone */ }
		close(sync[1]);
		if (e)
			_exit(127);
		fz_rehearse();
		if (on_spare && on_spare(arg) != 0) {
			fz_log("spare %s: the template's rehearsal failed%s; exiting", id, "");
			_exit(127);
		}
		fz_spare_wait(st, hs[1], on_fiber, arg);
		_exit(127);
	}
	close(sync[1]);
	sync[1] = -1;
	close(hs[1]);
	hs[1] = -1;
	unsigned char rep[1 + sizeof(int)];
	ssize_t n;
	do {
		n = read(sync[0], rep, sizeof(rep));
	} while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(rep) || rep[0] != 0) {
		int e = 0;
		if (n == (ssize_t)sizeof(rep))
			memcpy(&e, rep + 1, sizeof(int));
		snprintf(why, sizeof(why), "spare set-up failed (new session, isolation): %s", e ? strerror(e) : "child died");
		waitpid(pid, NULL, 0);
		fz_refuse(st, id, why);
		goto out;
	}
	if (fz_add_kid(st, pid, id) < 0) {
		kill(-pid, SIGKILL);
		waitpid(pid, NULL, 0);
		fz_refuse(st, id, "out of memory");
		goto out;
	}
	snprintf(why, sizeof(why), "SPARED %s %d", id, (int)pid);
	{
		int out[2] = {hs[0], -1}, k = 1;
#ifdef SYS_pidfd_open
		out[1] = (int)syscall(SYS_pidfd_open, pid, 0);
		if (out[1] >= 0)
			k = 2;
#endif
		fz_send_fds(st->ctl, why, out, k);
		if (k == 2)
			close(out[1]);
	}
out:
	for (int i = 0; i < 2; i++) {
		if (sync[i] >= 0)
			close(sync[i]);
		if (hs[i] >= 0)
			close(hs[i]);
	}
}

int fz_socket_activated(void)
{
	const char *fds = getenv("LISTEN_FDS"), *pid = getenv("LISTEN_PID");
	return fds && pid && strcmp(fds, "1") == 0 && atol(pid) == (long)getpid();
}

int fz_serve(int control_fd, fz_fiber_fn on_fiber, void *arg)
{
	return fz_serve_spares(control_fd, on_fiber, NULL, arg);
}

int fz_serve_spares(int control_fd, fz_fiber_fn on_fiber, fz_spare_fn on_spare, void *arg)
{
	struct fz_state st = {.ctl = control_fd, .sfd = -1, .pidns = -1};
	struct stat sb;
	int type = 0, domain = 0;
	socklen_t len = sizeof(int);
	char dbuf[32];

	snprintf(dbuf, sizeof(dbuf), "%d", control_fd);
	if (fstat(control_fd, &sb) < 0 || !S_ISSOCK(sb.st_mode) ||
	    getsockopt(control_fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET ||
	    (len = sizeof(int), getsockopt(control_fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0) || domain != AF_UNIX) {
		fz_log("descriptor %s is not fiberd's control socket (a unix SOCK_SEQPACKET socket)%s; refusing to serve",
		       dbuf, "; start this template from fiberd, or with LISTEN_FDS for a cold start");
		errno = ENOTSOCK;
		return -1;
	}
	if (fcntl(control_fd, F_SETFD, FD_CLOEXEC) < 0)
		return -1;

#ifdef PR_SET_CHILD_SUBREAPER
	/* Orphans of fibers (processes a fiber started and outlived) come to
	 * the zygote instead of to fiberd, which reaps only pids it knows;
	 * fz_reap reaps them with the fibers. Not inherited by fork, so the
	 * fibers themselves are unaffected. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
		fz_log("cannot become a child subreaper (%s)%s; orphans of fibers go to fiberd", strerror(errno), "");
#endif

#ifdef __linux__
	const char *iso = getenv("FIBERD_ISOLATION");
	if (iso && strcmp(iso, "fiber") == 0) {
		fz_scratch_options();
		st.pidns = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
		if (st.pidns < 0)
			fz_log("isolation: cannot open /proc/self/ns/pid (%s)%s; fibers share the zygote's namespaces",
			       strerror(errno), "");
	}
#endif

	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &chld, &st.oldmask) < 0)
		return -1;
	st.sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (st.sfd < 0)
		return -1;

	if (fz_send(&st, "READY spares") < 0) {
		fz_log("%s%s", "cannot say READY on the control socket: ", strerror(errno));
		close(st.sfd);
		return -1;
	}

	static char msg[FZ_MSG_MAX + 1];
	for (;;) {
		struct pollfd p[2] = {{.fd = st.ctl, .events = POLLIN}, {.fd = st.sfd, .events = POLLIN}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents & POLLIN) {
			struct signalfd_siginfo si;
			while (read(st.sfd, &si, sizeof(si)) > 0) {
			}
			if (fz_reap(&st, 0) < 0)
				break;
		}
		if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;

		union {
			char buf[CMSG_SPACE(sizeof(int) * FZ_MAX_FDS)];
			struct cmsghdr align;
		} cm;
		struct iovec iov = {.iov_base = msg, .iov_len = FZ_MSG_MAX};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
		ssize_t n = recvmsg(st.ctl, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* fiberd closed the control socket, or it failed */

		int fds[FZ_MAX_FDS], nfds = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int *in = (int *)CMSG_DATA(c);
			for (int i = 0; i < k; i++) {
				if (nfds < FZ_MAX_FDS)
					fds[nfds++] = in[i];
				else
					close(in[i]);
			}
		}
		msg[n] = 0;
		if ((mh.msg_flags & MSG_TRUNC) || memchr(msg, 0, (size_t)n)) {
			fz_log("%s%s", "control message truncated or holds NUL; ignored", "");
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			continue;
		}
		if (strncmp(msg, "CLONE ", 6) == 0) {
			fz_clone(&st, msg + 6, fds, nfds, on_fiber, arg);
		} else if (strncmp(msg, "SPARE ", 6) == 0) {
			fz_spare(&st, msg + 6, fds, nfds, on_fiber, on_spare, arg);
		} else {
			fz_log("unknown control message %.32s%s; ignored", msg, "");
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
		}
	}

	/* fiberd is gone: end every fiber, reap them, and return. */
	close(st.ctl);
	st.ctl = -1;
	for (size_t i = 0; i < st.nkids; i++)
		kill(-st.kids[i].pid, SIGKILL), kill(st.kids[i].pid, SIGKILL);
	if (st.nkids)
		fz_reap(&st, 1);
	close(st.sfd);
	if (st.pidns >= 0)
		close(st.pidns);
	free(st.kids);
	sigprocmask(SIG_SETMASK, &st.oldmask, NULL);
	return 0;
}

/*
 * attacker: a template for the isolation test (TestIsolationAttack). Every
 * fiber is both a victim and an attacker.
 *
 * As a victim it holds a secret, the Clone's payload (so it is in its
 * environment as FIBERD_PAYLOAD), and writes it to a scratch file,
 * /tmp/fiberd-attack-<tag>-<secret>, before it serves. GET /whoami answers
 * "pid=<pid> secret=<secret>"; GET /planted answers "planted=yes" when a
 * file /tmp/fiberd-attack-<tag>-planted exists where this fiber can see it
 * (some other fiber wrote where it reads), else "planted=no".
 *
 * As an attacker, GET /attack?pids=P,..&secrets=S,..&socks=PATH,..&dirs=PATH,..&tcp=HOST:PORT,..
 * tries, against every pid (given in fiberd's PID namespace), every secret
 * (the other fibers'), every unix socket path and directory (fiberd's) and
 * TCP address:
 *   list     scan /proc for any process but itself, and one whose
 *            environment or command line holds a secret
 *   signal   kill(pid, 0) and kill(-1, 0), the permission check of every
 *            signal, and pidfd_open(pid)
 *   ptrace   PTRACE_SEIZE (detached again at once)
 *   environ  open /proc/<pid>/environ
 *   files    read every /tmp/fiberd-attack-<tag>-* file for a secret, and
 *            /proc/<pid>/root/tmp the same way
 *   write    create /tmp/fiberd-attack-<tag>-planted
 *   socket   connect to every unix socket path
 *   dir      open every directory
 *   tcp      connect to every address (giving up after 3 s)
 *   shared   create <dir>/fiberd-attack-<tag>-shared in every directory of
 *            shared=DIR,.. (world-writable places of the host)
 *   read     open and read every file of reads=PATH,.. (credentials: a
 *            token, a private key)
 * and with fill=DIR:BYTES,.. writes up to BYTES into
 * <dir>/fiberd-attack-<tag>-fill (removed again) and answers
 * "fill <dir> wrote <n> <done|error>", how much a scratch directory took;
 * and answers one line per attempt: "<attempt> blocked <why>" or
 * "<attempt> OPEN <what it reached>". Nothing it does harms its target:
 * signal 0 delivers nothing, a seized process is detached untouched.
 *
 * With --unmount QUERY, the zygote itself attacks before it serves: it
 * unmounts what nsinit mounted over /proc, the scratch directories,
 * /sys/fs/cgroup and /dev/mqueue (a zygote of IsolationFiber holds
 * CAP_SYS_ADMIN in its user namespace), then runs the attack of QUERY
 * (pids=..&secrets=..&dirs=.., as /attack) from there; its fibers answer
 * GET /zygote with the zygote's lines, "umount <dir> done|<error>" first.
 *
 * Usage: attacker --tag TAG [--unmount QUERY]. Built with the C SDK;
 * started with LISTEN_FDS it serves as the one fiber (the exec backend).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include "fiberzygote.h"

static const char *tag = "x";
static char secret[256] = "-";

struct out {
	char buf[65536];
	size_t len;
};

static void say(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct out *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(o->buf + o->len, sizeof(o->buf) - o->len, fmt, ap);
	va_end(ap);
	if (n > 0 && o->len + (size_t)n < sizeof(o->buf))
		o->len += (size_t)n;
}

static void verdict(struct out *o, const char *what, const char *target, int ok, int err)
{
	if (ok)
		say(o, "%s %s OPEN\n", what, target);
	else
		say(o, "%s %s blocked %s\n", what, target, strerror(err));
}

/* holds reports whether the file at path contains one of the secrets. */
static const char *holds(const char *path, char **secrets, int ns)
{
	static char buf[1 << 16];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return NULL;
	for (ssize_t i = 0; i < n; i++)
		if (buf[i] == 0)
			buf[i] = ' ';
	buf[n] = 0;
	for (int i = 0; i < ns; i++)
		if (strstr(buf, secrets[i]))
			return secrets[i];
	return NULL;
}

static void scan_tmp(struct out *o, const char *dir, char **secrets, int ns)
{
	char prefix[128], path[512];
	snprintf(prefix, sizeof(prefix), "fiberd-attack-%s-", tag);
	DIR *d = opendir(dir);
	if (!d) {
		say(o, "files %s blocked %s\n", dir, strerror(errno));
		return;
	}
	int found = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		const char *s = holds(path, secrets, ns);
		if (s) {
			say(o, "files %s OPEN holds %s\n", path, s);
			found = 1;
		}
	}
	closedir(d);
	if (!found)
		say(o, "files %s blocked no other fiber's file\n", dir);
}

/* fill is fill=DIR:BYTES: see the top. */
static void fill(struct out *o, char *spec)
{
	static char chunk[1 << 16];
	char *colon = strrchr(spec, ':');
	if (!colon)
		return;
	*colon = 0;
	long long want = atoll(colon + 1), wrote = 0;
	char path[512];
	snprintf(path, sizeof(path), "%s/fiberd-attack-%s-fill", spec, tag);
	memset(chunk, 'f', sizeof(chunk));
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		say(o, "fill %s wrote 0 %s\n", spec, strerror(errno));
		return;
	}
	int err = 0;
	while (wrote < want) {
		ssize_t n = write(fd, chunk, sizeof(chunk));
		if (n <= 0) {
			err = n < 0 ? errno : ENOSPC;
			break;
		}
		wrote += n;
	}
	close(fd);
	unlink(path);
	say(o, "fill %s wrote %lld %s\n", spec, wrote, err ? strerror(err) : "done");
}

static void attack(struct out *o, char *query)
{
	char *pids[64], *secrets[64], *socks[16], *dirs[16], *tcps[16], *shared[16], *fills[8], *reads[16];
	int np = 0, ns = 0, nso = 0, nd = 0, nt = 0, nsh = 0, nf = 0, nr = 0;
	for (char *kv = strtok(query, "&"); kv; kv = strtok(NULL, "&")) {
		char *v = strchr(kv, '=');
		if (!v)
			continue;
		*v++ = 0;
		char *copy = strdup(v); /* strtok inside split would clobber this loop's state */
		char *save;
		int *cnt = NULL;
		char **dst = NULL;
		int cap = 0;
		if (!strcmp(kv, "pids"))
			dst = pids, cnt = &np, cap = 64;
		else if (!strcmp(kv, "secrets"))
			dst = secrets, cnt = &ns, cap = 64;
		else if (!strcmp(kv, "socks"))
			dst = socks, cnt = &nso, cap = 16;
		else if (!strcmp(kv, "dirs"))
			dst = dirs, cnt = &nd, cap = 16;
		else if (!strcmp(kv, "tcp"))
			dst = tcps, cnt = &nt, cap = 16;
		else if (!strcmp(kv, "shared"))
			dst = shared, cnt = &nsh, cap = 16;
		else if (!strcmp(kv, "fill"))
			dst = fills, cnt = &nf, cap = 8;
		else if (!strcmp(kv, "reads"))
			dst = reads, cnt = &nr, cap = 16;
		if (!dst)
			continue;
		for (char *t = strtok_r(copy, ",", &save); t && *cnt < cap; t = strtok_r(NULL, ",", &save))
			if (*t)
				dst[(*cnt)++] = t;
	}

	/* list: any process but this one, and any that holds a secret in its
	 * environment, command line or scratch files */
	DIR *d = opendir("/proc");
	int others = 0, found = 0;
	char self[32] = "";
	/* Its own pid as this /proc numbers it (not getpid() when /proc is
	 * another PID namespace's). */
	ssize_t sl = readlink("/proc/self", self, sizeof(self) - 1);
	self[sl > 0 ? sl : 0] = 0;
	if (d) {
		struct dirent *e;
		char path[512];
		while ((e = readdir(d))) {
			if (e->d_name[0] < '0' || e->d_name[0] > '9' || !strcmp(e->d_name, self))
				continue;
			if (++others <= 3)
				say(o, "list /proc/%s OPEN sees another process\n", e->d_name);
			for (int k = 0; k < 2; k++) {
				snprintf(path, sizeof(path), "/proc/%s/%s", e->d_name, k ? "cmdline" : "environ");
				const char *s = holds(path, secrets, ns);
				if (s) {
					say(o, "list /proc/%s OPEN holds %s\n", e->d_name, s);
					found = 1;
				}
			}
		}
		closedir(d);
	}
	if (!others && !found)
		say(o, "list /proc blocked sees no other process\n");

	errno = 0;
	int r = kill(-1, 0);
	verdict(o, "signal", "-1", r == 0, errno);

	for (int i = 0; i < np; i++) {
		pid_t pid = (pid_t)atoi(pids[i]);
		char path[256];
		errno = 0;
		r = kill(pid, 0);
		verdict(o, "signal", pids[i], r == 0, errno);
		errno = 0;
		int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
		verdict(o, "pidfd", pids[i], pfd >= 0, errno);
		if (pfd >= 0)
			close(pfd);
		errno = 0;
		long pr = ptrace(PTRACE_SEIZE, pid, NULL, NULL);
		int perr = errno;
		if (pr == 0)
			ptrace(PTRACE_DETACH, pid, NULL, NULL);
		verdict(o, "ptrace", pids[i], pr == 0, perr);
		snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
		errno = 0;
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		verdict(o, "environ", pids[i], fd >= 0, errno);
		if (fd >= 0)
			close(fd);
		snprintf(path, sizeof(path), "/proc/%d/root/tmp", (int)pid);
		scan_tmp(o, path, secrets, ns);
	}

	scan_tmp(o, "/tmp", secrets, ns);

	char planted[256];
	snprintf(planted, sizeof(planted), "/tmp/fiberd-attack-%s-planted", tag);
	int pf = open(planted, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
	say(o, "write %s %s\n", planted, pf >= 0 ? "done" : strerror(errno));
	if (pf >= 0)
		close(pf);

	for (int i = 0; i < nso; i++) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socks[i]);
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		errno = 0;
		r = connect(s, (struct sockaddr *)&sa, sizeof(sa));
		verdict(o, "socket", socks[i], r == 0, errno);
		close(s);
	}
	for (int i = 0; i < nd; i++) {
		errno = 0;
		int fd = open(dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		verdict(o, "dir", dirs[i], fd >= 0, errno);
		if (fd >= 0)
			close(fd);
	}
	for (int i = 0; i < nt; i++) {
		char host[64];
		snprintf(host, sizeof(host), "%s", tcps[i]);
		char *colon = strrchr(host, ':');
		if (!colon)
			continue;
		*colon = 0;
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
		inet_pton(AF_INET, host, &sa.sin_addr);
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		/* A dropped SYN would keep connect waiting for minutes: give up
		 * after 3 s (ETIMEDOUT... EINPROGRESS) and call it blocked. */
		struct timeval tv = {.tv_sec = 3};
		setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		errno = 0;
		r = connect(s, (struct sockaddr *)&sa, sizeof(sa));
		verdict(o, "tcp", tcps[i], r == 0, errno);
		close(s);
	}
	for (int i = 0; i < nsh; i++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/fiberd-attack-%s-shared", shared[i], tag);
		errno = 0;
		int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
		verdict(o, "shared", shared[i], fd >= 0, errno);
		if (fd >= 0)
			close(fd);
	}
	for (int i = 0; i < nr; i++) {
		char buf[64];
		errno = 0;
		int fd = open(reads[i], O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf)) : -1;
		verdict(o, "read", reads[i], n >= 0, errno);
		if (fd >= 0)
			close(fd);
	}
	for (int i = 0; i < nf; i++)
		fill(o, fills[i]);
}

static struct out zygote_report;

/* zygote_attack is --unmount: see the top. */
static void zygote_attack(const char *query)
{
	static const char *const dirs[] = {"/proc", "/tmp", "/var/tmp", "/dev/shm", "/sys/fs/cgroup", "/dev/mqueue"};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		int r = umount2(dirs[i], MNT_DETACH);
		say(&zygote_report, "umount %s %s\n", dirs[i], r == 0 ? "done" : strerror(errno));
	}
	char *q = strdup(query);
	attack(&zygote_report, q);
	free(q);
}

static void answer(int c, const char *body, size_t len)
{
	char head[256];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", len);
	if (write(c, head, (size_t)n) < 0 || write(c, body, len) < 0) { /* the client went away */ }
}

static int serve(void)
{
	static struct out o;
	char path[512];
	const char *p = getenv("FIBERD_PAYLOAD");
	if (p) {
		/* The payload is hex of an ASCII secret. */
		size_t n = strlen(p) / 2;
		if (n >= sizeof(secret))
			n = sizeof(secret) - 1;
		for (size_t i = 0; i < n; i++) {
			unsigned v;
			sscanf(p + 2 * i, "%2x", &v);
			secret[i] = (char)v;
		}
		secret[n] = 0;
	}
	snprintf(path, sizeof(path), "/tmp/fiberd-attack-%s-%s", tag, secret);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd >= 0) {
		if (write(fd, secret, strlen(secret)) < 0) { /* reported by /whoami's file=no */ }
		close(fd);
	}
	signal(SIGPIPE, SIG_IGN);
	for (;;) {
		int c = accept(FZ_LISTEN_FD, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("attacker: accept");
			return 1;
		}
		char req[8192];
		size_t got = 0;
		while (got < sizeof(req) - 1) {
			ssize_t n = read(c, req + got, sizeof(req) - 1 - got);
			if (n <= 0)
				break;
			got += (size_t)n;
			req[got] = 0;
			if (strstr(req, "\r\n\r\n"))
				break;
		}
		req[got] = 0;
		char *sp = strchr(req + 4, ' ');
		if (sp)
			*sp = 0;
		o.len = 0;
		if (!strncmp(req, "GET /attack?", 12)) {
			attack(&o, req + 12);
		} else if (!strcmp(req, "GET /zygote")) {
			memcpy(o.buf, zygote_report.buf, zygote_report.len);
			o.len = zygote_report.len;
		} else if (!strcmp(req, "GET /planted")) {
			char pl[256];
			snprintf(pl, sizeof(pl), "/tmp/fiberd-attack-%s-planted", tag);
			say(&o, "planted=%s\n", access(pl, F_OK) == 0 ? "yes" : "no");
		} else {
			say(&o, "pid=%d secret=%s file=%s\n", (int)getpid(), secret, access(path, F_OK) == 0 ? "yes" : "no");
		}
		answer(c, o.buf, o.len);
		close(c);
	}
}

static int on_fiber(const struct fz_fiber *f, void *arg)
{
	(void)f;
	(void)arg;
	return serve();
}

int main(int argc, char **argv)
{
	const char *unmount = NULL;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--tag"))
			tag = argv[i + 1];
		else if (!strcmp(argv[i], "--unmount"))
			unmount = argv[i + 1];
	}
	if (fz_socket_activated())
		return serve();
	if (unmount)
		zygote_attack(unmount);
	return fz_serve(FZ_CONTROL_FD, on_fiber, NULL) < 0 ? 2 : 0;
}

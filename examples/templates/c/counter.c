/*
 * counter: an HTTP counter template for fiberd, in C.
 *
 * Every fiber answers each HTTP request on its listener (descriptor 3) with
 * "fence=<fence> pid=<pid> count=<n> payload=<hex|-> cgroup=<path>", n
 * counting the requests that fiber has served and path the cgroup it found
 * itself in when it started. GET /crash makes the fiber abort (for testing that a crash does not
 * hurt the zygote); GET /exit/<code> makes it exit with <code>. GET /orphan
 * forks a child that sleeps 60 s, answers "orphan=<child pid>" and exits 0,
 * leaving the child behind (for testing that the zygote reaps such orphans);
 * GET /orphan/pgrp does the same with the child in a process group of its
 * own, out of reach of the kill of the fiber's group.
 *
 * Options:
 *   --init-ms N    spend N milliseconds initialising before serving (default 0),
 *                  the cost a warm zygote pays once and a cold exec pays per fiber
 *   --hold-mib N   allocate and touch N MiB during init, kept for life (default 0)
 *   --dirty-mib N  each fiber writes N MiB of its own before serving (default 0)
 *
 * Started by the proc backend (descriptor 3 is the control socket) it is a
 * zygote and forks fibers through fz_serve; started by the exec backend
 * (LISTEN_FDS=1, LISTEN_PID=its pid) it serves as the one fiber directly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fiberzygote.h"

static unsigned char *held;
static long dirty_mib;
static unsigned char *fiber_mem; /* global so the writes that dirty it are kept */

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void init(long init_ms, long hold_mib)
{
	double start = now_ms();
	if (hold_mib > 0) {
		size_t n = (size_t)hold_mib << 20;
		held = malloc(n);
		if (!held) {
			perror("counter: malloc");
			exit(1);
		}
		for (size_t i = 0; i < n; i += 4096)
			held[i] = (unsigned char)(i >> 12);
	}
	/* Stand-in for imports, JIT warm-up, model loading: burn the rest. */
	volatile unsigned long x = 0;
	while (now_ms() - start < (double)init_ms)
		for (int i = 0; i < 10000; i++)
			x += (unsigned long)i * 2654435761u;
}

/* The cgroup v2 path the fiber runs in, read before anything else it does,
 * so a test can see that the fiber was in its leaf before user code ran. */
static void own_cgroup(char *out, size_t len)
{
	char line[512];
	FILE *f = fopen("/proc/self/cgroup", "r");
	snprintf(out, len, "-");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "0::", 3) == 0) {
			line[strcspn(line, "\n")] = 0;
			snprintf(out, len, "%s", line + 3);
		}
	fclose(f);
}

/* Leave a sleeping child behind: answer with its pid on c and exit 0. */
static void orphan(int c, int own_group)
{
	pid_t pid = fork();
	if (pid == 0) {
		close(c);
		close(FZ_LISTEN_FD);
		if (own_group)
			setpgid(0, 0);
		sleep(60);
		_exit(0);
	}
	if (pid < 0) {
		perror("counter: fork");
		exit(1);
	}
	if (own_group)
		setpgid(pid, pid); /* also here, so it is done before this fiber exits */
	char body[64], out[256];
	int bl = snprintf(body, sizeof(body), "orphan=%d\n", (int)pid);
	int ol = snprintf(out, sizeof(out),
			  "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			  bl, body);
	if (write(c, out, (size_t)ol) < 0) { /* the client went away */ }
	close(c);
	exit(0);
}

/* Answer body on c and close it. */
static void reply(int c, const char *body)
{
	char out[256];
	int ol = snprintf(out, sizeof(out),
			  "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			  (int)strlen(body), body);
	if (write(c, out, (size_t)ol) < 0) { /* the client went away */ }
	close(c);
}

/* Leave a sleeping child in this fiber's session and group, answer with its
 * pid and go on serving. */
static void child(int c)
{
	pid_t pid = fork();
	if (pid == 0) {
		close(c);
		close(FZ_LISTEN_FD);
		sleep(60);
		_exit(0);
	}
	char body[64];
	if (pid < 0)
		snprintf(body, sizeof(body), "child=-1\n");
	else
		snprintf(body, sizeof(body), "child=%d\n", (int)pid);
	reply(c, body);
}

/* Write mib MiB more of this fiber's own memory, kept for life. */
static long dirtied;
static void dirty(int c, long mib)
{
	char body[64];
	if (mib > 0) {
		size_t n = (size_t)mib << 20;
		volatile unsigned char *m = malloc(n); /* volatile: the writes are the point */
		if (m) {
			for (size_t i = 0; i < n; i += 4096)
				m[i] = 1;
			dirtied += mib;
		}
	}
	snprintf(body, sizeof(body), "dirty=%ld\n", dirtied);
	reply(c, body);
}

/* Read one request from c and answer it (the special paths above, or the
 * count). count is the fiber's, bumped by a counted request. */
static void answer(int c, const char *fence, const char *payload, const char *cg, unsigned long *count)
{
	char req[4096];
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
	if (strncmp(req, "GET /crash ", 11) == 0)
		abort();
	if (strncmp(req, "GET /exit/", 10) == 0)
		exit(atoi(req + 10));
	if (strncmp(req, "GET /orphan ", 12) == 0 || strncmp(req, "GET /orphan/pgrp ", 17) == 0)
		orphan(c, req[11] == '/');
	if (strncmp(req, "GET /child ", 11) == 0) {
		child(c);
		return;
	}
	if (strncmp(req, "GET /dirty/", 11) == 0) {
		dirty(c, atol(req + 11));
		return;
	}
	(*count)++;
	char body[2048], out[4096];
	int bl = snprintf(body, sizeof(body), "fence=%s pid=%d count=%lu payload=%.1024s cgroup=%s\n", fence,
			  (int)getpid(), *count, payload ? payload : "-", cg);
	int ol = snprintf(out, sizeof(out),
			  "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			  bl, body);
	if (write(c, out, (size_t)ol) < 0) { /* the client went away */ }
	close(c);
}

static int serve(const char *fence)
{
	unsigned long count = 0;
	char cg[512];
	const char *payload = getenv("FIBERD_PAYLOAD");
	own_cgroup(cg, sizeof(cg));
	signal(SIGPIPE, SIG_IGN);
	if (dirty_mib > 0) {
		size_t n = (size_t)dirty_mib << 20;
		fiber_mem = malloc(n);
		if (!fiber_mem)
			return 1;
		for (size_t i = 0; i < n; i += 4096)
			fiber_mem[i] = 1;
	}
	for (;;) {
		int c = accept(FZ_LISTEN_FD, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("counter: accept");
			return 1;
		}
		answer(c, fence, payload, cg, &count);
	}
}

/* Run in every spare before it waits (fz_serve_spares' on_spare): answer
 * one request over a socketpair as a fiber would, so the code and pages a
 * first request touches are mapped before the Clone, not after it. Nothing
 * leaves the process. */
static int rehearse(void *arg)
{
	(void)arg;
	int sv[2];
	char cg[512], buf[512];
	unsigned long count = 0;
	static const char req[] = "GET / HTTP/1.1\r\nHost: rehearsal\r\n\r\n";
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return 0; /* nothing rehearsed; the fiber pays on its first request */
	own_cgroup(cg, sizeof(cg));
	if (write(sv[1], req, sizeof(req) - 1) == (ssize_t)(sizeof(req) - 1)) {
		answer(sv[0], "-", NULL, cg, &count); /* closes sv[0] */
		while (read(sv[1], buf, sizeof(buf)) > 0) {
		}
	} else {
		close(sv[0]);
	}
	close(sv[1]);
	return 0;
}

static int on_fiber(const struct fz_fiber *f, void *arg)
{
	(void)arg;
	return serve(f->fence);
}

int main(int argc, char **argv)
{
	long init_ms = 0, hold_mib = 0;
	for (int i = 1; i < argc; i++) {
		if (i + 1 < argc && strcmp(argv[i], "--init-ms") == 0)
			init_ms = atol(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--hold-mib") == 0)
			hold_mib = atol(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--dirty-mib") == 0)
			dirty_mib = atol(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [--init-ms N] [--hold-mib N] [--dirty-mib N]\n", argv[0]);
			return 2;
		}
	}
	init(init_ms, hold_mib);
	if (fz_socket_activated()) {
		const char *fence = getenv("FIBERD_FENCE");
		return serve(fence ? fence : "-");
	}
	if (fz_serve_spares(FZ_CONTROL_FD, on_fiber, rehearse, NULL) < 0)
		return 2;
	return 0;
}

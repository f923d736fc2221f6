/*
 * hostfloor: what this machine charges any design of fibers, measured
 * without fiberd. The bench builds and runs it before anything else (see
 * bench/floor.go) and prints its lines beside the rows they bound.
 *
 *   hostfloor SECONDS SAMPLES IDLE_MS
 *
 * prints one "key value" line per measurement:
 *
 *   forks_per_s_1      fork + _exit + waitpid of this small process, one
 *                      loop, for SECONDS: the rate one core makes processes
 *   forks_per_s_all    the same with one loop per online CPU at once, summed:
 *                      the machine's ceiling on new processes per second
 *   cow_fault_us       a forked child writing one byte into each of 4096
 *                      pages its parent had written: microseconds a page
 *                      (median of SAMPLES children)
 *   wake_us            round trip to a child blocked in read on a
 *                      SOCK_SEQPACKET pair, sent right after the previous
 *                      one (median of 20 * SAMPLES)
 *   wake_idle_us       the same after IDLE_MS of sleep (median of SAMPLES)
 *   chase_us           one walk of a random cycle through 256 KiB, one cache
 *                      line a step, right after the previous walk (median)
 *   chase_idle_us      the same walk after IDLE_MS of sleep (median)
 *
 * The last four say what a woken spare meets: the cost of being woken, and
 * how cold the caches are after the machine idled.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define COW_PAGES 4096
#define CHASE_BYTES (256 * 1024)
#define LINE 64

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void sleep_ms(long ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&t, &t) != 0)
		;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof *v, cmp);
	return v[n / 2];
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* fork_loop forks, exits and reaps children for secs; returns how many. */
static long fork_loop(double secs)
{
	long n = 0;
	double end = now_us() + secs * 1e6;
	while (now_us() < end) {
		pid_t p = fork();
		if (p < 0)
			die("fork");
		if (p == 0)
			_exit(0);
		if (waitpid(p, NULL, 0) != p)
			die("waitpid");
		n++;
	}
	return n;
}

/* forks_all runs one fork_loop per online CPU in children of its own and
 * sums their counts, read back over a pipe. */
static double forks_all(double secs)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int fds[2];
	if (cpus < 1)
		cpus = 1;
	if (pipe(fds) != 0)
		die("pipe");
	for (long i = 0; i < cpus; i++) {
		pid_t p = fork();
		if (p < 0)
			die("fork");
		if (p == 0) {
			long n = fork_loop(secs);
			if (write(fds[1], &n, sizeof n) != sizeof n)
				_exit(1);
			_exit(0);
		}
	}
	close(fds[1]);
	long sum = 0, n;
	for (long i = 0; i < cpus; i++) {
		if (read(fds[0], &n, sizeof n) != sizeof n)
			die("read loop count");
		sum += n;
	}
	close(fds[0]);
	while (wait(NULL) > 0)
		;
	return sum / secs;
}

static double cow_fault(int samples)
{
	volatile char *m = mmap(NULL, (size_t)COW_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	double v[samples];
	int fds[2];
	if (m == MAP_FAILED)
		die("mmap");
	for (int i = 0; i < COW_PAGES; i++)
		m[(size_t)i * PAGE] = 1;
	for (int s = 0; s < samples; s++) {
		if (pipe(fds) != 0)
			die("pipe");
		pid_t p = fork();
		if (p < 0)
			die("fork");
		if (p == 0) {
			double t = now_us();
			for (int i = 0; i < COW_PAGES; i++)
				m[(size_t)i * PAGE] = 2;
			double per = (now_us() - t) / COW_PAGES;
			_exit(write(fds[1], &per, sizeof per) == sizeof per ? 0 : 1);
		}
		close(fds[1]);
		if (read(fds[0], &v[s], sizeof v[s]) != sizeof v[s])
			die("read fault cost");
		close(fds[0]);
		waitpid(p, NULL, 0);
	}
	munmap((void *)m, (size_t)COW_PAGES * PAGE);
	return median(v, samples);
}

/* wake measures round trips to a child blocked in read, idle_ms apart. */
static double wake(int n, long idle_ms)
{
	int sv[2];
	double v[n];
	char c = 'x';
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0)
		die("socketpair");
	pid_t p = fork();
	if (p < 0)
		die("fork");
	if (p == 0) {
		close(sv[0]);
		while (read(sv[1], &c, 1) == 1)
			if (write(sv[1], &c, 1) != 1)
				break;
		_exit(0);
	}
	close(sv[1]);
	for (int i = 0; i < n; i++) {
		if (idle_ms > 0)
			sleep_ms(idle_ms);
		double t = now_us();
		if (write(sv[0], &c, 1) != 1 || read(sv[0], &c, 1) != 1)
			die("round trip");
		v[i] = now_us() - t;
	}
	close(sv[0]);
	waitpid(p, NULL, 0);
	return median(v, n);
}

/* chase walks a random cycle through CHASE_BYTES, a line a step, n times,
 * idle_ms apart; one untimed walk first. */
static double chase(int n, long idle_ms)
{
	size_t lines = CHASE_BYTES / LINE, stride = LINE / sizeof(unsigned);
	unsigned *next = aligned_alloc(PAGE, CHASE_BYTES), *order = malloc(lines * sizeof *order);
	double v[n];
	volatile unsigned at = 0;
	if (next == NULL || order == NULL)
		die("malloc");
	for (size_t i = 0; i < lines; i++)
		order[i] = i;
	srand(1);
	for (size_t i = lines - 1; i > 0; i--) {
		size_t j = (size_t)rand() % (i + 1);
		unsigned t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (size_t i = 0; i < lines; i++)
		next[order[i] * stride] = order[(i + 1) % lines];
	for (int i = -1; i < n; i++) {
		if (idle_ms > 0 && i >= 0)
			sleep_ms(idle_ms);
		unsigned p = 0;
		double t = now_us();
		for (size_t k = 0; k < lines; k++)
			p = next[p * stride];
		if (i >= 0)
			v[i] = now_us() - t;
		at = p;
	}
	(void)at;
	free(next);
	free(order);
	return median(v, n);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: hostfloor SECONDS SAMPLES IDLE_MS\n");
		return 2;
	}
	double secs = atof(argv[1]);
	int samples = atoi(argv[2]);
	long idle = atol(argv[3]);
	if (secs <= 0 || samples < 1 || samples > 1000 || idle < 0) {
		fprintf(stderr, "hostfloor: want SECONDS > 0, 1 <= SAMPLES <= 1000, IDLE_MS >= 0\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("forks_per_s_1 %.1f\n", fork_loop(secs) / secs);
	printf("forks_per_s_all %.1f\n", forks_all(secs));
	printf("cow_fault_us %.3f\n", cow_fault(samples));
	printf("wake_us %.1f\n", wake(20 * samples, 0));
	printf("wake_idle_us %.1f\n", wake(samples, idle));
	printf("chase_us %.1f\n", chase(samples, 0));
	printf("chase_idle_us %.1f\n", chase(samples, idle));
	return 0;
}

/*
 * A native program that stops at known points for tests/eim/stack: gdb's
 * backtrace of it is the ground truth `eim stack` is compared with.
 *
 * Built by the test with `cc -O2 -fomit-frame-pointer` and no -g: only
 * the CFI (.eh_frame, on by default) describes the frames, as on a
 * production host. noinline and the asm barriers keep every function a
 * frame of its own (no inlining, no tail call, no recursion turned into a
 * loop).
 *
 * argv[1] is the scenario:
 *   chain    main -> a -> b -> qsort (a PLT call into libc) -> cmp -> c,
 *            which parks;
 *   recurse  main -> recurse x DEPTH, the deepest parks;
 *   signal   main -> raise_usr1 -> raise(SIGUSR1); the handler (installed
 *            with sigaction) parks;
 *   spin     main -> spin_outer -> spin_inner, which computes forever (no
 *            syscall: every CPU sample of it is in this chain), for
 *            `eim profile`;
 *   split    main -> split_work -> hot_a / hot_b, which compute forever,
 *            hot_a 7 units of the same work for every 3 of hot_b: a known
 *            70/30 split of the CPU samples, for `eim profile` against
 *            perf;
 *   syscalls main -> read_zero_loop, which reads /dev/zero 64 KiB at a
 *            time forever: most of its CPU samples are in the kernel
 *            (`eim profile --kernel`);
 *   clock    main -> clock_outer -> clock_inner, which reads the clock
 *            with clock_gettime forever (the C library calls the vDSO:
 *            most of the time the thread is inside it);
 *   tod      the same with gettimeofday.
 * Every scenario also starts a second thread blocked in read() on a pipe
 * nobody writes. Each stopped thread writes "ready <what>\n" to stdout
 * right before it blocks; the test waits for "ready thread" and
 * "ready <scenario>", then for every thread to sleep.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 200
#define BARRIER() __asm__ volatile("" ::: "memory")

static int idle_pipe[2];
/* Never set: the parked loops could end, so no function is noreturn and
 * the compiler keeps every caller's frame (a call to a noreturn function
 * lets it drop the caller's frame or turn the recursion into a loop). */
static volatile int released;

static void announce(const char *what)
{
	char line[64] = "ready ";
	size_t len = strlen(line);
	size_t n = strlen(what);
	if (n > sizeof line - len - 2)
		n = sizeof line - len - 2;
	memcpy(line + len, what, n);
	len += n;
	line[len++] = '\n';
	if (write(1, line, len) != (ssize_t)len)
		_exit(3);
}

/* The known point of the main thread: blocked in pause() forever. */
__attribute__((noinline)) static void park(const char *what)
{
	announce(what);
	while (!released)
		pause();
}

__attribute__((noinline)) int c(void)
{
	park("chain");
	BARRIER();
	return 1;
}

__attribute__((noinline)) static int cmp(const void *x, const void *y)
{
	int r = c();
	BARRIER();
	return r + (*(const int *)x - *(const int *)y);
}

__attribute__((noinline)) int b(int *values, size_t n)
{
	qsort(values, n, sizeof *values, cmp);
	BARRIER();
	return values[0];
}

__attribute__((noinline)) int a(void)
{
	int values[2] = { 2, 1 };
	int r = b(values, 2);
	BARRIER();
	return r + 1;
}

__attribute__((noinline)) int recurse(int n)
{
	/* A local live across the call: the frame cannot be reused. */
	volatile int here = n;
	if (n == 0) {
		park("recurse");
		return 0;
	}
	int r = recurse(n - 1);
	/* `here` escapes: the frame lives until the call returns. */
	__asm__ volatile("" ::"r"(&here) : "memory");
	return r + here;
}

__attribute__((noinline)) static void on_usr1(int sig)
{
	(void)sig;
	park("signal");
	BARRIER();
}

__attribute__((noinline)) int raise_usr1(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) != 0)
		_exit(4);
	int r = raise(SIGUSR1);
	BARRIER();
	return r;
}

__attribute__((noinline)) unsigned long spin_inner(unsigned long x)
{
	announce("spin");
	while (!released) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		BARRIER();
	}
	return x;
}

__attribute__((noinline)) unsigned long spin_outer(void)
{
	unsigned long r = spin_inner(1);
	BARRIER();
	return r + 1;
}

/* Iterations of one unit of split's work (a few milliseconds of it). */
#define SPLIT_UNIT 100000

__attribute__((noinline)) unsigned long hot_a(unsigned long x)
{
	for (int i = 0; i < 7 * SPLIT_UNIT; i++) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		BARRIER();
	}
	return x;
}

__attribute__((noinline)) unsigned long hot_b(unsigned long x)
{
	for (int i = 0; i < 3 * SPLIT_UNIT; i++) {
		x = x * 6364136223846793005UL + 1442695040888963407UL;
		BARRIER();
	}
	return x;
}

__attribute__((noinline)) unsigned long split_work(void)
{
	unsigned long x = 1;
	announce("split");
	while (!released) {
		x = hot_a(x);
		x = hot_b(x);
		BARRIER();
	}
	return x;
}

__attribute__((noinline)) ssize_t read_zero_loop(void)
{
	static char buf[64 << 10];
	ssize_t total = 0;
	int fd = open("/dev/zero", O_RDONLY);
	if (fd < 0)
		_exit(7);
	announce("syscalls");
	while (!released) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n <= 0)
			_exit(8);
		total += n;
		BARRIER();
	}
	return total;
}

/* Reads the clock forever: clock_gettime, or gettimeofday if `tod`. */
__attribute__((noinline)) unsigned long clock_inner(int tod)
{
	unsigned long sum = 0;
	announce(tod ? "tod" : "clock");
	while (!released) {
		if (tod) {
			struct timeval tv;
			gettimeofday(&tv, NULL);
			sum += (unsigned long)tv.tv_usec;
		} else {
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			sum += (unsigned long)ts.tv_nsec;
		}
		BARRIER();
	}
	return sum;
}

__attribute__((noinline)) unsigned long clock_outer(int tod)
{
	unsigned long r = clock_inner(tod);
	BARRIER();
	return r + 1;
}

/* The known point of the second thread: blocked in read(). */
__attribute__((noinline)) ssize_t blocked_in_read(void)
{
	char byte;
	announce("thread");
	ssize_t r = read(idle_pipe[0], &byte, 1);
	BARRIER();
	return r;
}

__attribute__((noinline)) static void *reader(void *arg)
{
	(void)arg;
	while (!released)
		blocked_in_read();
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t thread;
	if (argc != 2)
		return 2;
	/* The write end stays open: read() blocks instead of seeing EOF. */
	if (pipe(idle_pipe) != 0)
		return 5;
	if (pthread_create(&thread, NULL, reader, NULL) != 0)
		return 6;
	int r;
	if (strcmp(argv[1], "chain") == 0)
		r = a();
	else if (strcmp(argv[1], "recurse") == 0)
		r = recurse(DEPTH);
	else if (strcmp(argv[1], "signal") == 0)
		r = raise_usr1();
	else if (strcmp(argv[1], "spin") == 0)
		r = (int)spin_outer();
	else if (strcmp(argv[1], "split") == 0)
		r = (int)split_work();
	else if (strcmp(argv[1], "syscalls") == 0)
		r = (int)read_zero_loop();
	else if (strcmp(argv[1], "clock") == 0)
		r = (int)clock_outer(0);
	else if (strcmp(argv[1], "tod") == 0)
		r = (int)clock_outer(1);
	else
		return 2;
	BARRIER();
	return r;
}

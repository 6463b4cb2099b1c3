/*
 * A C++ program that stops at a known point for tests/eim/stack, through
 * the names C++ mangles: a namespace, a class template's member, a
 * function template, a lambda called by std::for_each, and a function
 * with internal linkage. main -> run_all<int> -> std::for_each -> the
 * lambda -> shapes::Holder<int>::visit -> park, which blocks in pause().
 * A second thread blocks in read() on a pipe nobody writes.
 *
 * Built by the test with `c++ -O2 -g -fomit-frame-pointer`: the debug
 * information names the frames as gdb does (and has inlined frames);
 * each stopped thread writes "ready <what>" right before it blocks.
 */
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <pthread.h>
#include <unistd.h>
#include <vector>

#define BARRIER() __asm__ volatile("" ::: "memory")

static int idle_pipe[2];
static volatile int released;

static void announce(const char *what)
{
	char line[64];
	int n = std::snprintf(line, sizeof line, "ready %s\n", what);
	if (n <= 0 || write(1, line, (size_t)n) != n)
		_exit(3);
}

__attribute__((noinline)) static void park(const char *what)
{
	announce(what);
	while (!released)
		pause();
}

namespace shapes {
template <typename T> struct Holder {
	T value;
	__attribute__((noinline)) T visit(T by)
	{
		if (value == 2)
			park("cpp");
		BARRIER();
		return value + by;
	}
};
} // namespace shapes

template <typename T> __attribute__((noinline)) T run_all(const std::vector<T> &values)
{
	T total = 0;
	std::for_each(values.begin(), values.end(), [&total](T v) {
		shapes::Holder<T> h{v};
		total += h.visit(v);
		BARRIER();
	});
	BARRIER();
	return total;
}

__attribute__((noinline)) ssize_t blocked_in_read(void)
{
	char byte;
	announce("thread");
	ssize_t r = read(idle_pipe[0], &byte, 1);
	BARRIER();
	return r;
}

static void *reader(void *)
{
	while (!released)
		blocked_in_read();
	return nullptr;
}

int main()
{
	if (pipe(idle_pipe) != 0)
		return 2;
	pthread_t t;
	if (pthread_create(&t, nullptr, reader, nullptr) != 0)
		return 2;
	std::vector<int> values{1, 2, 3};
	return run_all(values) == 0;
}

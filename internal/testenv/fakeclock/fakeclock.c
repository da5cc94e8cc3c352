/*
 * fakeclock: an LD_PRELOAD library that steps a server's wall clock by an
 * offset the test rewrites while the server runs (testenv.FakeClock).
 *
 * SLUICE_FAKECLOCK_FILE names a file of 8 bytes, a little-endian int64 of
 * nanoseconds; it is mapped shared at load, so a rewrite is seen by the next
 * clock read, without a restart and without a read per call. Only the wall
 * clocks move (CLOCK_REALTIME and its coarse variant, gettimeofday, time):
 * a real NTP step moves those and leaves CLOCK_MONOTONIC alone.
 *
 * Why not libfaketime: redis-server is linked with jemalloc, and
 * libfaketime's start-up (dlsym, which allocates) re-enters its own
 * clock_gettime through jemalloc's initialisation: the server hangs at
 * start. This library resolves nothing and allocates nothing: it reads the
 * real clocks with the clock_gettime system call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_ns;

__attribute__((constructor)) static void fakeclock_init(void) {
	const char *p = getenv("SLUICE_FAKECLOCK_FILE");
	if (p == NULL) {
		return;
	}
	int fd = open(p, O_RDONLY);
	if (fd < 0) {
		return;
	}
	void *m = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m != MAP_FAILED) {
		offset_ns = m;
	}
}

static int64_t offset(void) {
	return offset_ns == NULL ? 0 : *offset_ns;
}

static int real_clock_gettime(clockid_t clk, struct timespec *ts) {
	return (int)syscall(SYS_clock_gettime, clk, ts);
}

static void shift(struct timespec *ts) {
	int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();
	ts->tv_sec = ns / 1000000000;
	ts->tv_nsec = ns % 1000000000;
	if (ts->tv_nsec < 0) {
		ts->tv_nsec += 1000000000;
		ts->tv_sec--;
	}
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
	int rc = real_clock_gettime(clk, ts);
	if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
		shift(ts);
	}
	return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
	(void)tz;
	struct timespec ts;
	if (real_clock_gettime(CLOCK_REALTIME, &ts) != 0) {
		return -1;
	}
	shift(&ts);
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	if (real_clock_gettime(CLOCK_REALTIME, &ts) != 0) {
		return (time_t)-1;
	}
	shift(&ts);
	if (t != NULL) {
		*t = ts.tv_sec;
	}
	return ts.tv_sec;
}

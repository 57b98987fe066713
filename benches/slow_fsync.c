/* A slower disk's flush, for benches/slow-disk.sh: preloaded into a process
 * (LD_PRELOAD), it makes fdatasync and fsync return SLOW_FSYNC_US
 * microseconds after the real call does, the thread asleep meanwhile, as a
 * thread waiting on a slow device sleeps. The real call still runs, so the
 * data is as durable as without the shim and the kernel's work for the
 * flush is unchanged; only the wait grows. Unset or 0: no delay.
 *
 *   cc -O2 -shared -fPIC -o slow_fsync.so benches/slow_fsync.c -ldl
 *   SLOW_FSYNC_US=1000 LD_PRELOAD=$PWD/slow_fsync.so retry-budget ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

static long delay_ns;
static int (*real_fdatasync)(int);
static int (*real_fsync)(int);

__attribute__((constructor)) static void slow_fsync_init(void) {
  const char *us = getenv("SLOW_FSYNC_US");
  delay_ns = us ? strtol(us, NULL, 10) * 1000L : 0;
  real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
}

/* The real call, then the device's extra wait, the call's errno kept. */
static int slowed(int (*call)(int), int fd) {
  int r = call(fd);
  int saved = errno;
  if (delay_ns > 0) {
    struct timespec left = {delay_ns / 1000000000L, delay_ns % 1000000000L};
    while (nanosleep(&left, &left) == -1 && errno == EINTR) {
    }
  }
  errno = saved;
  return r;
}

int fdatasync(int fd) { return slowed(real_fdatasync, fd); }

int fsync(int fd) { return slowed(real_fsync, fd); }

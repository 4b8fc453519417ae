/* An LD_PRELOAD shim that takes the shard stores' WAL fsyncs off the disk, to bound what any
 * receiver-side deferral of them could give the delay-mode insert tail (issue 3; BENCHMARKS.md,
 * "Insert latency", "The upper bound of deferring the receivers' fsyncs"). An experiment only:
 * with it, rows on the replicas are NOT durable when a node acknowledges them.
 *
 *   gcc -O2 -shared -fPIC -o /tmp/store_fsync_shim.so bench/store_fsync_shim.c -ldl -lpthread
 *   SW_SHIM=skip LD_PRELOAD=/tmp/store_fsync_shim.so shardwise bench insert --count 20000
 *   SW_SHIM=aligned SW_SHIM_MS=3000 LD_PRELOAD=... shardwise bench insert --count 20000
 *
 * Only processes whose command line holds " node " (the nodes the benchmark starts) are changed.
 * It catches fdatasync(2) on files whose path holds "/wal/wal-" and not "/outbox/" (a shard
 * store's WAL segment; the outbox's log is left alone, as are parts and metadata):
 *   skip     returns 0 without syncing (no receiver fsync at all: the bound);
 *   aligned  returns 0 and keeps a dup of the descriptor; a thread fdatasyncs every kept one at
 *            each wall-clock multiple of SW_SHIM_MS ms, so all nodes' stores sync together.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <time.h>
#include <errno.h>
static int mode = 0; /* 0 off, 1 skip, 2 aligned */
static long period_ms = 2000;
#define MAXFD 4096
static int pending[MAXFD]; static int npending = 0;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int (*real_fdatasync)(int) = 0;
static int is_store_wal(int fd) {
  char p[64], buf[4096]; snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(p, buf, sizeof buf - 1); if (n <= 0) return 0; buf[n] = 0;
  return strstr(buf, "/wal/wal-") && !strstr(buf, "/outbox/");
}
static void *syncer(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
    long long now_ms = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
    long long next = (now_ms / period_ms + 1) * period_ms;
    usleep((next - now_ms) * 1000);
    int fds[MAXFD]; int n;
    pthread_mutex_lock(&mu); n = npending; memcpy(fds, pending, n * sizeof(int)); npending = 0; pthread_mutex_unlock(&mu);
    for (int i = 0; i < n; i++) { real_fdatasync(fds[i]); close(fds[i]); }
  }
  return 0;
}
__attribute__((constructor)) static void init(void) {
  real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
  const char *m = getenv("SW_SHIM"); if (!m) return;
  char cmd[256] = {0}; FILE *f = fopen("/proc/self/cmdline", "r");
  if (f) { size_t k = fread(cmd, 1, sizeof cmd - 1, f); fclose(f); for (size_t i = 0; i < k; i++) if (!cmd[i]) cmd[i] = ' '; }
  if (!strstr(cmd, " node ")) return;
  if (!strcmp(m, "skip")) mode = 1;
  else if (!strcmp(m, "aligned")) { mode = 2; const char *p = getenv("SW_SHIM_MS"); if (p) period_ms = atol(p);
    pthread_t t; pthread_create(&t, 0, syncer, 0); }
}
int fdatasync(int fd) {
  if (!real_fdatasync) real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
  if (mode && is_store_wal(fd)) {
    if (mode == 1) return 0;
    int d = dup(fd); if (d < 0) return real_fdatasync(fd);
    pthread_mutex_lock(&mu);
    if (npending < MAXFD) { pending[npending++] = d; pthread_mutex_unlock(&mu); return 0; }
    pthread_mutex_unlock(&mu); close(d); return real_fdatasync(fd);
  }
  return real_fdatasync(fd);
}

/* src/mem: the ledger of arena bytes and descriptors (ledger.h).
 *
 * Each charge is a compare-and-swap on the device's counter that never
 * lets it pass the budget, so concurrent workers cannot overshoot it
 * together. Contracts of the non-static functions: ledger.h.
 */
#include "mem/ledger.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fail.h"
#include "st/errors.h"

/* Rounds of "reclaim, try again" before a charge is refused: another
 * worker may take the room a reclaim made. */
#define RECLAIM_ROUNDS 4

static atomic_uint_fast64_t budget[ST_LEDGER_SLOTS];
static atomic_uint_fast64_t used[ST_LEDGER_SLOTS];
static atomic_uint_fast64_t fds_used;
static atomic_uint_fast64_t fd_cap;
static atomic_uint_fast64_t refusals;

static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static st__ledger_reclaim_fn hook_fn;
static void *hook_ctx;

/* The slot of a device, or -1 for one the ledger does not track. */
static int slot_of(int device) {
  if (device < 0) return 0;
  return device + 1 < ST_LEDGER_SLOTS ? device + 1 : -1;
}

/* "cpu" or "cuda:N". */
static void device_name(int device, char *out, size_t len) {
  if (device < 0) snprintf(out, len, "cpu");
  else snprintf(out, len, "cuda:%d", device);
}

void st__ledger_set_budget(int device, uint64_t bytes) {
  int s = slot_of(device);
  if (s >= 0) atomic_store(&budget[s], bytes);
}

void st__ledger_set_fd_cap(uint64_t fds) { atomic_store(&fd_cap, fds); }

void st__ledger_set_reclaim(st__ledger_reclaim_fn fn, void *ctx) {
  pthread_mutex_lock(&hook_mu);
  hook_fn = fn;
  hook_ctx = ctx;
  pthread_mutex_unlock(&hook_mu);
}

/* Adds n to *counter unless that passes cap (0: no cap). 1 when added. */
static int take(atomic_uint_fast64_t *counter, uint64_t n, uint64_t cap) {
  uint_fast64_t cur = atomic_load(counter);
  do {
    if (cap && (n > cap || cur > cap - n)) return 0;
  } while (!atomic_compare_exchange_weak(counter, &cur, cur + n));
  return 1;
}

/* Both parts of a charge, or neither. 0 when bytes did not fit, -1 when
 * descriptors did not, 1 when charged. */
static int try_charge(int s, uint64_t bytes, unsigned fds) {
  if (s >= 0 && !take(&used[s], bytes, atomic_load(&budget[s]))) return 0;
  if (fds && !take(&fds_used, fds, atomic_load(&fd_cap))) {
    if (s >= 0) atomic_fetch_sub(&used[s], bytes);
    return -1;
  }
  return 1;
}

/* Charges bytes and descriptors; see ledger.h. */
int st__ledger_charge(int device, uint64_t bytes, unsigned fds, char *err, size_t errlen) {
  int s = slot_of(device);
  int got = try_charge(s, bytes, fds);
  /* Larger than the whole budget (or cap): no eviction can help. */
  uint64_t b = s >= 0 ? atomic_load(&budget[s]) : 0, cap = atomic_load(&fd_cap);
  int hopeless = (b && bytes > b) || (cap && fds > cap);
  for (int round = 0; got != 1 && !hopeless && round < RECLAIM_ROUNDS; round++) {
    pthread_mutex_lock(&hook_mu);
    st__ledger_reclaim_fn fn = hook_fn;
    void *ctx = hook_ctx;
    pthread_mutex_unlock(&hook_mu);
    if (!fn || !fn(ctx, device, bytes, fds)) break;
    got = try_charge(s, bytes, fds);
  }
  if (got == 1) return ST_OK;
  atomic_fetch_add(&refusals, 1);
  if (got < 0)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "%llu of %llu arena descriptors in use by objects, task results and "
                    "replies the server still holds, after evicting what the cache could give "
                    "(limits.max_arena_fds sets the cap)",
                    (unsigned long long)atomic_load(&fds_used),
                    (unsigned long long)atomic_load(&fd_cap));
  char name[24], key[48];
  device_name(device, name, sizeof name);
  if (device < 0) snprintf(key, sizeof key, "memory_budget.cpu");
  else snprintf(key, sizeof key, "memory_budget[\"%s\"]", name);
  if (bytes > b)
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen,
                    "an allocation of %llu bytes on %s is larger than its memory budget of "
                    "%llu bytes (%s sets it)",
                    (unsigned long long)bytes, name, (unsigned long long)b, key);
  return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen,
                  "an allocation of %llu bytes on %s does not fit its memory budget: %llu of "
                  "%llu bytes in use by objects, published keys, task results, replies and "
                  "running calls, after evicting what the cache could give (%s sets it)",
                  (unsigned long long)bytes, name, (unsigned long long)atomic_load(&used[s]),
                  (unsigned long long)b, key);
}

void st__ledger_discharge(int device, uint64_t bytes, unsigned fds) {
  int s = slot_of(device);
  if (s >= 0 && bytes) atomic_fetch_sub(&used[s], bytes);
  if (fds) atomic_fetch_sub(&fds_used, fds);
}

int st__ledger_fits(int device, uint64_t bytes, unsigned fds) {
  int s = slot_of(device);
  if (s >= 0) {
    uint64_t b = atomic_load(&budget[s]), u = atomic_load(&used[s]);
    if (b && (bytes > b || u > b - bytes)) return 0;
  }
  uint64_t cap = atomic_load(&fd_cap), n = atomic_load(&fds_used);
  return !(fds && cap && (fds > cap || n > cap - fds));
}

void st__ledger_stats(int device, st__ledger_stats_t *out) {
  memset(out, 0, sizeof *out);
  int s = slot_of(device);
  if (s >= 0) {
    out->budget = atomic_load(&budget[s]);
    out->used = atomic_load(&used[s]);
  }
  out->fds = atomic_load(&fds_used);
  out->fd_cap = atomic_load(&fd_cap);
  out->refusals = atomic_load(&refusals);
}

/* ------------------------------------------------------------ host memory */

/* A byte count from a cgroup file: "max", or a figure at or above 2^60
 * (v1 writes "unlimited" as a page-rounded LLONG_MAX), is no limit (0). */
static uint64_t read_limit(const char *dir, const char *file) {
  char path[4200], text[64] = "";
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  if (!fgets(text, sizeof text, f)) text[0] = '\0';
  fclose(f);
  char *end = NULL;
  unsigned long long v = strtoull(text, &end, 10);
  if (end == text || v >= (1ull << 60)) return 0;
  return (uint64_t)v;
}

/* The memory hierarchy this process is in: the directory of its cgroup
 * (under the mount point; the mount point itself when the cgroup's path is
 * not visible, as in a namespaced container) and the mount point. v2 when
 * *v2 is set. 0 when none was found. */
static int find_cgroup(char *leaf, size_t leaflen, char *mnt, size_t mntlen, int *v2) {
  char line[4096], path1[2048] = "", path2[2048] = "";
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f) return 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *ctl = c1 + 1;
    if (!ctl[0] && strncmp(line, "0:", 2) == 0) snprintf(path2, sizeof path2, "%s", c2 + 1);
    char list[512];
    snprintf(list, sizeof list, ",%s,", ctl);
    if (strstr(list, ",memory,")) snprintf(path1, sizeof path1, "%s", c2 + 1);
  }
  fclose(f);
  f = fopen("/proc/self/mountinfo", "re");
  if (!f) return 0;
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    char root[2048], point[2048];
    const char *dash = strstr(line, " - ");
    char fstype[64] = "", super[1024] = "";
    if (!dash || sscanf(line, "%*s %*s %*s %2047s %2047s", root, point) != 2 ||
        sscanf(dash + 3, "%63s %*s %1023s", fstype, super) < 1)
      continue;
    char opts[1100];
    snprintf(opts, sizeof opts, ",%s,", super);
    const char *path;
    if (strcmp(fstype, "cgroup2") == 0 && path2[0] && !path1[0]) {
      *v2 = 1;
      path = path2;
    } else if (strcmp(fstype, "cgroup") == 0 && path1[0] && strstr(opts, ",memory,")) {
      *v2 = 0;
      path = path1;
    } else {
      continue;
    }
    size_t rl = strcmp(root, "/") == 0 ? 0 : strlen(root);
    const char *rel = strncmp(path, root, rl) == 0 ? path + rl : path;
    snprintf(mnt, mntlen, "%s", point);
    snprintf(leaf, leaflen, "%s%s", point, strcmp(rel, "/") == 0 ? "" : rel);
    if (access(leaf, R_OK) != 0) snprintf(leaf, leaflen, "%s", point);
    found = 1;
  }
  fclose(f);
  return found;
}

static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static uint64_t host_bytes;
static char host_source[4200];

static void probe_host(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  host_bytes = (uint64_t)pages * (uint64_t)page;
  snprintf(host_source, sizeof host_source, "physical memory");
  char leaf[4096], mnt[2048];
  int v2 = 0;
  if (!find_cgroup(leaf, sizeof leaf, mnt, sizeof mnt, &v2)) return;
  /* The limit of every ancestor applies too: walk up to the mount point. */
  size_t ml = strlen(mnt);
  for (;;) {
    uint64_t lim = v2 ? read_limit(leaf, "memory.max") : read_limit(leaf, "memory.limit_in_bytes");
    uint64_t high = v2 ? read_limit(leaf, "memory.high") : 0;
    if (high && (!lim || high < lim)) lim = high;
    if (lim && lim < host_bytes) {
      host_bytes = lim;
      snprintf(host_source, sizeof host_source, "cgroup %s", leaf);
    }
    char *slash = strrchr(leaf, '/');
    if (strlen(leaf) <= ml || !slash || (size_t)(slash - leaf) < ml) break;
    *slash = '\0';
  }
}

uint64_t st__ledger_host_memory(char *source, size_t len) {
  pthread_once(&host_once, probe_host);
  if (source && len) snprintf(source, len, "%s", host_source);
  return host_bytes;
}

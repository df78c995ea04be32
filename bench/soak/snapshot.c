/* bench/soak: see snapshot.h. */
#include "snapshot.h"

#include "proc.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances of the flatness rule (besides --rss-tol-mb). */
#define SHMEM_TOL_KB 1024L
#define DEVICE_TOL_BYTES (4LL << 20)

static int64_t value_at(const st_value_t *v, const char *const *keys) {
  for (; v && *keys; keys++) v = st_value_get(v, *keys);
  return v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
}

int64_t sk_info_path(st_client_t *c, const char *const *keys) {
  st_result_t *r = NULL;
  if (st_client_info(c, &r) != ST_OK) return -1;
  int64_t n = value_at(st_result_value(r), keys);
  st_result_free(r);
  return n;
}

/* "VmRSS:" and "RssShmem:" of /proc/PID/status, in kB. */
static void status_kb(pid_t pid, long *rss, long *shmem) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  *rss = *shmem = -1;
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "VmRSS:", 6)) *rss = atol(line + 6);
    else if (!strncmp(line, "RssShmem:", 9)) *shmem = atol(line + 9);
  }
  fclose(f);
}

static long smi_used_mb(void) {
  FILE *p = popen("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 "
                  "2>/dev/null", "r");
  if (!p) return -1;
  long mb = -1;
  if (fscanf(p, "%ld", &mb) != 1) mb = -1;
  pclose(p);
  return mb;
}

static void take(st_client_t *mon, const stt_server_t *s, sk_snapshot_t *x) {
  memset(x, 0, sizeof *x);
  x->fds = stt_proc_fd_count(s->pid);
  status_kb(s->pid, &x->rss_kb, &x->shmem_kb);
  st_result_t *r = NULL;
  const st_value_t *v = st_client_info(mon, &r) == ST_OK ? st_result_value(r) : NULL;
  x->arenas = value_at(v, (const char *const[]){"arenas", "count", NULL});
  x->arena_bytes = value_at(v, (const char *const[]){"arenas", "bytes", NULL});
  x->objects = value_at(v, (const char *const[]){"objects", "count", NULL});
  x->object_bytes = value_at(v, (const char *const[]){"objects", "bytes", NULL});
  x->pool_bytes = value_at(v, (const char *const[]){"memory", "cpu", "pool_bytes", NULL});
  x->used_bytes = value_at(v, (const char *const[]){"memory", "cpu", "used_bytes", NULL});
  x->keys = value_at(v, (const char *const[]){"keys", "count", NULL});
  x->key_versions = value_at(v, (const char *const[]){"keys", "versions", NULL});
  x->key_bytes = value_at(v, (const char *const[]){"keys", "bytes", NULL});
  x->held_fds = value_at(v, (const char *const[]){"held", "fds", NULL});
  x->held_bytes = value_at(v, (const char *const[]){"held", "bytes", NULL});
  const st_value_t *h = v ? st_value_get(v, "holdings") : NULL;
  x->holdings = h && h->kind == ST_VALUE_ARRAY ? (int64_t)h->as.array.len : -1;
  x->dev_free = value_at(v, (const char *const[]){"memory", "cuda:0", "free_bytes", NULL});
  int cuda = value_at(v, (const char *const[]){"cuda", "devices", NULL}) > 0;
  st_result_free(r);
  x->buffers = -1;
  if (st_client_rpc(mon, "buffers", NULL, &r) == ST_OK && st_result_value(r)->kind == ST_VALUE_ARRAY)
    x->buffers = (int64_t)st_result_value(r)->as.array.len;
  st_result_free(r);
  x->smi_used_mb = cuda ? smi_used_mb() : -1;
}

/* The string member `field` of each map of the ARRAY a method returns
 * whose value starts with "soak.", passed to `drop`; returns how many
 * were dropped, -1 when the list failed. */
static int drop_named(st_client_t *mon, st_result_t *list, const char *field,
                      int (*drop)(st_client_t *, const char *)) {
  const st_value_t *v = list ? st_result_value(list) : NULL;
  if (!v || v->kind != ST_VALUE_ARRAY) return -1;
  int n = 0;
  for (size_t i = 0; i < v->as.array.len; i++) {
    const st_value_t *name = st_value_get(&v->as.array.items[i], field);
    if (!name || name->kind != ST_VALUE_STRING || strncmp(name->as.str.ptr, "soak.", 5)) continue;
    if (drop(mon, name->as.str.ptr) == ST_OK) n++;
    else printf("soak: cannot remove '%s': %s\n", name->as.str.ptr, st_client_error(mon));
  }
  return n;
}

/* Removes what the load left named: keys (put and live) and buffers. */
static void remove_named(st_client_t *mon) {
  st_result_t *r = NULL;
  int keys = st_client_keys(mon, "soak.", &r) == ST_OK ? drop_named(mon, r, "key", st_client_delete)
                                                         : -1;
  st_result_free(r);
  r = NULL;
  int bufs = st_client_rpc(mon, "buffers", NULL, &r) == ST_OK
                 ? drop_named(mon, r, "name", st_buffer_unlink) : -1;
  st_result_free(r);
  printf("soak: removed what the load left named: %d keys, %d buffers\n", keys, bufs);
}

/* What must come back to the start once the server is idle. */
static int differs(const sk_snapshot_t *a, const sk_snapshot_t *b) {
  return a->fds != b->fds || a->arenas != b->arenas || a->objects != b->objects ||
         a->pool_bytes != b->pool_bytes || a->held_fds != b->held_fds ||
         a->used_bytes != b->used_bytes;
}

static int idle(st_client_t *mon) {
  st_result_t *r = NULL;
  if (st_client_info(mon, &r) != ST_OK) return 0;
  const st_value_t *v = st_result_value(r);
  int yes = value_at(v, (const char *const[]){"connections", NULL}) == 1 &&
            value_at(v, (const char *const[]){"inflight", NULL}) == 0 &&
            value_at(v, (const char *const[]){"waiting", NULL}) == 0 &&
            value_at(v, (const char *const[]){"tasks", "total", NULL}) == 0;
  st_result_free(r);
  return yes;
}

int sk_settle(st_client_t *mon, const stt_server_t *s, const sk_snapshot_t *start,
              sk_snapshot_t *out) {
  int rc = 0;
  double end = stt_now_ms() + 60000;
  while (!idle(mon) && stt_now_ms() < end) stt_sleep_ms(100);
  if (!idle(mon)) {
    printf("soak: the server is not idle after 60 s\n");
    rc = -1;
  }
  static const char *const cached[] = {"soak_cached", "soak_managed"};
  for (int i = 0; i < 2; i++)
    if (st_client_invalidate_endpoint(mon, cached[i], NULL) != ST_OK)
      printf("soak: invalidate %s: %s\n", cached[i], st_client_error(mon));
  take(mon, s, out);
  printf("soak: named before removal: keys %lld (%lld versions, %lld B), buffers %lld\n",
         (long long)out->keys, (long long)out->key_versions, (long long)out->key_bytes,
         (long long)out->buffers);
  remove_named(mon);
  take(mon, s, out);
  end = stt_now_ms() + 30000;
  while (start && differs(out, start) && stt_now_ms() < end) {
    stt_sleep_ms(200);
    take(mon, s, out);
  }
  return rc;
}

void sk_snapshot_print(const char *label, const sk_snapshot_t *x) {
  printf("soak: %-5s fds %d, RSS %ld kB, RssShmem %ld kB, arenas %lld (%lld B), objects %lld "
         "(%lld B)", label, x->fds, x->rss_kb, x->shmem_kb, (long long)x->arenas,
         (long long)x->arena_bytes, (long long)x->objects, (long long)x->object_bytes);
  printf(", pool %lld B, CPU used %lld B, keys %lld (%lld versions, %lld B), buffers %lld, "
         "held %lld fds (%lld B), holdings %lld connections", (long long)x->pool_bytes,
         (long long)x->used_bytes, (long long)x->keys, (long long)x->key_versions,
         (long long)x->key_bytes, (long long)x->buffers, (long long)x->held_fds,
         (long long)x->held_bytes, (long long)x->holdings);
  if (x->dev_free >= 0) printf(", device free %lld B", (long long)x->dev_free);
  if (x->smi_used_mb >= 0) printf(", nvidia-smi used %ld MiB", x->smi_used_mb);
  printf("\n");
}

typedef struct totals {
  long sent, answered, lost, wrong, local, killed_inflight, errors[SK_NERR], ops[SK_NOPS];
  long hist[SK_NHIST], pings;
} totals_t;

/* Sums the slots. A killed process's unanswered requests are not lost
 * (nobody was waiting); any other process's are. */
static void sum(sk_shared_t *sh, int nslots, totals_t *t) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < nslots; i++) {
    sk_slot_t *s = &sh->slots[i];
    long sent = atomic_load(&s->sent), ans = atomic_load(&s->answered);
    long lost = atomic_load(&s->lost), open = sent - ans - lost;
    t->sent += sent;
    t->answered += ans;
    t->lost += lost;
    t->wrong += atomic_load(&s->wrong);
    t->local += atomic_load(&s->local);
    if (atomic_load(&s->state) == SK_KILLED) t->killed_inflight += open;
    else if (atomic_load(&s->state) != SK_RUNNING) t->lost += open;
    for (int k = 0; k < SK_NERR; k++) t->errors[k] += atomic_load(&s->errors[k]);
    for (int k = 0; k < SK_NOPS; k++) t->ops[k] += atomic_load(&s->ops[k]);
    for (int k = 0; k < SK_NHIST; k++) {
      long n = atomic_load(&s->ping_hist[k]);
      t->hist[k] += n;
      t->pings += n;
    }
  }
}

long sk_progress(st_client_t *mon, const stt_server_t *s, sk_shared_t *sh, int nslots,
                 double t_s) {
  totals_t t;
  sum(sh, nslots, &t);
  long rss, shmem;
  status_kb(s->pid, &rss, &shmem);
  printf("soak: %6.0f s  connections %lld  sent %ld  answered %ld  lost %ld  fds %d  RSS %ld kB"
         "  arenas %lld  keys %lld  pool %lld B\n", t_s, (long long)sk_info_int(mon, "connections"),
         t.sent, t.answered, t.lost, stt_proc_fd_count(s->pid), rss,
         (long long)sk_info_int(mon, "arenas", "count"), (long long)sk_info_int(mon, "keys", "count"),
         (long long)sk_info_int(mon, "memory", "cpu", "pool_bytes"));
  return rss;
}

static double percentile(const totals_t *t, double q) {
  long want = (long)(q * (double)t->pings), seen = 0;
  for (int k = 0; k < SK_NHIST; k++)
    if ((seen += t->hist[k]) > want) return sk_hist_upper(k);
  return 0;
}

/* Prints one rule and returns whether it holds. */
static int rule(const char *what, long long start, long long end, long long tol, int holds) {
  printf("soak:   %-4s %-28s start %-12lld end %-12lld tolerance %lld\n", holds ? "ok" : "FAIL",
         what, start, end, tol);
  return holds;
}

int sk_report(sk_shared_t *sh, int nslots, double load_s, const sk_snapshot_t *start,
              const sk_snapshot_t *end, long mid_rss_kb, double rss_tol_mb) {
  static const char *const op_names[SK_NOPS] = {
      "ping", "fresh", "cached", "lease", "targ", "task", "invalidate", "put", "get",
      "live_pub", "live_read", "buf_write", "buf_read", "handoff", "cuda", "targ_cuda"};
  totals_t t;
  sum(sh, nslots, &t);
  printf("soak: requests sent %ld, answered %ld, lost %ld, unanswered in killed clients %ld, "
         "wrong replies %ld (%.0f requests/s)\n", t.sent, t.answered, t.lost, t.killed_inflight,
         t.wrong, (double)t.sent / load_s);
  printf("soak: waits, reads and writes of shared pages (no request): %ld\n", t.local);
  printf("soak: operations:");
  for (int k = 0; k < SK_NOPS; k++) printf(" %s %ld", op_names[k], t.ops[k]);
  printf("\nsoak: error replies:");
  int any = 0;
  for (int k = 1; k < SK_NERR; k++)
    if (t.errors[k]) printf(" %s %ld", st_err_name(-k), t.errors[k]), any = 1;
  printf("%s\n", any ? "" : " none");
  printf("soak: ping under load: p50 %.0f us, p99 %.0f us (%ld pings; bucket upper bounds)\n",
         percentile(&t, 0.50), percentile(&t, 0.99), t.pings);

  long long rss_tol = (long long)(rss_tol_mb * 1024);
  printf("soak: flat = every rule holds once the clients left and the server is idle:\n");
  int pass = 1;
  pass &= rule("server fds", start->fds, end->fds, 0, end->fds == start->fds);
  pass &= rule("arenas", start->arenas, end->arenas, 0, end->arenas == start->arenas);
  pass &= rule("objects", start->objects, end->objects, 0, end->objects == start->objects);
  pass &= rule("pool bytes", start->pool_bytes, end->pool_bytes, 0,
               end->pool_bytes == start->pool_bytes);
  pass &= rule("CPU budget used bytes", start->used_bytes, end->used_bytes, 0,
               end->used_bytes == start->used_bytes);
  pass &= rule("keys", start->keys, end->keys, 0, end->keys == start->keys);
  pass &= rule("buffers", start->buffers, end->buffers, 0, end->buffers == start->buffers);
  pass &= rule("held fds", start->held_fds, end->held_fds, 0, end->held_fds == start->held_fds);
  pass &= rule("held bytes", start->held_bytes, end->held_bytes, 0,
               end->held_bytes == start->held_bytes);
  pass &= rule("holdings (connections)", start->holdings, end->holdings, 0,
               end->holdings == start->holdings);
  pass &= rule("RssShmem kB", start->shmem_kb, end->shmem_kb, SHMEM_TOL_KB,
               end->shmem_kb <= start->shmem_kb + SHMEM_TOL_KB);
  long long rss_ref = mid_rss_kb >= 0 ? mid_rss_kb : start->rss_kb;
  printf("soak:   info RSS kB at the start %ld, halfway %lld\n", start->rss_kb, rss_ref);
  pass &= rule("RSS kB (since halfway)", rss_ref, end->rss_kb, rss_tol,
               end->rss_kb <= rss_ref + rss_tol);
  if (start->dev_free >= 0)
    pass &= rule("device free bytes", start->dev_free, end->dev_free, DEVICE_TOL_BYTES,
                 end->dev_free + DEVICE_TOL_BYTES >= start->dev_free);
  if (start->smi_used_mb >= 0)
    printf("soak:   info nvidia-smi used MiB            start %-12ld end %ld\n",
           start->smi_used_mb, end->smi_used_mb);
  pass &= rule("requests lost", 0, t.lost, 0, t.lost == 0);
  pass &= rule("wrong replies", 0, t.wrong, 0, t.wrong == 0);
  return pass;
}

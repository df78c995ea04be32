/* The transfer helper and its supervisor (src/xfer; docs/multihost.md,
 * "The transfer helper"): two supervisors in this process, each with a
 * helper process of its own (stserver --xfer-helper), move memfd arenas
 * over UCX on loopback (UCX_TLS=tcp, UCX_NET_DEVICES=lo) as two hosts'
 * servers would; concurrent transfers on one worker and kept endpoints;
 * a helper SIGKILLed while its peer waits, an abort (each side tells the
 * other, which ends at once), an
 * arena whose size claim its descriptor does not hold, probes of a
 * missing and of a fake library; and stserver's ELF dynamic section,
 * which must need no engine library. */
#include <ev.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "xfer_kit.h"
#include "common/clock.h"
#include "st/errors.h"
#include "xfer/nccl_api.h"
#include "xfer/supervisor.h"
#include "xfer/ucx_api.h"

/* After ev.h: elf.h defines EV_NONE and EV_CURRENT as macros. */
#include <elf.h>

/* Runs the loop until *flag is nonzero, within a bound. */
static int wait_for(const int *flag) { return wait_for_s(flag, 60); }

typedef struct arena {
  int fd;
  uint8_t *p;
  uint64_t bytes;
} arena_t;

static arena_t arena_new(uint64_t bytes, unsigned seed) {
  arena_t a = {.bytes = bytes};
  a.fd = memfd_create("xfer-test", MFD_CLOEXEC);
  if (a.fd < 0 || ftruncate(a.fd, (off_t)bytes) != 0) abort();
  a.p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
  if (a.p == MAP_FAILED) abort();
  if (seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (uint64_t i = 0; i < bytes; i++) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      a.p[i] = (uint8_t)x;
    }
  }
  return a;
}

static void arena_free(arena_t *a) {
  munmap(a->p, a->bytes);
  close(a->fd);
}

static st__xfer_sup_t *sup_new(const char *ucx_library) {
  st__xfer_sup_config_t cfg = {.exe = server_bin,
                               .ucx_library = ucx_library,
                               .kill_grace = 2,
                               .restart_min = 0.05,
                               .log_level = -1};
  st__xfer_sup_t *s = NULL;
  char err[256];
  if (st__xfer_sup_new(loop, &cfg, &s, err, sizeof err) != ST_OK) {
    fprintf(stderr, "st__xfer_sup_new: %s\n", err);
    abort();
  }
  return s;
}

static void to_sup_arenas(const arena_t *a, size_t n, st__xfer_sup_arena_t *out) {
  for (size_t i = 0; i < n; i++)
    out[i] = (st__xfer_sup_arena_t){.fd = a[i].fd, .bytes = a[i].bytes};
}

/* One UCX transfer of src[] on A into dst[] on B; fills *s and *r. */
static int ucx_move(st__xfer_sup_t *a, st__xfer_sup_t *b, const arena_t *src, const arena_t *dst,
                    size_t n, uint32_t timeout_ms, side_t *s, side_t *r) {
  char err[256];
  uint64_t xs, xr;
  memset(s, 0, sizeof *s);
  memset(r, 0, sizeof *r);
  if (st__xfer_sup_open(a, "ucx", ST_XFER_SEND, 2, 0, timeout_ms, &cbs, s, &xs, err, sizeof err) ||
      st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, timeout_ms, &cbs, r, &xr, err, sizeof err)) {
    fprintf(stderr, "open: %s\n", err);
    return -1;
  }
  if (!wait_for(&s->opened) || !wait_for(&r->opened)) return -1;
  st__xfer_sup_arena_t sa[8], ra[8];
  to_sup_arenas(src, n, sa);
  to_sup_arenas(dst, n, ra);
  if (st__xfer_sup_start(b, xr, s->blob, s->blob_len, ra, n, err, sizeof err) ||
      st__xfer_sup_start(a, xs, r->blob, r->blob_len, sa, n, err, sizeof err)) {
    fprintf(stderr, "start: %s\n", err);
    return -1;
  }
  if (!wait_for(&s->done) || !wait_for(&r->done)) return -1;
  return 0;
}

static void require_ucx(void) {
  st__xfer_probe_t p;
  if (st__ucx_probe(NULL, &p) != ST_OK) {
    char why[400];
    snprintf(why, sizeof why, "UCX unavailable: %s", p.reason);
    stt_skip(why);
  }
}

TEST(ucx_three_arenas_every_byte) {
  st__xfer_sup_t *a = sup_new(NULL), *b = sup_new(NULL);
  const uint64_t sizes[3] = {1024, (1u << 20) + 13, 64u << 20};
  arena_t src[3], dst[3];
  uint64_t total = 0;
  for (int i = 0; i < 3; i++) {
    src[i] = arena_new(sizes[i], (unsigned)i + 1);
    dst[i] = arena_new(sizes[i], 0);
    total += sizes[i];
  }
  side_t s, r;
  int rc = ucx_move(a, b, src, dst, 3, 60000, &s, &r);
  CHECK_EQ_INT(rc, 0);
  if (!s.ok || !r.ok) fprintf(stderr, "sender: %s\nreceiver: %s\n", s.error, r.error);
  CHECK(s.ok && r.ok);
  CHECK_EQ_INT(s.done, 1);
  CHECK_EQ_INT(r.done, 1);
  CHECK_EQ_INT(r.bytes, total);
  CHECK_EQ_INT(s.bytes, total);
  for (int i = 0; i < 3; i++) CHECK(memcmp(src[i].p, dst[i].p, sizes[i]) == 0);
  /* The helpers let go of the arenas before done: the fds are ours. */
  for (int i = 0; i < 3; i++) {
    arena_free(&src[i]);
    arena_free(&dst[i]);
  }
  CHECK_EQ_INT(st__xfer_sup_spawns(a), 1);
  st__xfer_sup_free(a);
  st__xfer_sup_free(b);
}

/* One helper runs every transfer on one UCX worker and keeps its endpoint
 * to a peer between transfers: six transfers at once between the same
 * two helpers, four one way and two the other, each with bytes of its
 * own, land each in its own arena (the transfers' tags keep them apart);
 * then twenty in a row on the kept endpoints, every byte compared. */
TEST(ucx_concurrent_transfers_keep_apart) {
  st__xfer_sup_t *a = sup_new(NULL), *b = sup_new(NULL);
  enum { N = 6 };
  arena_t src[N], dst[N];
  side_t s[N], r[N];
  uint64_t xs[N], xr[N];
  char err[256];
  for (int i = 0; i < N; i++) {
    uint64_t bytes = ((uint64_t)(i + 1) << 20) + 7u * (uint64_t)i;   /* chunks of 8 MiB: one each */
    if (i == 5) bytes = (20u << 20) + 5;                              /* three chunks */
    src[i] = arena_new(bytes, 100u + (unsigned)i);
    dst[i] = arena_new(bytes, 0);
    memset(&s[i], 0, sizeof s[i]);
    memset(&r[i], 0, sizeof r[i]);
    st__xfer_sup_t *from = i < 4 ? a : b, *to = i < 4 ? b : a;
    CHECK_ERR(st__xfer_sup_open(from, "ucx", ST_XFER_SEND, 2, 0, 60000, &cbs, &s[i], &xs[i], err,
                                sizeof err), ST_OK);
    CHECK_ERR(st__xfer_sup_open(to, "ucx", ST_XFER_RECV, 2, 1, 60000, &cbs, &r[i], &xr[i], err,
                                sizeof err), ST_OK);
  }
  for (int i = 0; i < N; i++) CHECK(wait_for(&s[i].opened) && wait_for(&r[i].opened));
  /* Started in an order that is not the opens': the receivers last. */
  for (int i = N - 1; i >= 0; i--) {
    st__xfer_sup_t *from = i < 4 ? a : b;
    st__xfer_sup_arena_t sa;
    to_sup_arenas(&src[i], 1, &sa);
    CHECK_ERR(st__xfer_sup_start(from, xs[i], r[i].blob, r[i].blob_len, &sa, 1, err, sizeof err),
              ST_OK);
  }
  for (int i = 0; i < N; i++) {
    st__xfer_sup_t *to = i < 4 ? b : a;
    st__xfer_sup_arena_t ra;
    to_sup_arenas(&dst[i], 1, &ra);
    CHECK_ERR(st__xfer_sup_start(to, xr[i], s[i].blob, s[i].blob_len, &ra, 1, err, sizeof err),
              ST_OK);
  }
  for (int i = 0; i < N; i++) {
    CHECK(wait_for(&s[i].done) && wait_for(&r[i].done));
    if (!s[i].ok || !r[i].ok) fprintf(stderr, "%d: %s / %s\n", i, s[i].error, r[i].error);
    CHECK(s[i].ok && r[i].ok);
    CHECK_EQ_INT(r[i].bytes, src[i].bytes);
    CHECK(memcmp(src[i].p, dst[i].p, src[i].bytes) == 0);
  }
  for (int k = 0; k < 20; k++) {
    int i = k % N;
    memset(dst[i].p, 0, dst[i].bytes);
    src[i].p[k] ^= 0x5a;
    side_t s1, r1;
    CHECK_EQ_INT(i < 4 ? ucx_move(a, b, &src[i], &dst[i], 1, 60000, &s1, &r1)
                       : ucx_move(b, a, &src[i], &dst[i], 1, 60000, &s1, &r1), 0);
    CHECK(s1.ok && r1.ok);
    CHECK(memcmp(src[i].p, dst[i].p, src[i].bytes) == 0);
  }
  for (int i = 0; i < N; i++) {
    arena_free(&src[i]);
    arena_free(&dst[i]);
  }
  CHECK_EQ_INT(st__xfer_sup_spawns(a), 1);
  CHECK_EQ_INT(st__xfer_sup_spawns(b), 1);
  st__xfer_sup_free(a);
  st__xfer_sup_free(b);
}

/* Windows of one arena (a hand-off's chunks): three windows of the
 * sender's arena land in three other windows of the receiver's, and not
 * one byte outside them changes; a window past its arena is refused. */
TEST(ucx_windows_move_only_their_bytes) {
  st__xfer_sup_t *a = sup_new(NULL), *b = sup_new(NULL);
  const uint64_t bytes = 8u << 20;
  arena_t src = arena_new(bytes, 5), dst = arena_new(bytes, 0);
  const uint64_t soff[3] = {0, 3u << 20, 7u << 20}, doff[3] = {5u << 20, 4096, 2u << 20};
  const uint64_t len[3] = {4096, (1u << 20) + 7, 1};
  side_t s = {0}, r = {0};
  char err[256];
  uint64_t xs, xr;
  CHECK_ERR(st__xfer_sup_open(a, "ucx", ST_XFER_SEND, 2, 0, 60000, &cbs, &s, &xs, err, sizeof err), ST_OK);
  CHECK_ERR(st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, 60000, &cbs, &r, &xr, err, sizeof err), ST_OK);
  CHECK(wait_for(&s.opened) && wait_for(&r.opened));
  st__xfer_sup_arena_t sa[3], ra[3];
  for (int i = 0; i < 3; i++) {
    sa[i] = (st__xfer_sup_arena_t){.fd = src.fd, .bytes = bytes, .off = soff[i], .len = len[i]};
    ra[i] = (st__xfer_sup_arena_t){.fd = dst.fd, .bytes = bytes, .off = doff[i], .len = len[i]};
  }
  CHECK_ERR(st__xfer_sup_start(b, xr, s.blob, s.blob_len, ra, 3, err, sizeof err), ST_OK);
  CHECK_ERR(st__xfer_sup_start(a, xs, r.blob, r.blob_len, sa, 3, err, sizeof err), ST_OK);
  CHECK(wait_for(&s.done) && wait_for(&r.done));
  if (!s.ok || !r.ok) fprintf(stderr, "sender: %s\nreceiver: %s\n", s.error, r.error);
  CHECK(s.ok && r.ok);
  CHECK_EQ_INT(r.bytes, len[0] + len[1] + len[2]);
  uint8_t *want = calloc(1, bytes);
  CHECK(want != NULL);
  for (int i = 0; i < 3; i++) memcpy(want + doff[i], src.p + soff[i], len[i]);
  CHECK(memcmp(want, dst.p, bytes) == 0);
  free(want);
  /* A window that reaches past the arena: the receiver refuses it. */
  memset(&r, 0, sizeof r);
  CHECK_ERR(st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, 60000, &cbs, &r, &xr, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.opened));
  ra[0] = (st__xfer_sup_arena_t){.fd = dst.fd, .bytes = bytes, .off = bytes - 10, .len = 11};
  CHECK_ERR(st__xfer_sup_start(b, xr, r.blob, r.blob_len, ra, 1, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.done));
  CHECK(!r.ok);
  CHECK_CONTAINS(r.error, "is not inside its");
  arena_free(&src);
  arena_free(&dst);
  st__xfer_sup_free(a);
  st__xfer_sup_free(b);
}

/* Runs the loop until a second helper of s runs. */
static int restarted_flag(st__xfer_sup_t *s) {
  double end = st__now_mono() + 60;
  while ((st__xfer_sup_spawns(s) < 2 || st__xfer_sup_pid(s) == 0) && st__now_mono() < end)
    ev_run(loop, EVRUN_ONCE);
  return st__xfer_sup_spawns(s) == 2 && st__xfer_sup_pid(s) != 0;
}

TEST(sender_helper_killed_then_restarted) {
  st__xfer_sup_t *a = sup_new(NULL), *b = sup_new(NULL);
  arena_t src = arena_new(256u << 20, 7), dst = arena_new(256u << 20, 0);
  side_t s = {0}, r = {0};
  char err[256];
  uint64_t xs, xr;
  CHECK_ERR(st__xfer_sup_open(a, "ucx", ST_XFER_SEND, 2, 0, 60000, &cbs, &s, &xs, err, sizeof err), ST_OK);
  /* The receiver's deadline bounds the wait when no error reaches it. */
  CHECK_ERR(st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, 8000, &cbs, &r, &xr, err, sizeof err), ST_OK);
  CHECK(wait_for(&s.opened) && wait_for(&r.opened));
  st__xfer_sup_arena_t sa = {.fd = src.fd, .bytes = src.bytes};
  st__xfer_sup_arena_t ra = {.fd = dst.fd, .bytes = dst.bytes};
  CHECK_ERR(st__xfer_sup_start(b, xr, s.blob, s.blob_len, &ra, 1, err, sizeof err), ST_OK);
  CHECK_ERR(st__xfer_sup_start(a, xs, r.blob, r.blob_len, &sa, 1, err, sizeof err), ST_OK);
  /* Bytes are arriving at the receiver: the sender's helper dies. */
  int arriving = 0;
  double end = st__now_mono() + 60;
  while (!(arriving = r.progress_calls > 0 || r.done) && st__now_mono() < end)
    ev_run(loop, EVRUN_ONCE);
  CHECK(arriving);
  pid_t old = st__xfer_sup_pid(a);
  CHECK(old > 0);
  kill(old, SIGKILL);
  CHECK(wait_for(&s.done));
  CHECK(wait_for(&r.done));
  fprintf(stderr, "sender: %s\nreceiver: %s\n", s.error, r.error);
  if (r.ok) {
    /* The last bytes beat the kill: then they must all be right. */
    fprintf(stderr, "the transfer finished before the kill landed\n");
    CHECK(memcmp(src.p, dst.p, src.bytes) == 0);
  } else {
    CHECK_STR_EQ(s.error, "the transfer helper exited (signal 9)");
    CHECK(strstr(r.error, "endpoint failed") || strstr(r.error, "deadline"));
    CHECK(r.code == ST_ERR_IO || r.code == ST_ERR_TIMEOUT);
    CHECK(r.bytes < dst.bytes);
  }
  /* A new helper runs, and a next transfer works. */
  CHECK(restarted_flag(a));
  CHECK(st__xfer_sup_pid(a) != old);
  CHECK_EQ_INT(st__xfer_sup_spawns(a), 2);
  CHECK_EQ_INT(st__xfer_sup_spawns(b), 1);
  memset(dst.p, 0, dst.bytes);
  CHECK_EQ_INT(ucx_move(a, b, &src, &dst, 1, 60000, &s, &r), 0);
  CHECK(s.ok && r.ok);
  CHECK(memcmp(src.p, dst.p, src.bytes) == 0);
  arena_free(&src);
  arena_free(&dst);
  st__xfer_sup_free(a);
  st__xfer_sup_free(b);
}

TEST(abort_ends_both_sides) {
  st__xfer_sup_t *a = sup_new(NULL), *b = sup_new(NULL);
  arena_t dst = arena_new(1 << 20, 0);
  side_t s = {0}, r = {0};
  char err[256];
  uint64_t xs, xr;
  CHECK_ERR(st__xfer_sup_open(a, "ucx", ST_XFER_SEND, 2, 0, 60000, &cbs, &s, &xs, err, sizeof err), ST_OK);
  CHECK_ERR(st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, 60000, &cbs, &r, &xr, err, sizeof err), ST_OK);
  CHECK(wait_for(&s.opened) && wait_for(&r.opened));
  st__xfer_sup_arena_t ra = {.fd = dst.fd, .bytes = dst.bytes};
  CHECK_ERR(st__xfer_sup_start(b, xr, s.blob, s.blob_len, &ra, 1, err, sizeof err), ST_OK);
  CHECK_ERR(st__xfer_sup_abort(b, xr, "the client cancelled the pull"), ST_OK);
  CHECK(wait_for(&r.done));
  CHECK_EQ_INT(s.done, 0);
  /* The stopped receiver told the sender's transfer: started now, it ends
   * at once (not at its 60 s deadline). */
  arena_t src = arena_new(1 << 20, 9);
  st__xfer_sup_arena_t sa = {.fd = src.fd, .bytes = src.bytes};
  double t0 = st__now_mono();
  CHECK_ERR(st__xfer_sup_start(a, xs, r.blob, r.blob_len, &sa, 1, err, sizeof err), ST_OK);
  CHECK(wait_for(&s.done));
  CHECK(st__now_mono() - t0 < 10.0);
  CHECK(!r.ok && !s.ok);
  CHECK_EQ_INT(r.code, ST_ERR_CANCELLED);
  CHECK_CONTAINS(r.error, "the client cancelled the pull");
  CHECK_CONTAINS(s.error, "the receiver stopped the transfer");
  arena_free(&src);
  /* The other way: a sender started, then aborted, tells its receiver,
   * which (started after) ends at once. */
  memset(&s, 0, sizeof s);
  memset(&r, 0, sizeof r);
  CHECK_ERR(st__xfer_sup_open(a, "ucx", ST_XFER_SEND, 2, 0, 60000, &cbs, &s, &xs, err, sizeof err), ST_OK);
  CHECK_ERR(st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, 60000, &cbs, &r, &xr, err, sizeof err), ST_OK);
  CHECK(wait_for(&s.opened) && wait_for(&r.opened));
  arena_t src2 = arena_new(1 << 20, 10);
  st__xfer_sup_arena_t sa2 = {.fd = src2.fd, .bytes = src2.bytes};
  CHECK_ERR(st__xfer_sup_start(a, xs, r.blob, r.blob_len, &sa2, 1, err, sizeof err), ST_OK);
  CHECK_ERR(st__xfer_sup_abort(a, xs, "the server stops"), ST_OK);
  CHECK(wait_for(&s.done));
  CHECK(!s.ok);
  CHECK_CONTAINS(s.error, "the server stops");
  t0 = st__now_mono();
  CHECK_ERR(st__xfer_sup_start(b, xr, s.blob, s.blob_len, &ra, 1, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.done));
  CHECK(st__now_mono() - t0 < 10.0);
  CHECK(!r.ok);
  CHECK_CONTAINS(r.error, "the sender stopped the transfer");
  arena_free(&src2);
  /* Done once, and the ids are gone. */
  CHECK_ERR(st__xfer_sup_abort(b, xr, NULL), ST_ERR_NOT_FOUND);
  CHECK_EQ_INT(r.done, 1);
  CHECK_EQ_INT(st__xfer_sup_spawns(b), 1);
  arena_free(&dst);
  st__xfer_sup_free(a);
  st__xfer_sup_free(b);
}

TEST(size_claim_beyond_descriptor_refused) {
  st__xfer_sup_t *b = sup_new(NULL);
  arena_t small = arena_new(4096, 0);
  side_t r = {0};
  char err[256];
  uint64_t xr;
  CHECK_ERR(st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, 60000, &cbs, &r, &xr, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.opened));
  st__xfer_sup_arena_t ra = {.fd = small.fd, .bytes = 1 << 20};
  static const uint8_t blob[] = {'S', 'T', 'U', '1', 0, 1, 2, 3};
  CHECK_ERR(st__xfer_sup_start(b, xr, blob, sizeof blob, &ra, 1, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.done));
  CHECK(!r.ok);
  CHECK_EQ_INT(r.code, ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(r.error, "arena 0: the descriptor holds 4096 bytes, the arena claims 1048576");
  /* A peer blob of the wrong kind is refused before UCX reads it. */
  memset(&r, 0, sizeof r);
  CHECK_ERR(st__xfer_sup_open(b, "ucx", ST_XFER_RECV, 2, 1, 60000, &cbs, &r, &xr, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.opened));
  ra.bytes = 4096;
  static const uint8_t bad[] = {'S', 'T', 'N', '1', 0};
  CHECK_ERR(st__xfer_sup_start(b, xr, bad, sizeof bad, &ra, 1, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.done));
  CHECK_CONTAINS(r.error, "not a UCX sender's blob");
  CHECK_EQ_INT(st__xfer_sup_spawns(b), 1);
  arena_free(&small);
  st__xfer_sup_free(b);
}

typedef struct probe_out {
  int got;
  st__xfer_sup_probe_t rows[4];
  size_t n;
} probe_out_t;

static void on_probe(void *ud, const st__xfer_sup_probe_t *rows, size_t n) {
  probe_out_t *o = ud;
  o->got = 1;
  o->n = n < 4 ? n : 4;
  memcpy(o->rows, rows, o->n * sizeof *rows);
}

static const st__xfer_probe_t *row(const probe_out_t *o, const char *engine) {
  for (size_t i = 0; i < o->n; i++)
    if (strcmp(o->rows[i].engine, engine) == 0) return &o->rows[i].probe;
  return NULL;
}

TEST(probe_missing_library_says_why) {
  st__xfer_sup_t *s = sup_new("/nonexistent/libucp.so.0");
  probe_out_t o = {0};
  char err[128];
  CHECK_ERR(st__xfer_sup_probe(s, on_probe, &o, err, sizeof err), ST_OK);
  CHECK(wait_for(&o.got));
  const st__xfer_probe_t *u = row(&o, "ucx"), *n = row(&o, "nccl");
  CHECK(u && n);
  CHECK(!u->available);
  CHECK_CONTAINS_ALL(u->reason, "dlopen(/nonexistent/libucp.so.0)", "peer.ucx_library");
  CHECK_STR_EQ(u->version, "");
  /* No GPU and no NCCL here: unavailable, with the reason. */
  if (!n->available) CHECK(n->reason[0] != 0);
  fprintf(stderr, "nccl here: %s %s\n", n->version, n->available ? "available" : n->reason);
  /* An open of the missing engine fails with that reason. */
  side_t r = {0};
  uint64_t x;
  CHECK_ERR(st__xfer_sup_open(s, "ucx", ST_XFER_RECV, 2, 1, 5000, &cbs, &r, &x, err, sizeof err), ST_OK);
  CHECK(wait_for(&r.done));
  CHECK_EQ_INT(r.code, ST_ERR_CAPABILITY);
  CHECK_CONTAINS(r.error, "the ucx engine is unavailable: dlopen(/nonexistent/libucp.so.0)");
  CHECK_EQ_INT(r.opened, 0);
  st__xfer_sup_free(s);
}

TEST(probe_fake_libraries_report_their_versions) {
  st__xfer_probe_t p;
  CHECK_ERR(st__ucx_probe(ST_FAKE_UCP, &p), ST_ERR_CAPABILITY);
  CHECK_STR_EQ(p.version, "1.99.7");
  CHECK_CONTAINS(p.reason, "symbol ucp_config_read not found in");
  CHECK_ERR(st__nccl_probe(ST_FAKE_NCCL, &p), ST_ERR_CAPABILITY);
  CHECK_STR_EQ(p.version, "2.28.9");
  CHECK_CONTAINS(p.reason, "symbol ncclGetErrorString not found in");
  CHECK_ERR(st__nccl_probe("/nonexistent/libnccl.so.2", &p), ST_ERR_CAPABILITY);
  CHECK_CONTAINS_ALL(p.reason, "dlopen(/nonexistent/libnccl.so.2)", "peer.nccl_library");
  char v[32];
  st__nccl_version_string(21803, v, sizeof v);
  CHECK_STR_EQ(v, "2.18.3");
  st__nccl_version_string(2708, v, sizeof v);
  CHECK_STR_EQ(v, "2.7.8");
  /* Through the helper, as a server asks. */
  st__xfer_sup_config_t cfg = {.exe = server_bin, .ucx_library = ST_FAKE_UCP,
                               .nccl_library = ST_FAKE_NCCL, .log_level = -1};
  st__xfer_sup_t *s = NULL;
  char err[256];
  CHECK_ERR(st__xfer_sup_new(loop, &cfg, &s, err, sizeof err), ST_OK);
  probe_out_t o = {0};
  CHECK_ERR(st__xfer_sup_probe(s, on_probe, &o, err, sizeof err), ST_OK);
  CHECK(wait_for(&o.got));
  CHECK(row(&o, "ucx") && row(&o, "nccl"));
  CHECK_STR_EQ(row(&o, "ucx")->version, "1.99.7");
  CHECK_STR_EQ(row(&o, "nccl")->version, "2.28.9");
  CHECK(!row(&o, "ucx")->available && !row(&o, "nccl")->available);
  st__xfer_sup_free(s);
}

TEST(helper_flag_needs_a_seqpacket_socket) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "%s --xfer-helper 1 2>/dev/null", server_bin);
  int st = system(cmd);
  CHECK(WIFEXITED(st));
  CHECK_EQ_INT(WEXITSTATUS(st), 2);
}

/* DT_NEEDED entries of an ELF64 file, joined by spaces into out. */
static int elf_needed(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)size);
  if (!b || fread(b, 1, (size_t)size, f) != (size_t)size) {
    fclose(f);
    free(b);
    return -1;
  }
  fclose(f);
  Elf64_Ehdr *eh = (Elf64_Ehdr *)b;
  if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) {
    free(b);
    return -1;
  }
  Elf64_Shdr *sh = (Elf64_Shdr *)(b + eh->e_shoff);
  out[0] = 0;
  int found = 0;
  for (int i = 0; i < eh->e_shnum; i++) {
    if (sh[i].sh_type != SHT_DYNAMIC) continue;
    const char *strtab = b + sh[sh[i].sh_link].sh_offset;
    Elf64_Dyn *d = (Elf64_Dyn *)(b + sh[i].sh_offset);
    for (size_t k = 0; k < sh[i].sh_size / sizeof *d && d[k].d_tag != DT_NULL; k++)
      if (d[k].d_tag == DT_NEEDED) {
        strncat(out, strtab + d[k].d_un.d_val, cap - strlen(out) - 2);
        strncat(out, " ", cap - strlen(out) - 1);
        found++;
      }
  }
  free(b);
  return found;
}

TEST(stserver_needs_no_engine_library) {
  char needed[2048];
  int n = elf_needed(server_bin, needed, sizeof needed);
  fprintf(stderr, "stserver needs: %s\n", needed);
  CHECK(n > 0);
  CHECK_CONTAINS(needed, "libc.so");
  const char *banned[] = {"libucp", "libucs", "libuct", "libnccl", "libssl", "libcrypto"};
  for (size_t i = 0; i < sizeof banned / sizeof banned[0]; i++)
    if (strstr(needed, banned[i])) STT_FAIL("stserver needs %s: %s", banned[i], needed);
}

int main(void) {
  server_bin = getenv("ST_SERVER_BIN");
  if (!server_bin) stt_skip("ST_SERVER_BIN is not set");
  signal(SIGPIPE, SIG_IGN);
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  loop = ev_default_loop(0);
  RUN(stserver_needs_no_engine_library);
  RUN(helper_flag_needs_a_seqpacket_socket);
  RUN(probe_fake_libraries_report_their_versions);
  RUN(probe_missing_library_says_why);
  require_ucx();
  RUN(size_claim_beyond_descriptor_refused);
  RUN(ucx_three_arenas_every_byte);
  RUN(ucx_windows_move_only_their_bytes);
  RUN(ucx_concurrent_transfers_keep_apart);
  RUN(abort_ends_both_sides);
  RUN(sender_helper_killed_then_restarted);
  return stt_summary();
}

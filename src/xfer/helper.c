/* src/xfer/helper.c: the transfer helper's loop (see helper.h).
 *
 * One thread: poll(2) on the server's socket and each transfer's engine
 * descriptor, then every running transfer's engine poll. Everything the
 * server sends is checked like a client's request: the record's shape,
 * the transfer ids, the arenas' sizes against fstat of their
 * descriptors, their count against the descriptors attached. A record
 * that fails a check naming a transfer ends that transfer with the
 * reason; one that names none is logged and dropped.
 */
#include "xfer/helper.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "cudadrv/driver.h"
#include "cudadrv/import.h"
#include "proto/proto.h"
#include "st/errors.h"
#include "xfer/engines.h"
#include "xfer/wire.h"

#define WHO "xfer-helper"
/* Seconds between two progress records of one transfer. */
#define PROGRESS_PERIOD 0.1
/* Milliseconds the loop sleeps at most (deadlines are checked then), and
 * at most while a transfer moves bytes: UCX's event descriptor over TCP
 * was seen to miss a wake when two transfers shared a connection (the
 * transfer then stalled until the idle tick), so a moving transfer is
 * also looked at on a short tick. */
#define TICK_MS 100
#define MOVING_TICK_MS 2

typedef struct harena {
  void *addr;              /* CPU mapping (or the staging copy), or NULL */
  uint64_t bytes;          /* of the mapping (a staging copy: the window's) */
  uint64_t off, len;       /* the window that moves: [off, off + len) of
                              the arena (a staging copy holds just it)    */
  uint64_t skip;           /* CPU: bytes from addr to the window (the
                              mapping starts at the window's page)        */
  int cuda;
  st__cuda_mapping_t m;    /* CUDA mapping                              */
  int staged;              /* a CUDA arena moved by an engine of CPU
                              memory: addr is a host copy of it (anonymous,
                              owned), filled from the device before a send
                              and copied to it after a receive            */
} harena_t;

typedef struct tx {
  int used;
  uint64_t id;
  const st__xfer_engine_t *eng;
  st__xfer_t *x;
  st__xfer_role_t role;
  int started;
  int aborted;             /* the server asked: the failure is CANCELLED */
  harena_t *arenas;
  size_t n;
  uint64_t total;
  uint64_t last_bytes;
  double last_progress;
} tx_t;

static int sock = -1;
static unsigned max_transfers = 16;
static char ucx_library[256], nccl_library[256];
static tx_t txs[ST_XFER_MAX_TRANSFERS];

/* Sends one record packed in sb; a failure of the socket ends the
 * helper (the server is gone or broken). */
static void send_record(msgpack_sbuffer *sb, int nonblock) {
  char err[160];
  int rc = st__xfer_send(sock, sb->data, sb->size, NULL, 0, nonblock, err, sizeof err);
  msgpack_sbuffer_destroy(sb);
  if (rc == ST_ERR_IO) {
    ST_LOG_E(WHO, "the server's socket failed (%s); exiting", err);
    _exit(1);
  }
}

static void send_done(uint64_t id, int code, uint64_t bytes, const char *error) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_notification_head(&pk, "done");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, code ? 5 : 3);
  st__pack_kv_uint(&pk, "xfer", id);
  st__pack_kv_bool(&pk, "ok", code == ST_OK);
  st__pack_kv_uint(&pk, "bytes", bytes);
  if (code) {
    st__pack_kv_str(&pk, "code", st_err_name(code));
    st__pack_kv_str(&pk, "error", error);
  }
  send_record(&sb, 0);
}

static tx_t *find(uint64_t id) {
  for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++)
    if (txs[i].used && txs[i].id == id) return &txs[i];
  return NULL;
}

static void unmap_arenas(tx_t *t) {
  for (size_t i = 0; i < t->n; i++) {
    harena_t *a = &t->arenas[i];
    if (a->addr) munmap(a->addr, (size_t)a->bytes);   /* a mapping or a staging copy */
    if (a->cuda) st__cuda_unmap(&a->m);
  }
  free(t->arenas);
  t->arenas = NULL;
  t->n = 0;
}

/* Ends transfer t: the arenas unmapped, then the done record: after it
 * the helper touches none of the arenas. A failed transfer's engine is
 * closed first (its requests cancelled before the memory goes); a
 * finished one's after the done record, whose bytes are all in place and
 * which need not wait for the endpoints' close. */
static void finish(tx_t *t, int code, uint64_t bytes, const char *error) {
  st__xfer_t *done_x = NULL;
  if (t->x && code) t->eng->close(t->x);
  else done_x = t->x;
  const st__xfer_engine_t *eng = t->eng;
  t->x = NULL;
  unmap_arenas(t);
  if (code)
    ST_LOG_W(WHO, "transfer %llu failed after %llu bytes: %s", (unsigned long long)t->id,
             (unsigned long long)bytes, error);
  else
    ST_LOG_D(WHO, "transfer %llu done: %llu bytes", (unsigned long long)t->id,
             (unsigned long long)bytes);
  send_done(t->id, code, bytes, error);
  memset(t, 0, sizeof *t);
  if (done_x) eng->close(done_x);
}

static void pack_probe(msgpack_packer *pk, const st__xfer_probe_t *p) {
  msgpack_pack_map(pk, 4);
  st__pack_kv_bool(pk, "available", p->available);
  st__pack_kv_str(pk, "version", p->version[0] ? p->version : NULL);
  st__pack_kv_str(pk, "library", p->library);
  st__pack_kv_str(pk, "reason", p->available ? NULL : p->reason);
}

static void on_probe(void) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_notification_head(&pk, "probed");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 1);
  st__pack_cstr(&pk, "engines");
  msgpack_pack_map(&pk, st__xfer_engine_count);
  for (size_t i = 0; i < st__xfer_engine_count; i++) {
    const st__xfer_engine_t *e = st__xfer_engines[i];
    st__xfer_probe_t p;
    e->probe(strcmp(e->name, "ucx") == 0 ? ucx_library : nccl_library, &p);
    st__pack_cstr(&pk, e->name);
    pack_probe(&pk, &p);
  }
  send_record(&sb, 0);
}

static void copy_str(const msgpack_object *params, const char *key, char *out, size_t cap) {
  const char *s;
  size_t len;
  char err[96];
  if (st__xfer_get_str(params, key, &s, &len, err, sizeof err) == ST_OK && len < cap &&
      !memchr(s, 0, len)) {
    memcpy(out, s, len);
    out[len] = 0;
  }
}

static void on_config(const msgpack_object *params) {
  uint64_t v;
  char err[96];
  if (st__xfer_get_uint(params, "max_transfers", &v, err, sizeof err) == ST_OK && v >= 1)
    max_transfers = v > ST_XFER_MAX_TRANSFERS ? ST_XFER_MAX_TRANSFERS : (unsigned)v;
  if (st__xfer_get_uint(params, "log_level", &v, err, sizeof err) == ST_OK && v <= ST_LOG_DEBUG)
    st__log_set_level((st__log_level_t)v);
  copy_str(params, "ucx_library", ucx_library, sizeof ucx_library);
  copy_str(params, "nccl_library", nccl_library, sizeof nccl_library);
}

static void on_open(const msgpack_object *params) {
  char err[480] = "";
  uint64_t id = 0, nranks = 2, rank = 0, timeout_ms = 0;
  const char *eng_name = NULL, *role = NULL;
  size_t eng_len = 0, role_len = 0;
  if (st__xfer_get_uint(params, "xfer", &id, err, sizeof err) != ST_OK || id == 0) {
    ST_LOG_W(WHO, "an open without a transfer id was dropped");
    return;
  }
  if (find(id)) {
    ST_LOG_W(WHO, "an open of transfer %llu, which is open already, was dropped",
             (unsigned long long)id);
    return;
  }
  int rc = ST_ERR_PROTOCOL;
  if (st__xfer_get_str(params, "engine", &eng_name, &eng_len, err, sizeof err) != ST_OK ||
      st__xfer_get_str(params, "role", &role, &role_len, err, sizeof err) != ST_OK ||
      st__xfer_get_uint(params, "timeout_ms", &timeout_ms, err, sizeof err) != ST_OK) {
    if (!err[0]) snprintf(err, sizeof err, "an open needs engine, role and timeout_ms");
    send_done(id, rc, 0, err);
    return;
  }
  (void)st__xfer_get_uint(params, "nranks", &nranks, err, sizeof err);
  (void)st__xfer_get_uint(params, "rank", &rank, err, sizeof err);
  char name[16];
  snprintf(name, sizeof name, "%.*s", (int)(eng_len < 15 ? eng_len : 15), eng_name);
  const st__xfer_engine_t *e = st__xfer_engine(name);
  int send = st__xfer_is(role, role_len, "send");
  if (!e || (!send && !st__xfer_is(role, role_len, "recv")) || nranks < 2 || nranks > 4096 ||
      rank >= nranks || timeout_ms == 0 || timeout_ms > 7 * 24 * 3600 * 1000ULL) {
    snprintf(err, sizeof err, !e ? "unknown engine '%s'" : "bad role, ranks or timeout_ms",
             name);
    send_done(id, ST_ERR_INVALID_ARGUMENT, 0, err);
    return;
  }
  tx_t *t = NULL;
  unsigned running = 0;
  for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++) {
    if (txs[i].used) running++;
    else if (!t) t = &txs[i];
  }
  if (!t || running >= max_transfers) {
    snprintf(err, sizeof err, "the helper runs %u transfers already (its limit)", running);
    send_done(id, ST_ERR_LIMIT, 0, err);
    return;
  }
  st__xfer_probe_t p;
  if (e->probe(strcmp(e->name, "ucx") == 0 ? ucx_library : nccl_library, &p) != ST_OK) {
    snprintf(err, sizeof err, "the %s engine is unavailable: %s", e->name, p.reason);
    send_done(id, ST_ERR_CAPABILITY, 0, err);
    return;
  }
  st__xfer_open_t o = {.role = send ? ST_XFER_SEND : ST_XFER_RECV,
                       .nranks = (int)nranks,
                       .rank = (int)rank,
                       .deadline = st__now_mono() + (double)timeout_ms / 1000.0,
                       .id = id};
  uint8_t blob[ST_XFER_BLOB_MAX];
  size_t blob_len = 0;
  st__xfer_t *x = NULL;
  rc = e->open(&o, &x, blob, &blob_len, err, sizeof err);
  if (rc != ST_OK) {
    send_done(id, rc, 0, err);
    return;
  }
  memset(t, 0, sizeof *t);
  t->used = 1;
  t->id = id;
  t->eng = e;
  t->x = x;
  t->role = o.role;
  t->last_progress = st__now_mono();
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_notification_head(&pk, "opened");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 2);
  st__pack_kv_uint(&pk, "xfer", id);
  st__pack_cstr(&pk, "blob");
  st__xfer_pack_bin(&pk, blob, blob_len);
  memset(blob, 0, sizeof blob); /* an NCCL id is a secret: no copy stays */
  send_record(&sb, 0);
}

/* Maps one arena described by `d` from descriptor fd (borrowed). */
static int map_arena(tx_t *t, const msgpack_object *d, int fd, harena_t *a, size_t idx,
                     char *err, size_t errlen) {
  uint64_t bytes = 0;
  int cuda = 0;
  if (d->type != MSGPACK_OBJECT_MAP ||
      st__xfer_get_uint(d, "bytes", &bytes, err, errlen) != ST_OK) {
    snprintf(err, errlen, "arena %zu: an arena is a map with 'bytes'", idx);
    return ST_ERR_PROTOCOL;
  }
  (void)st__xfer_get_bool(d, "cuda", &cuda, err, errlen);
  if (bytes == 0 || bytes > (uint64_t)SIZE_MAX / 2) {
    snprintf(err, errlen, "arena %zu: %llu bytes is no arena size", idx,
             (unsigned long long)bytes);
    return ST_ERR_INVALID_ARGUMENT;
  }
  /* A window: only [off, off + len) moves (the whole arena without one). */
  uint64_t off = 0, len = 0;
  int has_off = st__xfer_get_uint(d, "off", &off, err, errlen) == ST_OK;
  int has_len = st__xfer_get_uint(d, "len", &len, err, errlen) == ST_OK;
  if (has_off != has_len || (has_len && (len == 0 || off > bytes || len > bytes - off))) {
    snprintf(err, errlen, "arena %zu: the window [%llu, +%llu) is not inside its %llu bytes",
             idx, (unsigned long long)off, (unsigned long long)len, (unsigned long long)bytes);
    return ST_ERR_INVALID_ARGUMENT;
  }
  a->off = off;
  a->len = has_len ? len : bytes;
  if (t->eng->memory == ST_XFER_MEM_CUDA && !cuda) {
    snprintf(err, errlen, "arena %zu: the %s engine moves CUDA memory, not CPU", idx,
             t->eng->name);
    return ST_ERR_CAPABILITY;
  }
  a->bytes = bytes;
  if (cuda) {
    const char *uuid;
    size_t ulen;
    char u[64];
    if (st__xfer_get_str(d, "uuid", &uuid, &ulen, err, errlen) != ST_OK || ulen >= sizeof u) {
      snprintf(err, errlen, "arena %zu: a CUDA arena needs its device's 'uuid'", idx);
      return ST_ERR_PROTOCOL;
    }
    memcpy(u, uuid, ulen);
    u[ulen] = 0;
    /* The allocation is whole granules; `bytes` may be less (a CPU key's
     * size pulled onto a device): map the granules that hold them. */
    int ordinal = -1;
    uint64_t gran = 0;
    int rc = st__cuda_fd_check(fd, err, errlen);
    if (rc == ST_OK) rc = st__cuda_device_by_uuid(u, &ordinal, err, errlen);
    if (rc == ST_OK) rc = st__cuda_granularity(ordinal, &gran, err, errlen);
    if (rc == ST_OK && (gran == 0 || bytes > UINT64_MAX - gran)) rc = ST_ERR_INVALID_ARGUMENT;
    if (rc == ST_OK)
      rc = st__cuda_import(fd, (bytes + gran - 1) / gran * gran, u, &a->m, err, errlen);
    if (rc != ST_OK) return rc;
    a->cuda = 1;
    if (t->eng->memory == ST_XFER_MEM_CUDA) return ST_OK;
    /* An engine of CPU memory: it moves a host copy of the window. */
    void *h = mmap(NULL, (size_t)a->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                   0);
    if (h == MAP_FAILED) {
      snprintf(err, errlen, "arena %zu: no host memory to stage %llu bytes of CUDA memory: %s",
               idx, (unsigned long long)a->len, strerror(errno));
      return ST_ERR_OUT_OF_MEMORY;
    }
    a->addr = h;
    a->bytes = a->len;
    a->staged = 1;
    return ST_OK;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "arena %zu: fstat: %s", idx, strerror(errno));
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "arena %zu: the descriptor is %s, not a memfd", idx,
             st__file_kind((unsigned)st.st_mode));
    return ST_ERR_INVALID_ARGUMENT;
  }
  if ((uint64_t)st.st_size < bytes) {
    snprintf(err, errlen, "arena %zu: the descriptor holds %lld bytes, the arena claims %llu",
             idx, (long long)st.st_size, (unsigned long long)bytes);
    return ST_ERR_INVALID_ARGUMENT;
  }
  /* Only the pages of the window, populated at once: the engine touches
   * every one of them, and one populate costs far less than a fault per
   * page (a batch of hand-off chunks maps one window per chunk). */
  int prot = t->role == ST_XFER_SEND ? PROT_READ : PROT_READ | PROT_WRITE;
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  uint64_t first = a->off / page * page, span = a->off + a->len - first;
  void *p = mmap(NULL, (size_t)span, prot, MAP_SHARED | MAP_POPULATE, fd, (off_t)first);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "arena %zu: mmap of %llu bytes%s failed: %s", idx,
             (unsigned long long)span, prot & PROT_WRITE ? " read-write" : "", strerror(errno));
    return ST_ERR_OUT_OF_MEMORY;
  }
  a->addr = p;
  a->bytes = span;
  a->skip = a->off - first;
  return ST_OK;
}

/* Copies the staged arenas of t between their devices and their host
 * copies: to the host before a send (to_host), to the devices after a
 * receive. ST_OK, or the driver's error with the arena named. Blocking:
 * the helper's other transfers wait meanwhile (at device-copy speed). */
static int copy_staged(tx_t *t, int to_host, char *err, size_t errlen) {
  for (size_t i = 0; i < t->n; i++) {
    harena_t *a = &t->arenas[i];
    if (!a->staged) continue;
    char why[256];
    int rc = to_host ? st__cuda_copy_to_host(a->addr, a->m.dptr + a->off, a->len, a->m.ordinal,
                                             why, sizeof why)
                     : st__cuda_copy_to_device(a->m.dptr + a->off, a->addr, a->len, a->m.ordinal,
                                               why, sizeof why);
    if (rc != ST_OK) {
      snprintf(err, errlen, "arena %zu: staging %llu bytes %s cuda:%d: %s", i,
               (unsigned long long)a->bytes, to_host ? "from" : "to", a->m.ordinal, why);
      return rc;
    }
  }
  return ST_OK;
}

/* `arenas` and `start`: appends the record's arenas (one descriptor
 * each, in order), then for start hands them to the engine. */
static void on_arenas(const msgpack_object *params, const int *fds, size_t nfds, int start) {
  char err[320] = "";
  uint64_t id = 0;
  if (st__xfer_get_uint(params, "xfer", &id, err, sizeof err) != ST_OK) {
    ST_LOG_W(WHO, "a record of arenas without a transfer id was dropped");
    return;
  }
  tx_t *t = find(id);
  if (!t) {
    /* A transfer that ended already (an abort crossed this record). */
    ST_LOG_D(WHO, "arenas for transfer %llu, which is not open, were dropped",
             (unsigned long long)id);
    return;
  }
  int rc = ST_ERR_PROTOCOL;
  const msgpack_object *list = st__map_get(params, "arenas");
  if (t->started) {
    snprintf(err, sizeof err, "arenas came after the transfer started");
    goto bad;
  }
  if (!list || list->type != MSGPACK_OBJECT_ARRAY || list->via.array.size != nfds) {
    snprintf(err, sizeof err, "the record lists %u arenas and carries %zu descriptors",
             list && list->type == MSGPACK_OBJECT_ARRAY ? list->via.array.size : 0, nfds);
    goto bad;
  }
  if (t->n + nfds > ST_XFER_MAX_ARENAS) {
    rc = ST_ERR_LIMIT;
    snprintf(err, sizeof err, "more than %d arenas in one transfer", ST_XFER_MAX_ARENAS);
    goto bad;
  }
  if (nfds) {
    harena_t *grown = realloc(t->arenas, (t->n + nfds) * sizeof *grown);
    if (!grown) {
      rc = ST_ERR_OUT_OF_MEMORY;
      snprintf(err, sizeof err, "out of memory");
      goto bad;
    }
    t->arenas = grown;
  }
  for (size_t i = 0; i < nfds; i++) {
    harena_t *a = &t->arenas[t->n];
    memset(a, 0, sizeof *a);
    rc = map_arena(t, &list->via.array.ptr[i], fds[i], a, t->n, err, sizeof err);
    if (rc != ST_OK) goto bad;
    t->total += a->len;
    t->n++;
  }
  if (!start) return;
  const uint8_t *peer = NULL;
  size_t peer_len = 0;
  if (st__xfer_get_bin(params, "peer", &peer, &peer_len, err, sizeof err) != ST_OK ||
      peer_len == 0 || peer_len > ST_XFER_BLOB_MAX) {
    rc = ST_ERR_PROTOCOL;
    snprintf(err, sizeof err, "a start needs the peer's blob (1 to %d bytes)", ST_XFER_BLOB_MAX);
    goto bad;
  }
  st__xfer_arena_t *ea = calloc(t->n ? t->n : 1, sizeof *ea);
  if (!ea) {
    rc = ST_ERR_OUT_OF_MEMORY;
    snprintf(err, sizeof err, "out of memory");
    goto bad;
  }
  for (size_t i = 0; i < t->n; i++) {
    const harena_t *a = &t->arenas[i];
    int on_device = a->cuda && !a->staged;
    /* A staging copy holds the window alone, a CPU mapping its pages, a
     * CUDA mapping the whole arena. */
    uint64_t at = a->staged ? 0 : a->cuda ? a->off : a->skip;
    ea[i].bytes = a->len;
    ea[i].addr = on_device ? (void *)(uintptr_t)(a->m.dptr + at) : (uint8_t *)a->addr + at;
    ea[i].device = on_device ? a->m.ordinal : -1;
  }
  rc = t->role == ST_XFER_SEND ? copy_staged(t, 1, err, sizeof err) : ST_OK;
  if (rc == ST_OK) rc = t->eng->start(t->x, peer, peer_len, ea, t->n, err, sizeof err);
  free(ea);
  if (rc != ST_OK) goto bad;
  t->started = 1;
  ST_LOG_D(WHO, "transfer %llu started: %zu arenas, %llu bytes", (unsigned long long)id, t->n,
           (unsigned long long)t->total);
  return;
bad:
  finish(t, rc, 0, err);
}

static void on_abort(const msgpack_object *params) {
  char err[96];
  uint64_t id = 0;
  if (st__xfer_get_uint(params, "xfer", &id, err, sizeof err) != ST_OK) return;
  tx_t *t = find(id);
  if (!t) return; /* ended already: its done record is on its way */
  const char *why = NULL;
  size_t len = 0;
  char reason[256];
  if (st__xfer_get_str(params, "reason", &why, &len, err, sizeof err) != ST_OK) {
    why = "aborted by the server";
    len = strlen(why);
  }
  snprintf(reason, sizeof reason, "%.*s", (int)(len < 200 ? len : 200), why);
  t->aborted = 1;
  t->eng->abort(t->x, reason);
}

/* One record from the server. fds are owned here: every one is closed. */
static void on_record(const char *buf, size_t len, int *fds, size_t nfds) {
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  const char *method;
  size_t mlen;
  const msgpack_object *params;
  char err[160];
  if (st__xfer_parse(buf, len, &up, &method, &mlen, &params, err, sizeof err) != ST_OK) {
    ST_LOG_W(WHO, "a record from the server was dropped: %s", err);
  } else if (st__xfer_is(method, mlen, "arenas") || st__xfer_is(method, mlen, "start")) {
    on_arenas(params, fds, nfds, st__xfer_is(method, mlen, "start"));
  } else if (nfds) {
    ST_LOG_W(WHO, "a '%.*s' record with descriptors was dropped", (int)mlen, method);
  } else if (st__xfer_is(method, mlen, "config")) {
    on_config(params);
  } else if (st__xfer_is(method, mlen, "probe")) {
    on_probe();
  } else if (st__xfer_is(method, mlen, "open")) {
    on_open(params);
  } else if (st__xfer_is(method, mlen, "abort")) {
    on_abort(params);
  } else {
    ST_LOG_W(WHO, "an unknown record '%.*s' was dropped", (int)(mlen < 40 ? mlen : 40), method);
  }
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  msgpack_unpacked_destroy(&up);
}

static void send_progress(tx_t *t, uint64_t bytes) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_notification_head(&pk, "progress");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 3);
  st__pack_kv_uint(&pk, "xfer", t->id);
  st__pack_kv_uint(&pk, "bytes", bytes);
  st__pack_kv_uint(&pk, "total", t->total);
  send_record(&sb, 1); /* advisory: dropped when the socket is full */
}

/* Polls every transfer's engine; ends the ones that finished. */
static void poll_transfers(void) {
  double now = st__now_mono();
  for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++) {
    tx_t *t = &txs[i];
    if (!t->used) continue;
    uint64_t bytes = 0;
    char err[320] = "";
    st__xfer_state_t s = t->eng->poll(t->x, now, &bytes, err, sizeof err);
    if (s == ST_XFER_DONE) {
      /* Received into host copies: onto their devices before done. */
      int rc = t->role == ST_XFER_RECV ? copy_staged(t, 0, err, sizeof err) : ST_OK;
      finish(t, rc, bytes, rc == ST_OK ? NULL : err);
    } else if (s == ST_XFER_FAILED) {
      finish(t, t->aborted ? ST_ERR_CANCELLED : strstr(err, "deadline") ? ST_ERR_TIMEOUT : ST_ERR_IO, bytes,
             err[0] ? err : "the engine failed");
    } else if (bytes != t->last_bytes && now - t->last_progress >= PROGRESS_PERIOD) {
      t->last_bytes = bytes;
      t->last_progress = now;
      send_progress(t, bytes);
    }
  }
}

static int parse_fd(const char *s) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!s[0] || *end || v < 3 || v > 1 << 20) return -1;
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt((int)v, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET)
    return -1;
  return (int)v;
}

/* Closes every descriptor but 0-2 and keep: the helper holds none of the
 * server's sockets or arenas but those it is sent. */
static void close_others(int keep) {
  if (keep > 3) close_range(3, (unsigned)keep - 1, 0);
  close_range((unsigned)keep + 1, ~0U, 0);
}

int st__xfer_helper_main(const char *fd_arg) {
  sock = parse_fd(fd_arg);
  if (sock < 0) {
    fprintf(stderr, "stserver %s: '%s' is not a descriptor of a SOCK_SEQPACKET socket; this "
            "mode is started by the server only\n", ST_XFER_HELPER_FLAG, fd_arg);
    return 2;
  }
  /* The server's death ends the helper even when it is stuck in an
   * engine; the socket's close ends it otherwise. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  close_others(sock);
  signal(SIGPIPE, SIG_IGN);
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  prctl(PR_SET_NAME, "st-xfer-helper");
  ST_LOG_D(WHO, "started (pid %d)", (int)getpid());
  static char buf[ST_XFER_MSG_MAX];
  for (;;) {
    struct pollfd pfd[1 + ST_XFER_MAX_TRANSFERS];
    nfds_t np = 1;
    pfd[0].fd = sock;
    pfd[0].events = POLLIN;
    int timeout = TICK_MS;
    for (unsigned i = 0; i < ST_XFER_MAX_TRANSFERS; i++) {
      if (!txs[i].used) continue;
      int fd = -1;
      if (txs[i].started && timeout > MOVING_TICK_MS) timeout = MOVING_TICK_MS;
      int w = txs[i].eng->wait_fd(txs[i].x, &fd);
      if (w == 0) timeout = 0;
      else if (w < 0) timeout = timeout > 1 ? 1 : timeout;
      else {
        pfd[np].fd = fd;
        pfd[np].events = POLLIN;
        np++;
      }
    }
    int r = poll(pfd, np, timeout);
    if (r < 0 && errno != EINTR) {
      ST_LOG_E(WHO, "poll: %s; exiting", strerror(errno));
      return 1;
    }
    if (r > 0 && (pfd[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      for (;;) {
        int fds[ST_XFER_FDS_PER_MSG];
        size_t nfds = 0;
        char err[160];
        long n = st__xfer_recv(sock, buf, sizeof buf, fds, &nfds, err, sizeof err);
        if (n == ST_ERR_BUSY) break;
        if (n == 0) {
          ST_LOG_D(WHO, "the server closed its end; exiting");
          return 0;
        }
        if (n == ST_ERR_PROTOCOL) {
          ST_LOG_W(WHO, "%s; dropped", err);
          continue;
        }
        if (n < 0) {
          ST_LOG_E(WHO, "%s; exiting", err);
          return 1;
        }
        on_record(buf, (size_t)n, fds, nfds);
      }
    }
    poll_transfers();
  }
}

/* src/server: the connection side of result pools (pool_conn.h). */
#include "server/pool_conn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "lua/st_lua.h"
#include "mem/slab_alloc.h"
#include "mem/uidq.h"
#include "server/conn.h"
#include "server/holdings.h"
#include "server/loopprof.h"
#include "server/server.h"

/* The per-connection cap: pool.max_bytes_per_connection, never more than
 * a quarter of the cpu budget. */
static uint64_t conn_cap(const st__server_t *srv) {
  const st__config_t *cfg = srv->cfg;
  uint64_t cap = cfg->pool_max_bytes;
  uint64_t budget = cfg->nbudgets > 0 ? cfg->budgets[0].bytes : 0;
  if (budget && cap > budget / 4) cap = budget / 4;
  return cap / ST__SLAB_PAGE * ST__SLAB_PAGE;
}

/* pool.max_result_bytes, else an eighth of a device's cap, at most
 * 16 MiB. */
static uint64_t result_cap(const st__config_t *cfg, uint64_t cap) {
  if (cfg->pool_max_result_bytes) return cfg->pool_max_result_bytes;
  return cap / 8 < (16u << 20) ? cap / 8 : 16u << 20;
}

/* ------------------------------------------------------ per-uid account
 *
 * The slab bytes of the pools of one uid's connections, CPU and CUDA
 * alike, are charged to its quotas.pool_bytes (mem/uidq.h; a quarter of
 * the memory_budget entries together by default). A pool keeps the uid it charges (pools outlive their
 * connection while regions are in use) and calls in under its own mutex,
 * from any thread. */

static int uid_charge(void *ctx, int device, int64_t bytes) {
  uid_t uid = *(const uid_t *)ctx;
  (void)device;   /* every device's slabs count; each device keeps its cap too */
  if (bytes < 0) {
    st__uidq_uncharge(uid, ST__UIDQ_POOL_BYTES, (uint64_t)-bytes);
    return 0;
  }
  return st__uidq_charge(uid, ST__UIDQ_POOL_BYTES, (uint64_t)bytes, NULL, 0) == ST_OK ? 0 : -1;
}

static void uid_drop(void *ctx) { free(ctx); }

void st__pool_conn_sweep(st__server_t *srv) {
  (void)srv;
  st__mpool_trim_all();
}

int st__pool_offered(const st__server_t *srv) {
  return srv->cfg->pool_max_regions > 0 && conn_cap(srv) >= ST__SLAB_PAGE;
}

void st__pool_conn_hello(st__conn_t *c, const msgpack_object *features) {
  if (c->pool || !st__features_has(features, "pool") || !st__pool_offered(c->srv)) return;
  const st__config_t *cfg = c->srv->cfg;
  st__mpool_cfg_t pc = {.max_bytes = conn_cap(c->srv), .max_regions = (uint32_t)cfg->pool_max_regions};
  pc.slab_bytes = cfg->pool_slab_bytes < pc.max_bytes ? cfg->pool_slab_bytes : pc.max_bytes;
  pc.max_result_bytes = result_cap(cfg, pc.max_bytes);
  pc.cuda_slab_bytes = cfg->pool_cuda_slab_bytes;
  pc.cuda_max_bytes = cfg->pool_cuda_max_bytes;   /* mem/pool.c: a quarter of each budget */
  pc.cuda_max_result_bytes = result_cap(cfg, pc.cuda_max_bytes);
  pc.idle_ns = (uint64_t)(cfg->pool_idle_s * 1e9);
  uid_t *acct = malloc(sizeof *acct);
  if (!acct) {
    ST_LOG_W("pool", "conn %llu: no result pool: out of memory", (unsigned long long)c->id);
    return;
  }
  *acct = c->cred.uid;
  pc.account = uid_charge;
  pc.account_drop = uid_drop;
  pc.account_ctx = acct;
  pc.account_limit = "quotas.pool_bytes";
  char why[256];
  if (st__mpool_new(&pc, &c->pool, why, sizeof why) != ST_OK) {
    ST_LOG_W("pool", "conn %llu: no result pool: %s", (unsigned long long)c->id, why);
    uid_drop(acct);
  }
}

void st__pool_conn_job(const st__endpoint_decl_t *ep, st__conn_t *c, st__job_t *job) {
  /* Objects other connections can be handed (cached, singleflight) keep
   * arenas of their own; a managed object is its caller's alone, so it
   * may sit in the caller's slabs (its lease and refcount unchanged: the
   * region returns once the object is gone and the client freed it). */
  if (ep->cache || ep->singleflight) return;
  if (!c || c->dead || !c->pool) return;
  st__mpool_ref(c->pool);
  job->alloc_pool = c->pool;
}

void st__pool_conn_prepare(struct st__vm *vm, const st__job_t *job) {
  st__vm_prepare(vm, job);
  st__mpool_use(job->alloc_pool);
}

int st__pool_reply_prepare(st__conn_t *c, const st__build_result_t *r, int obj,
                           st__pool_reply_t *pr, char *err, size_t errlen) {
  pr->n = r->narenas;
  pr->page = 0;
  memset(pr->readonly, 0, sizeof pr->readonly);
  for (size_t i = 0; i < r->narenas; i++) {
    st__arena_t *a = r->arenas[i];
    pr->arenas[i] = a;
    pr->own[i] = 0;
    pr->pooled[i] = 0;
    pr->ref[i] = 0;
    void *owner;
    uint32_t slot;
    if (!st__arena_region(a, &owner, &slot)) {
      pr->ref[i] = obj && st__arena_has_fd(a) &&
                   st__keptset_has(&c->kept_arenas, st__arena_id(a));
      continue;
    }
    if (c->pool && st__mpool_describe(c->pool, a, &pr->desc[i])) {
      pr->pooled[i] = 1;
      /* One descriptor per slab per reply: a later region of a slab sent
       * in this reply finds the mapping its first region made. */
      for (size_t k = 0; k < i && pr->desc[i].send_slab; k++)
        if (pr->pooled[k] && pr->desc[k].slab_id == pr->desc[i].slab_id) pr->desc[i].send_slab = 0;
      continue;
    }
    /* Not this connection's to receive as a region: a copy of its own. */
    int rc = st__mpool_copy_out(a, &pr->arenas[i], err, errlen);
    if (rc != ST_OK) {
      pr->arenas[i] = a;
      pr->n = i;
      st__pool_reply_done(c, pr, 0);
      return rc;
    }
    pr->own[i] = 1;
  }
  if (c->pool) {
    int sent;
    st__mpool_page(c->pool, &sent);
    for (size_t i = 0; i < pr->n && !sent && !pr->page; i++) pr->page = pr->pooled[i];
  }
  return ST_OK;
}

void st__pool_reply_count(const st__pool_reply_t *pr, int *nfds, uint64_t *pinned) {
  *nfds = pr->page;
  *pinned = 0;
  for (size_t i = 0; i < pr->n; i++) {
    if (pr->pooled[i]) {
      *nfds += pr->desc[i].send_slab;
    } else if (!pr->ref[i] && st__arena_has_fd(pr->arenas[i])) {
      (*nfds)++;
      *pinned += st__arena_bytes(pr->arenas[i]);
    }
  }
}

int st__pool_reply_fds(st__conn_t *c, const st__pool_reply_t *pr, int *fds, int *nfds, char *err,
                       size_t errlen) {
  for (size_t i = 0; i < pr->n; i++) {
    const st__arena_t *a = pr->pooled[i] ? pr->desc[i].slab : pr->arenas[i];
    if (pr->ref[i] || (pr->pooled[i] ? !pr->desc[i].send_slab : !st__arena_has_fd(a))) continue;
    st__prof_begin(ST_PROF_DUP);
    int fd = pr->readonly[i] && !pr->pooled[i] ? st__arena_dup_fd_readonly(a, err, errlen)
                                            : st__arena_dup_fd(a, err, errlen);
    st__prof_end();
    if (fd < 0) return fd;
    fds[(*nfds)++] = fd;
  }
  if (pr->page) {
    int sent;
    int fd = st__arena_dup_fd(st__mpool_page(c->pool, &sent), err, errlen);
    if (fd < 0) return fd;
    fds[(*nfds)++] = fd;
  }
  return ST_OK;
}

/* A region's arena entry: {fd?, bytes, device, uuid?, backend, id, pool}:
 * its slab's description (a memfd, or a VMM allocation on a device named
 * by UUID) with the region's place in it (pool: {slab, offset, size,
 * slot, gen}; slab: the index whose bit in the page's `retired` word says
 * the server dropped the slab). */
static void pack_region(msgpack_packer *pk, const st__mpool_desc_t *d, uint32_t fd) {
  st__arena_desc_t a;
  memset(&a, 0, sizeof a);
  st__arena_describe(d->slab, &a);
  a.bytes = d->slab_bytes;
  a.id = d->slab_id;
  a.fd = fd;
  a.no_fd = !d->send_slab;
  st__pack_arena_open(pk, &a, 1);
  st__pack_cstr(pk, "pool");
  msgpack_pack_map(pk, 5);
  st__pack_kv_uint(pk, "slab", d->slab_index);
  st__pack_kv_uint(pk, "offset", d->offset);
  st__pack_kv_uint(pk, "size", d->size);
  st__pack_kv_uint(pk, "slot", d->slot);
  st__pack_kv_uint(pk, "gen", d->gen);
}

void st__pool_reply_pack(st__conn_t *c, msgpack_packer *pk, const st__pool_reply_t *pr) {
  (void)c;
  msgpack_pack_array(pk, pr->n);
  uint32_t next_fd = 0;
  for (size_t i = 0; i < pr->n; i++) {
    if (pr->pooled[i]) {
      pack_region(pk, &pr->desc[i], next_fd);
      next_fd += pr->desc[i].send_slab;
      continue;
    }
    if (pr->ref[i]) {
      msgpack_pack_map(pk, 1);
      if (pr->arg[i]) st__pack_kv_uint(pk, "arg", pr->arg[i] - 1);
      else st__pack_kv_uint(pk, "ref", st__arena_id(pr->arenas[i]));
      continue;
    }
    st__arena_desc_t d;
    memset(&d, 0, sizeof d);
    st__arena_describe(pr->arenas[i], &d);
    if (!d.legacy) d.fd = next_fd++;   /* its index among the fds sent */
    d.readonly = pr->readonly[i];
    st__pack_arena(pk, &d);
  }
}

void st__pool_reply_pack_page(st__conn_t *c, msgpack_packer *pk, const st__pool_reply_t *pr,
                              uint32_t fd_index) {
  if (!pr->page) return;
  int sent;
  const st__arena_t *page = st__mpool_page(c->pool, &sent);
  st__pack_cstr(pk, "pool_page");
  msgpack_pack_map(pk, 4);
  st__pack_kv_uint(pk, "fd", fd_index);
  st__pack_kv_uint(pk, "bytes", st__arena_bytes(page));
  st__pack_kv_uint(pk, "id", st__arena_id(page));
  st__pack_kv_uint(pk, "slots", st__mpool_slots(c->pool));
}

void st__pool_reply_done(st__conn_t *c, st__pool_reply_t *pr, int sent) {
  for (size_t i = 0; i < pr->n; i++) {
    if (pr->own[i]) st__arena_unref(pr->arenas[i]);
    else if (sent && pr->pooled[i]) st__mpool_handed(c->pool, pr->arenas[i]);
  }
  if (sent && pr->page) st__mpool_page_sent(c->pool);
}

/* ------------------------------------------------------------- holdings */

/* The connection's reference to its pool; regions still in use keep
 * their slabs. */
static void result_pool_release(st__server_t *srv, st__conn_t *c) {
  (void)srv;
  st__mpool_close(c->pool);
  c->pool = NULL;
}

/* items: the pool's slabs; bytes: their bytes (every device). */
static void result_pool_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  (void)srv;
  if (!c->pool) return;
  uint32_t slabs;
  n->bytes = st__mpool_bytes(c->pool, &slabs);
  n->items = slabs;
}

const st__holding_kind_t st__holding_result_pool = {
    .name = "result_pool", .release = result_pool_release, .count = result_pool_count};

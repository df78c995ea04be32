/* src/server: a connection's argument cache of tensor arguments (conn.h,
 * "argcache.c"; docs/pool.md, section 4). The table itself is
 * engine/argcache.h; here are its limits and its accounting: each entry
 * holds one descriptor (the received one, then the imported arena's), so
 * it counts in the connection's holdings and the server's held_fds like a
 * descriptor no request claimed yet. Loop thread only.
 */
#include <stdio.h>

#include "common/log.h"
#include "engine/targs.h"
#include "server/holdings.h"
#include "server/conn.h"
#include "st/errors.h"

/* After the table went from `before` entries to its size now: the
 * server's count of held descriptors follows. */
static void account(st__conn_t *c, size_t before) {
  size_t now = c->argcache.n;
  if (now >= before) c->srv->held_fds += now - before;
  else c->srv->held_fds -= before - now;
}

/* See conn.h. Loop thread. */
int st__conn_argcache_evict_one(st__conn_t *c) {
  size_t before = c->argcache.n;
  int dropped = st__argcache_evict_lru(&c->argcache);
  account(c, before);
  return dropped;
}

/* Whether one more entry fits the connection's and the server's
 * descriptor limits, evicting this connection's least recently used
 * entries until it does (or none is left). */
static int room_for_one(st__conn_t *c) {
  const st__config_t *cfg = c->srv->cfg;
  if (cfg->max_cached_arguments <= 0) return 0;
  while ((int)c->argcache.n >= cfg->max_cached_arguments ||
         c->out_fds + c->rx_held + (int)c->argcache.n + 1 > cfg->max_fds_per_connection ||
         c->srv->held_fds + 1 > (uint64_t)cfg->max_fds_all_connections) {
    if (!st__conn_argcache_evict_one(c)) return 0;
  }
  return 1;
}

/* See conn.h. Loop thread. */
void st__conn_argcache_keep(st__conn_t *c, const st__targs_t *t) {
  for (size_t i = 0; i < t->n; i++) {
    const st__arena_desc_t *d = &t->descs[i];
    if (!d->arg_id || d->no_fd) continue;
    /* A resend replaces the entry of its id. */
    size_t before = c->argcache.n;
    st__argcache_forget(&c->argcache, d->arg_id);
    account(c, before);
    if (!room_for_one(c)) {
      ST_LOG_D("conn", "conn %llu: tensor argument %llu not kept (limits)",
               (unsigned long long)c->id, (unsigned long long)d->arg_id);
      continue;
    }
    before = c->argcache.n;
    if (st__argcache_put(&c->argcache, d->arg_id, t->srcs[i]) != ST_OK)
      ST_LOG_W("conn", "conn %llu: out of memory keeping tensor argument %llu",
               (unsigned long long)c->id, (unsigned long long)d->arg_id);
    account(c, before);
  }
}

/* See conn.h. Loop thread. */
int st__conn_argcache_forget(st__conn_t *c, const msgpack_object *params, char *err,
                          size_t errlen) {
  const msgpack_object *f;
  int rc = st__map_get_ids(params, "forget", "arg ids", &f, err, errlen);
  if (rc != ST_OK || !f) return rc;
  size_t before = c->argcache.n;
  for (uint32_t i = 0; i < f->via.array.size; i++)
    st__argcache_forget(&c->argcache, f->via.array.ptr[i].via.u64);
  account(c, before);
  return ST_OK;
}

/* See conn.h. Loop thread. */
void st__conn_argcache_drop_all(st__conn_t *c) {
  size_t before = c->argcache.n;
  st__argcache_clear(&c->argcache);
  account(c, before);
}

/* ------------------------------------------------------------- holdings */

static void argument_cache_release(st__server_t *srv, st__conn_t *c) {
  (void)srv;
  st__conn_argcache_drop_all(c);
}

/* Each entry holds one descriptor (limits.max_fds_per_connection). */
static void argument_cache_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  (void)srv;
  n->items = c->argcache.n;
  n->fds = c->argcache.n;
}

/* Each entry's descriptor counts in the server's held_fds. */
static int argument_cache_none(st__server_t *srv) { return !srv->held_fds; }

const st__holding_kind_t st__holding_argument_cache = {.name = "argument_cache",
                                                       .release = argument_cache_release,
                                                       .count = argument_cache_count,
                                                       .limits_fds = 1,
                                                       .none = argument_cache_none};

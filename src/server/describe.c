/* src/server: the result maps of hello, info and endpoints
 * (docs/protocol.md, "Methods"). Loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/pool_conn.h"
#include "common/clock.h"
#include "engine/bind.h"
#include "engine/options.h"
#include "mem/arena.h"
#include "mem/arena_release.h"
#include "mem/cuda.h"
#include "mem/ledger.h"
#include "mem/pool.h"
#include "st/errors.h"
#include "peer/peer.h"
#include "server/remote.h"
#include "server/restart.h"
#include "server/holdings.h"
#include "server/work.h"
#include "st/wire.h"

/* Packs the device list of hello and info. Loop thread. */
static void describe_devices(msgpack_packer *pk, const st__devices_t *d) {
  msgpack_pack_array(pk, (size_t)d->count);
  for (int i = 0; i < d->count; i++) {
    const st__device_t *dev = &d->list[i];
    msgpack_pack_map(pk, 6);
    st__pack_kv_int(pk, "index", dev->index);
    st__pack_kv_str(pk, "kind", dev->kind);
    st__pack_kv_str(pk, "name", dev->name);
    st__pack_kv_str(pk, "uuid", dev->uuid);
    st__pack_kv_uint(pk, "memory_bytes", dev->memory_bytes);
    st__pack_kv_bool(pk, "gpudirect_rdma", dev->gpudirect_rdma);
  }
}

static void pack_limits(msgpack_packer *pk, const st__config_t *cfg, int full) {
  msgpack_pack_map(pk, full ? 11 : 2);
  st__pack_kv_uint(pk, "max_message_bytes", cfg->max_message_bytes);
  st__pack_kv_int(pk, "max_inflight", cfg->max_inflight);
  if (!full) return;
  st__pack_kv_int(pk, "max_connections", cfg->max_connections);
  st__pack_kv_int(pk, "frame_timeout_ms", cfg->frame_timeout_ms);
  st__pack_kv_uint(pk, "max_object_bytes", cfg->max_object_bytes);
  st__pack_kv_double(pk, "shutdown_grace_s", cfg->shutdown_grace_s);
  st__pack_kv_int(pk, "max_fds_per_connection", cfg->max_fds_per_connection);
  st__pack_kv_int(pk, "max_fds_all_connections", cfg->max_fds_all_connections);
  st__pack_kv_uint(pk, "max_queued_bytes_per_connection", cfg->max_queued_bytes_per_connection);
  st__pack_kv_uint(pk, "max_queued_bytes_all_connections",
                   cfg->max_queued_bytes_all_connections);
  st__pack_kv_int(pk, "max_cached_arguments", cfg->max_cached_arguments);
}

/* Packs the result of hello for a connection on socket `device`. */
void st__describe_hello(msgpack_packer *pk, st__server_t *srv, int device) {
  msgpack_pack_map(pk, 8);
  st__pack_kv_int(pk, "protocol", ST_PROTOCOL_VERSION);
  st__pack_kv_str(pk, "version", ST_VERSION_STRING);
  st__pack_kv_str(pk, "server_id", srv->server_id);
  st__pack_kv_int(pk, "pid", (int)getpid());
  st__pack_kv_int(pk, "device", device);
  st__pack_cstr(pk, "devices");
  describe_devices(pk, &srv->devices);
  st__pack_cstr(pk, "limits");
  pack_limits(pk, srv->cfg, 0);
  /* What this server does beyond protocol 1's first form: "arg_cache",
   * tensor arguments named by arg_id (docs/protocol.md), unless
   * limits.max_cached_arguments is 0; "arena_refs", arenas of objects
   * sent once per connection to a client that asks for it; "object_refs",
   * cached objects' results sent once per connection likewise;
   * "release_notify", `release` taken as a notification too (no reply). */
  int arg_cache = srv->cfg->max_cached_arguments > 0;
  /* "pool": result pools (docs/pool.md), unless pool.max_regions is 0. */
  int pool = st__pool_offered(srv);
  st__pack_cstr(pk, "features");
  msgpack_pack_array(pk, (uint32_t)(arg_cache + pool) + 3);
  if (arg_cache) st__pack_cstr(pk, "arg_cache");
  st__pack_cstr(pk, "arena_refs");
  st__pack_cstr(pk, "object_refs");
  st__pack_cstr(pk, "release_notify");
  if (pool) st__pack_cstr(pk, "pool");
}

/* Requests in flight, of every method (`all`) and of `call`. */
static void inflight_counts(const st__stats_t *s, uint64_t *all, uint64_t *calls) {
  *all = 0;
  for (size_t i = 0; i <= ST__STATS_NMETHODS; i++) *all += s->methods[i].inflight;
  *calls = s->call_method >= 0 ? s->methods[s->call_method].inflight : 0;
}

static void pack_counters(msgpack_packer *pk, const st__server_t *srv) {
  const st__counters_t *c = &srv->counters;
  const st__objects_t *o = &srv->objects;
  uint64_t inflight, calls_inflight;
  inflight_counts(&srv->stats, &inflight, &calls_inflight);
#define COUNTERS(X)                                                                        \
  X(requests) X(requests_ok) X(errors) X(requests_dropped) X(calls) X(calls_ok)            \
  X(calls_failed) X(calls_dropped) X(notifications)                                        \
  X(bytes_received) X(bytes_sent) X(fds_sent) X(fds_received) X(connections)               \
  X(auth_refused) X(limit_refused) X(protocol_errors) X(busy) X(timeouts) X(read_pauses)  \
  X(sliced_decodes)                                                                        \
  X(reloads) X(reload_failures) X(builds) X(cache_hits) X(cache_misses) X(joins)           \
  X(views_on_workers) X(puts_on_workers)                                                   \
  X(tasks_submitted) X(tasks_completed) X(tasks_failed) X(tasks_cancelled)                 \
  X(tasks_expired) X(releases) X(leases_dropped) X(invalidations)
#define COUNT(name) +1
  msgpack_pack_map(pk, 7 COUNTERS(COUNT));
#define PACK(name) st__pack_kv_uint(pk, #name, c->name);
  COUNTERS(PACK)
  st__pack_kv_uint(pk, "evictions", o->evictions);
  st__ledger_stats_t l;
  st__ledger_stats(-1, &l);
  st__pack_kv_uint(pk, "budget_refusals", l.refusals);
  st__pack_kv_uint(pk, "objects_created", o->created);
  st__pack_kv_uint(pk, "leases_granted", o->leases_granted);
  /* Results of a full result pool that got an arena of their own. */
  st__mpool_stats_t ps;
  st__mpool_stats(&ps);
  st__pack_kv_uint(pk, "pool_fallbacks", ps.fallbacks);
  /* Gauges beside the counters they balance (requests, calls). */
  st__pack_kv_uint(pk, "requests_inflight", inflight);
  st__pack_kv_uint(pk, "calls_inflight", calls_inflight);
#undef PACK
#undef COUNT
#undef COUNTERS
}

/* methods = {call = {requests, ok, failed, dropped, inflight}, ...} for
 * every method asked at least once ("" for unknown method names), and
 * errors_by_name = {NOT_FOUND = n, ...} for every error replied at least
 * once. */
static void pack_methods(msgpack_packer *pk, const st__stats_t *s) {
  size_t n = 0;
  for (size_t i = 0; i <= ST__STATS_NMETHODS; i++) n += s->methods[i].requests > 0;
  st__pack_cstr(pk, "methods");
  msgpack_pack_map(pk, n);
  for (size_t i = 0; i <= ST__STATS_NMETHODS; i++) {
    const st__method_stats_t *m = &s->methods[i];
    if (!m->requests) continue;
    st__pack_cstr(pk, i < s->nmethods ? s->method_names[i] : "");
    msgpack_pack_map(pk, 5);
    st__pack_kv_uint(pk, "requests", m->requests);
    st__pack_kv_uint(pk, "ok", m->ok);
    st__pack_kv_uint(pk, "failed", m->failed);
    st__pack_kv_uint(pk, "dropped", m->dropped);
    st__pack_kv_uint(pk, "inflight", m->inflight);
  }
  n = 0;
  for (size_t i = 0; i <= (size_t)-ST_ERR_MIN; i++) n += s->errors_by_code[i] > 0;
  st__pack_cstr(pk, "errors_by_name");
  msgpack_pack_map(pk, n);
  for (size_t i = 0; i <= (size_t)-ST_ERR_MIN; i++)
    if (s->errors_by_code[i]) st__pack_kv_uint(pk, st_err_name(i ? -(int)i : 1), s->errors_by_code[i]);
}

/* objects = {count, leases, bytes}: what the server holds now. */
static void pack_objects(msgpack_packer *pk, const st__objects_t *r) {
  st__pack_cstr(pk, "objects");
  msgpack_pack_map(pk, 3);
  st__pack_kv_uint(pk, "count", r->count);
  st__pack_kv_uint(pk, "leases", r->leases);
  st__pack_kv_uint(pk, "bytes", r->bytes);
}

/* keys = {count, versions, bytes, puts, evictions}: the published keys now
 * (docs/keys.md), and versions made and evicted since start. */
static void pack_keys(msgpack_packer *pk, const st__keys_t *t) {
  st__pack_cstr(pk, "keys");
  msgpack_pack_map(pk, 5);
  st__pack_kv_uint(pk, "count", t->count);
  st__pack_kv_uint(pk, "versions", t->versions);
  st__pack_kv_uint(pk, "bytes", t->bytes);
  st__pack_kv_uint(pk, "puts", t->puts);
  st__pack_kv_uint(pk, "evictions", t->evictions);
}

/* A device's free and total bytes, sampled (cuMemGetInfo, a driver
 * round trip) at most every MEM_SAMPLE_S, and at once when this server's
 * own charge on the device moved since the last sample: what the server
 * allocates and frees shows in the next info; what other processes do
 * shows within MEM_SAMPLE_S. Loop thread (info is packed there only). */
#define MEM_SAMPLE_S 0.1

/* How long info waits at most for the releases in flight. */
#define ST__INFO_SETTLE_S 1u
typedef struct mem_sample {
  double at;              /* st__now_mono of the sample; 0: none yet */
  uint64_t charged;       /* the ledger's bytes on the device then */
  uint64_t free_b, total_b;
  int known;              /* free_b is the driver's */
} mem_sample_t;

/* What the fixed pairs are packed from. */
typedef struct info_inputs {
  const st__config_t *cfg;
  const st__generation_t *gen;
  uint64_t gen_number;
  uint64_t reload_ends;   /* reloads + reload_failures: last_reload moved */
  int last_reload_done;
  int nlisteners, workers, ndevices, cuda_count;
} info_inputs_t;

/* info's state kept between two calls (srv->info_fixed). */
struct st__info_fixed {
  info_inputs_t in;       /* what sb was packed from */
  msgpack_sbuffer sb;     /* the fixed pairs, packed */
  int failed;             /* out of memory while packing: sb is not whole */
  mem_sample_t mem[ST_LEDGER_SLOTS - 1];   /* by CUDA ordinal */
};

/* Device dev's sample: f's, taken again when stale; a new one in
 * *scratch when there is no f (out of memory). */
static const mem_sample_t *mem_sample(struct st__info_fixed *f, const st__device_t *dev,
                                      mem_sample_t *scratch) {
  int cached = f && dev->index >= 0 && dev->index < ST_LEDGER_SLOTS - 1;
  mem_sample_t *m = cached ? &f->mem[dev->index] : scratch;
  if (!cached) memset(m, 0, sizeof *m);
  st__ledger_stats_t l;
  st__ledger_stats(dev->index, &l);
  double now = st__now_mono();
  if (m->at > 0 && m->known && now - m->at < MEM_SAMPLE_S && l.used == m->charged) return m;
  m->free_b = 0;
  m->total_b = dev->memory_bytes;
  m->known = st__cuda_ctx_ready(dev->index) &&
             st__cuda_mem_info(dev->index, &m->free_b, &m->total_b, NULL, 0) == ST_OK;
  m->at = now;
  m->charged = l.used;
  return m;
}

/* memory = {cpu = {budget, used_bytes, object_bytes, cached_bytes,
 * leased_bytes, task_bytes, objects, pool_bytes}, ...}: one entry per
 * device with a budget or objects. CUDA devices the server has add
 * free_bytes and total_bytes (cuMemGetInfo, sampled: mem_sample;
 * free_bytes is nil until this process holds the device's context, which
 * it takes at start for the sockets' devices and on a worker's first CUDA
 * job otherwise) and pool_bytes, the slab bytes of the result pools on
 * that device. */
static void pack_memory(msgpack_packer *pk, st__server_t *srv) {
  const st__objects_t *r = &srv->objects;
  st__pack_cstr(pk, "memory");
  msgpack_pack_map(pk, (size_t)r->nbudgets);
  for (int i = 0; i < r->nbudgets; i++) {
    st__budget_stats_t s;
    st__objects_stats(r, r->budgets[i].device, &s);
    st__pack_cstr(pk, r->budgets[i].device);
    const st__device_t *dev = strncmp(r->budgets[i].device, "cuda:", 5) == 0
                                  ? st__devices_cuda(&srv->devices, atoi(r->budgets[i].device + 5))
                                  : NULL;
    int cpu = strcmp(r->budgets[i].device, "cpu") == 0;
    msgpack_pack_map(pk, (dev ? 10 : 7) + cpu);
    if (dev) {
      mem_sample_t scratch;
      const mem_sample_t *m = mem_sample(srv->info_fixed, dev, &scratch);
      st__pack_cstr(pk, "free_bytes");
      if (m->known) msgpack_pack_uint64(pk, m->free_b);
      else msgpack_pack_nil(pk);
      st__pack_kv_uint(pk, "total_bytes", m->total_b);
      st__pack_kv_uint(pk, "pool_bytes", st__mpool_device_bytes(dev->index));
    }
    st__pack_kv_uint(pk, "budget", s.budget);
    st__pack_kv_uint(pk, "used_bytes", s.used_bytes);
    st__pack_kv_uint(pk, "object_bytes", s.object_bytes);
    st__pack_kv_uint(pk, "cached_bytes", s.cached_bytes);
    st__pack_kv_uint(pk, "leased_bytes", s.leased_bytes);
    st__pack_kv_uint(pk, "task_bytes", s.task_bytes);
    st__pack_kv_uint(pk, "objects", s.objects);
    if (cpu) {   /* slabs of the connections' result pools (CPU only) */
      st__mpool_stats_t ps;
      st__mpool_stats(&ps);
      st__pack_kv_uint(pk, "pool_bytes", ps.bytes);
    }
  }
}

/* tasks = {pending, running, completed, failed, cancelled, total}. */
static void pack_tasks(msgpack_packer *pk, st__server_t *srv) {
  st__work_t *w = srv->work;
  st__pack_cstr(pk, "tasks");
  msgpack_pack_map(pk, ST_TASK_NSTATES + 1);
  st__tasks_refresh(srv);   /* pending tasks a worker took are running */
  for (int s = 0; s < ST_TASK_NSTATES; s++) {
    st__pack_cstr(pk, st__task_status_name((st__task_status_t)s));
    msgpack_pack_uint64(pk, w ? w->nstatus[s] : 0);
  }
  st__pack_kv_uint(pk, "total", w ? w->ntasks : 0);
}

/* ------------------------------------------------------ info's fixed pairs
 *
 * The pairs of info that change only at start or on a reload are packed
 * once into srv->info_fixed and copied into each reply as raw msgpack
 * (a map is its count followed by its pairs). They are packed again when
 * any input they come from differs from the last packing. */

static void info_inputs(const st__server_t *srv, info_inputs_t *in) {
  memset(in, 0, sizeof *in);   /* padding too: the inputs compare as bytes */
  in->cfg = srv->cfg;
  in->gen = srv->gen;
  in->gen_number = srv->gen ? srv->gen->number : 0;
  in->reload_ends = srv->counters.reloads + srv->counters.reload_failures;
  in->last_reload_done = srv->last_reload_done;
  in->nlisteners = srv->nlisteners;
  in->workers = srv->workers ? st__workers_size(srv->workers) : 0;
  in->ndevices = srv->devices.count;
  in->cuda_count = srv->devices.cuda_count;
}

/* The fixed pairs: nine whole ones, then "generation" with its map open
 * and five of its six pairs; the caller packs the sixth, reloading. */
enum { INFO_FIXED_PAIRS = 10 };
static void pack_fixed(msgpack_packer *pk, const st__server_t *srv) {
  const st__config_t *cfg = srv->cfg;
  st__pack_kv_str(pk, "server_id", srv->server_id);
  st__pack_kv_str(pk, "version", ST_VERSION_STRING);
  st__pack_kv_int(pk, "protocol", ST_PROTOCOL_VERSION);
  st__pack_kv_int(pk, "pid", (int)getpid());
  st__pack_cstr(pk, "devices");
  describe_devices(pk, &srv->devices);
  st__pack_cstr(pk, "cuda");
  msgpack_pack_map(pk, 2);
  st__pack_kv_int(pk, "devices", srv->devices.cuda_count);
  st__pack_kv_str(pk, "reason", srv->devices.cuda_count ? NULL : srv->devices.cuda_reason);
  st__pack_cstr(pk, "sockets");
  msgpack_pack_array(pk, (size_t)srv->nlisteners);
  for (int i = 0; i < srv->nlisteners; i++) {
    msgpack_pack_map(pk, 2);
    st__pack_kv_int(pk, "device", srv->listeners[i].device);
    st__pack_kv_str(pk, "path", srv->listeners[i].path);
  }
  st__pack_cstr(pk, "limits");
  pack_limits(pk, cfg, 1);
  st__pack_kv_int(pk, "workers", srv->workers ? st__workers_size(srv->workers) : 0);

  st__pack_cstr(pk, "generation");
  msgpack_pack_map(pk, 6);
  st__pack_kv_uint(pk, "number", srv->gen ? srv->gen->number : 0);
  st__pack_kv_double(pk, "loaded_at", srv->gen ? srv->gen->loaded_at : 0.0);
  st__pack_kv_uint(pk, "endpoints", srv->gen ? srv->gen->nendpoints : 0);
  st__pack_kv_str(pk, "dir", cfg->endpoints_dir);
  st__pack_cstr(pk, "last_reload");
  if (!srv->last_reload_done) {
    msgpack_pack_nil(pk);
  } else {
    msgpack_pack_map(pk, 3);
    st__pack_kv_bool(pk, "ok", srv->last_reload_ok);
    st__pack_kv_str(pk, "error", srv->last_reload_error);
    st__pack_kv_double(pk, "at", srv->last_reload_at);
  }
}

static int fixed_write(void *data, const char *buf, size_t len) {
  struct st__info_fixed *f = data;
  if (msgpack_sbuffer_write(&f->sb, buf, len) != 0) f->failed = 1;
  return 0;
}

/* The packed fixed pairs, packed again when their inputs moved; NULL when
 * memory ran out (the caller packs them itself). */
static const msgpack_sbuffer *info_fixed(st__server_t *srv) {
  info_inputs_t in;
  info_inputs(srv, &in);
  struct st__info_fixed *f = srv->info_fixed;
  if (f && !f->failed && memcmp(&f->in, &in, sizeof in) == 0) return &f->sb;
  if (!f) {
    f = calloc(1, sizeof *f);
    if (!f) return NULL;
    msgpack_sbuffer_init(&f->sb);
    srv->info_fixed = f;
  }
  f->sb.size = 0;
  f->failed = 0;
  msgpack_packer fp;
  msgpack_packer_init(&fp, f, fixed_write);
  pack_fixed(&fp, srv);
  memcpy(&f->in, &in, sizeof in);   /* padding included */
  return f->failed ? NULL : &f->sb;
}

/* See server.h. Loop thread. */
void st__describe_free(st__server_t *srv) {
  struct st__info_fixed *f = srv->info_fixed;
  srv->info_fixed = NULL;
  if (!f) return;
  msgpack_sbuffer_destroy(&f->sb);
  free(f);
}

/* Packs the result of info (docs/protocol.md): the fixed pairs, then
 * those that move between two calls. Loop thread. */
void st__describe_info(msgpack_packer *pk, st__server_t *srv) {
  msgpack_pack_map(pk, INFO_FIXED_PAIRS + 18);
  const msgpack_sbuffer *fixed = info_fixed(srv);
  if (fixed) pk->callback(pk->data, fixed->data, fixed->size);
  else pack_fixed(pk, srv);
  st__pack_kv_bool(pk, "reloading", st__reload_pending(srv));   /* generation's last */

  st__pack_kv_double(pk, "uptime_s", st__now_mono() - srv->started_mono);
  st__pack_kv_bool(pk, "ready", srv->gen && !srv->shutting_down);
  st__pack_kv_int(pk, "connections", srv->nconns);
  st__pack_kv_uint(pk, "inflight", srv->workers ? st__workers_outstanding(srv->workers, -1) : 0);
  st__pack_kv_uint(pk, "waiting", srv->work ? srv->work->nwaiting : 0);
  st__pack_cstr(pk, "counters");
  pack_counters(pk, srv);
  pack_methods(pk, &srv->stats);   /* methods, errors_by_name */
  st__pack_cstr(pk, "held");
  msgpack_pack_map(pk, 2);
  st__pack_kv_uint(pk, "fds", srv->held_fds);
  st__pack_kv_uint(pk, "bytes", srv->held_bytes);
  st__pack_cstr(pk, "holdings");   /* per connection (holdings.h) */
  st__holdings_pack(pk, srv);

  /* Settled figures: the releases the loops handed off are done first
   * (mem/arena_release.h; a short wait, bounded by what the budgets let
   * be queued), so that what info says the server holds, it holds. */
  st__arena_release_settle(ST__INFO_SETTLE_S);
  uint64_t count = 0, bytes = 0, releasing = 0, deferred = 0;
  st__arena_stats(&count, &bytes);
  st__arena_release_stats(&releasing, &deferred);
  st__ledger_stats_t l;
  st__ledger_stats(-1, &l);
  st__pack_cstr(pk, "arenas");
  msgpack_pack_map(pk, 6);
  st__pack_kv_uint(pk, "count", count);
  st__pack_kv_uint(pk, "bytes", bytes);
  st__pack_kv_uint(pk, "fds", l.fds);
  st__pack_kv_uint(pk, "max_fds", l.fd_cap);
  st__pack_kv_uint(pk, "releasing", releasing);
  st__pack_kv_uint(pk, "released_off_loop", deferred);

  pack_objects(pk, &srv->objects);
  pack_keys(pk, &srv->keys);
  pack_memory(pk, srv);
  pack_tasks(pk, srv);
  st__pack_cstr(pk, "peer");
  st__peer_pack_info(pk, srv->peer, &srv->cfg->peer);
  st__pack_cstr(pk, "transfers");
  st__remote_pack_info(pk, srv);
  st__pack_cstr(pk, "restart");   /* restart.h */
  st__restart_pack_info(srv, pk);
}

/* Packs the result of endpoints: every declaration of gen, sorted. Each
 * map carries every endpoint option (engine/options.h) under its name,
 * and non_default names those whose value is not the default. */
void st__describe_endpoints(msgpack_packer *pk, const st__generation_t *gen) {
  size_t n = gen ? gen->nendpoints : 0;
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) {
    const st__endpoint_decl_t *ep = &gen->endpoints[i];
    msgpack_pack_map(pk, 9 + ST__ENDPOINT_NOPTIONS);
    st__pack_kv_str(pk, "name", ep->name);
    st__pack_kv_str(pk, "file", ep->file);
    st__pack_kv_int(pk, "line", ep->line);
    size_t changed = 0;
    for (size_t k = 0; k < ST__ENDPOINT_NOPTIONS; k++) {
      const st__option_t *o = &st__endpoint_options[k];
      st__pack_cstr(pk, o->name);
      st__option_pack(pk, o, ep);
      changed += !st__option_is_default(o, ep);
    }
    st__pack_cstr(pk, "non_default");
    msgpack_pack_array(pk, changed);
    for (size_t k = 0; k < ST__ENDPOINT_NOPTIONS; k++)
      if (!st__option_is_default(&st__endpoint_options[k], ep))
        st__pack_cstr(pk, st__endpoint_options[k].name);
    /* params: every parameter, with its default (nil for required ones). */
    st__pack_cstr(pk, "params");
    msgpack_pack_map(pk, ep->nparams);
    size_t nrequired = 0;
    for (size_t k = 0; k < ep->nparams; k++) {
      const st__param_t *p = &ep->params[k];
      st__pack_cstr(pk, p->name);
      if (p->required || !p->default_mp) {
        msgpack_pack_nil(pk);
        nrequired++;
      } else {
        pk->callback(pk->data, p->default_mp, p->default_len);
      }
    }
    st__pack_cstr(pk, "required");
    msgpack_pack_array(pk, nrequired);
    for (size_t k = 0; k < ep->nparams; k++)
      if (ep->params[k].required || !ep->params[k].default_mp)
        st__pack_cstr(pk, ep->params[k].name);
    st__pack_cstr(pk, "types");
    msgpack_pack_map(pk, ep->nparams);
    for (size_t k = 0; k < ep->nparams; k++) {
      const st__param_t *p = &ep->params[k];
      st__pack_cstr(pk, p->name);
      if (p->type == ST_PARAM_TENSOR) {
        /* "tensor(float32, cuda)"; "any" for an open constraint */
        char t[64];
        snprintf(t, sizeof t, "tensor(%s, %s)",
                 p->tensor_dtype >= 0 ? st_dtype_name((st_dtype_t)p->tensor_dtype) : "any",
                 p->tensor_device == ST_TDEV_CPU    ? "cpu"
                 : p->tensor_device == ST_TDEV_CUDA ? "cuda"
                                                    : "any");
        st__pack_cstr(pk, t);
      } else {
        st__pack_cstr(pk, st__param_type_name(p->type));
      }
    }
    st__pack_kv_str(pk, "doc", ep->doc);
    st__pack_cstr(pk, "fingerprint");
    char fp[17];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)ep->fingerprint);
    st__pack_cstr(pk, fp);
  }
}

/* src/server: the server's life (server.h): start, the loop's own
 * watchers (completions from the workers, reaping closed connections, the
 * check that ends a drained shutdown), and the teardown. Reloads are
 * reload.c's, shutdowns shutdown.c's. Loop thread only. */
#include "server/pool_conn.h"
#include "common/clock.h"
#include "server/holdings.h"
#include "server/server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/spin.h"
#include "lua/st_lua.h"
#include "mem/arena.h"
#include "mem/arena_release.h"
#include "mem/safetensors.h"
#include "mem/uidq.h"
#include "peer/peer.h"
#include "server/remote.h"
#include "server/conn.h"
#include "server/loopprof.h"
#include "server/put_job.h"
#include "server/reclaim.h"
#include "server/restart.h"
#include "server/rpc.h"
#include "server/takeover.h"
#include "server/views.h"
#include "server/work.h"
#include "st/errors.h"
#include "st/wire.h"


/* Sets the per-uid quotas cfg makes (mem/uidq.h) and logs them. */
static void configure_quotas(const st__config_t *cfg) {
  uint64_t q[ST__UIDQ_NKINDS], nofile = 0;
  int lowered = 0;
  st__config_quotas(cfg, st__reclaim_fd_cap(cfg->max_arena_fds, &nofile), q, &lowered);
  st__uidq_reset();
  st__uidq_configure(q, geteuid());
  char line[512];
  size_t n = 0;
  for (int k = 0; k < ST__UIDQ_NKINDS && n < sizeof line; k++)
    n += (size_t)snprintf(line + n, sizeof line - n, "%s%s %llu", k ? ", " : "",
                          st__uidq_name((st__uidq_kind_t)k), (unsigned long long)q[k]);
  ST_LOG_I("server", "quotas per uid (0: none; root and uid %u exempt): %s", (unsigned)geteuid(),
           line);
  if (lowered)
    ST_LOG_W("server", "%d quotas were not below their global limit and were lowered to three "
             "quarters of it", lowered);
}

/* 128 random bits as 32 hex digits: names this process start, so clients
 * never confuse arena ids of two server lifetimes. */
static void make_server_id(char out[33]) {
  unsigned char b[16];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      /* No entropy source at all: time and pid still make restarts
       * distinct on one host. */
      uint64_t t = (uint64_t)(st__now_unix() * 1e9), p = (uint64_t)getpid();
      memcpy(b, &t, 8);
      memcpy(b + 8, &p, 8);
      break;
    }
    got += (size_t)n;
  }
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Workers call this after queueing a completion for loop `home`: loop
 * 0's `done` watcher, or another loop's kick (its service takes them). */
static void notify_loop(void *ud, int home) {
  st__server_t *srv = ud;
  if (home == 0) ev_async_send(srv->loop, &srv->done);
  else ev_async_send(srv->loops[home].ev, &srv->loops[home].kick);
}

/* Completes the builds whose completions wait for loop `home`. Its
 * thread, the write side held. */
static void take_done(st__server_t *srv, int home) {
  st__job_t *job = st__workers_take_done(srv->workers, home);
  if (!job) return;
  while (job) {
    st__job_t *next = job->next;
    job->next = NULL;
    st__loopprof_build(job);
    if (job->back_on_loop) job->back_on_loop(job->back_ctx, job);
    else if (st__put_job_is(job)) st__put_done(srv, job);   /* a put's check */
    else if (job->run) st__views_done(srv, job);     /* a view's walk or copy */
    else st__build_complete(srv, job);
    job = next;
  }
  /* A drained shutdown ends on loop 0: it looks before its next poll. */
  if (home > 0 && srv->shutting_down) st__loop_kick(&srv->loops[0]);
}

static void on_done(struct ev_loop *loop, ev_async *w, int revents) {
  (void)loop;
  (void)revents;
  take_done(w->data, 0);
}

/* Before each poll of a loop (loops.c, with the write side): the
 * completions of loops 1..N-1, whose replies join the connections' queued
 * work, then that work. */
static void service_loop(st__loop_t *lp) {
  if (lp->index > 0 && lp->srv->workers) take_done(lp->srv, lp->index);
  st__conn_service(lp);
}

/* st__server_request_stop: a shutdown as SIGTERM starts it; a request
 * while one is in progress changes nothing. */
static void on_stop_req(struct ev_loop *loop, ev_async *w, int revents) {
  st__server_t *srv = w->data;
  (void)loop;
  (void)revents;
  if (!srv->shutting_down) st__server_shutdown(srv, "stop requested");
}

/* Any thread; see server.h. ev_async_send is the one libev call that is
 * safe from outside the loop thread. */
void st__server_request_stop(st__server_t *srv) {
  ev_async_send(srv->loop, &srv->stop_req);
}

/* Before each poll: ends a shutdown whose last call in flight finished
 * (it completed, or left the workers' queue unrun). Closed connections are
 * freed by their loops (loops.c). */
static void on_reap(struct ev_loop *loop, ev_prepare *w, int revents) {
  (void)loop;
  (void)revents;
  st__server_check_drained(w->data);
}

/* File loading (st.load_safetensors): the directories loads are confined
 * to, the reader threads, and, when a CUDA device is present, the pinned
 * staging pool, allocated at start rather than on the first load (pinned
 * allocation is slow: docs/benchmarks.md, "Driver and socket costs"). Loop thread, at start. */
static void start_loader(const st__config_t *cfg, const st__devices_t *devices) {
  st__safetensors_set_data_dirs((const char *const *)cfg->data_dirs, cfg->ndata_dirs);
  st__safetensors_set_loader_threads(cfg->loader_threads);
  char dirs[1024];
  st__safetensors_data_dirs_text(dirs, sizeof dirs);
  ST_LOG_I("server", "data_dirs: %s; loader_threads %d", dirs, cfg->loader_threads);
  if (!devices->cuda_count) return;
  char err[256];
  double t0 = st__now_mono();
  if (st__staging_init(cfg->staging_bytes, err, sizeof err) != ST_OK) {
    ST_LOG_W("server", "pinned staging pool of %llu bytes: %s (CUDA loads will retry)",
             (unsigned long long)cfg->staging_bytes, err);
    return;
  }
  uint64_t chunk;
  int nchunks;
  st__staging_info(&chunk, &nchunks);
  ST_LOG_I("server", "pinned staging pool: %d x %llu bytes in %.0f ms", nchunks,
           (unsigned long long)chunk, (st__now_mono() - t0) * 1e3);
}

/* Why a start failed: logged (unless the setup is quiet: an embedded
 * server's host reports it) and copied into the setup's buffer. */
static void start_failed(const st__server_setup_t *setup, const char *text) {
  if (!setup || !setup->quiet) ST_LOG_E("server", "%s", text);
  if (setup && setup->err && setup->errlen) snprintf(setup->err, setup->errlen, "%s", text);
}

/* Every kind a connection may hold, in release order (holdings.h). */
#define HOLDING_ROW(name) &st__holding_##name,
static const st__holding_kind_t *const holding_kinds[] = {ST__HOLDING_KINDS(HOLDING_ROW)};
#undef HOLDING_ROW

/* As stserver starts: the default loop and the signal watchers. */
int st__server_init(st__server_t *srv, const st__config_t *cfg) {
  return st__server_start(srv, cfg, NULL);
}

/* Starts everything but the loop; see server.h. Loop thread. */
int st__server_start(st__server_t *srv, const st__config_t *cfg,
                     const st__server_setup_t *setup) {
  memset(srv, 0, sizeof *srv);
  srv->cfg = cfg;
  if (setup) {
    srv->handed = setup->handed;
    srv->nhanded = setup->nhanded;
  }
  srv->on_message = st__dispatch;
  srv->on_fast_message = st__fast_call;
  srv->on_conn_closed = st__holdings_release;
  srv->holding_kinds = holding_kinds;
  srv->nholding_kinds = sizeof holding_kinds / sizeof *holding_kinds;
  srv->on_loop_service = service_loop;
  srv->started_at = st__now_unix();
  srv->started_mono = st__now_mono();
  make_server_id(srv->server_id);
  srv->loop = setup && setup->loop ? setup->loop : ev_default_loop(EVFLAG_AUTO);
  if (!srv->loop) {
    start_failed(setup, "cannot create the event loop");
    return ST_ERR_INTERNAL;
  }
  if (st__stats_init(srv, st__rpc_method_name, st__rpc_method_count()) != ST_OK) {
    start_failed(setup, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  size_t nb = 64;
  while (nb < (size_t)cfg->max_connections * 2 && nb < (1u << 20)) nb <<= 1;
  srv->nbuckets = nb;
  srv->buckets = calloc(nb, sizeof *srv->buckets);
  if (!srv->buckets) {
    start_failed(setup, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  {
    char err[256];
    int rc = st__loops_init(srv, err, sizeof err);
    if (rc != ST_OK) {
      start_failed(setup, err);
      return rc;
    }
  }
  ev_prepare_init(&srv->reap, on_reap);
  srv->reap.data = srv;
  ev_prepare_start(srv->loop, &srv->reap);
  ev_async_init(&srv->done, on_done);
  srv->done.data = srv;
  ev_async_start(srv->loop, &srv->done);
  ev_async_init(&srv->stop_req, on_stop_req);
  srv->stop_req.data = srv;
  ev_async_start(srv->loop, &srv->stop_req);
  st__shutdown_init(srv);
  if (st__reload_init(srv) != ST_OK) {
    start_failed(setup, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  /* Signals first: a SIGTERM from here on unlinks what we create. */
  if (!setup || !setup->no_signals) {
    st__signals_start(srv);
    srv->signals = 1;
  }

  ST_LOG_I("server", "stserver %s (protocol %d) pid %d, server id %s", ST_VERSION_STRING,
           ST_PROTOCOL_VERSION, (int)getpid(), srv->server_id);
  ST_LOG_I("server", "config: %s", cfg->path && cfg->path[0] ? cfg->path : "none (defaults)");

  st__devices_probe(&srv->devices);
  if (srv->devices.cuda_count)
    ST_LOG_I("server", "devices: cpu and %d CUDA device(s)", srv->devices.cuda_count);
  else {
    /* A host without a GPU is a normal place to run: say so plainly at
     * info, and leave the CUDA runtime's detail (on such a host "CUDA
     * driver version is insufficient ...", which reads like a broken
     * install) to debug and to `info`'s device list. */
    ST_LOG_I("server", "no GPU: serving CPU endpoints only");
    ST_LOG_D("server", "no CUDA device: %s", srv->devices.cuda_reason);
  }
  for (int i = 0; i < srv->devices.count; i++)
    if (srv->devices.list[i].index >= 0)
      ST_LOG_I("server", "  cuda:%d %s %s", srv->devices.list[i].index,
               srv->devices.list[i].name, srv->devices.list[i].uuid);

  st__arena_set_limit(cfg->max_object_bytes);
  if (st__holdings_start(srv) != ST_OK) {
    start_failed(setup, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  st__objects_init(&srv->objects);
  st__keys_init(&srv->keys, (size_t)cfg->keys_max_keys, cfg->keys_max_bytes,
                (unsigned)cfg->keys_max_versions);
  st__keys_serve(&srv->keys);
  if (st__reclaim_start(srv) != ST_OK) {
    start_failed(setup, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  configure_quotas(cfg);
  /* Final releases of CUDA and big memfd arenas leave the loop threads
   * (mem/arena_release.h); without the thread they stay inline. */
  char why[160];
  if (st__arena_releaser_start(why, sizeof why) == ST_OK)
    srv->releaser = 1;
  else
    ST_LOG_W("server", "%s: arenas are released on the loop threads", why);
  st__devices_start(srv);
  /* Published state kept across restarts: restored before any socket
   * opens, so no client sees a table half restored. */
  if (st__restart_start(srv) != ST_OK) {
    start_failed(setup, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  st__work_init(srv);
  start_loader(cfg, &srv->devices);

  st__errlist_t errs = {0};
  const st__load_opts_t load = {.limit_s = cfg->endpoint_load_timeout_s};
  int rc = st__generation_load(cfg->endpoints_dir, 1, &load, &srv->gen, &errs);
  if (rc != ST_OK) {
    if (!setup || !setup->quiet) {
      ST_LOG_E("server", "cannot load endpoints from %s:", cfg->endpoints_dir);
      st__errlist_log(&errs, ST_LOG_ERROR, "server");
    }
    char *joined = st__errlist_join(&errs);
    if (setup && setup->err && setup->errlen)
      snprintf(setup->err, setup->errlen, "%s", joined ? joined : "cannot load the endpoints");
    free(joined);
    st__errlist_clear(&errs);
    srv->gen = NULL;
    return ST_ERR_CONFIGURATION;
  }
  st__errlist_clear(&errs);
  {
    char names[1024];
    st__generation_names(srv->gen, names, sizeof names);
    ST_LOG_I("server", "endpoints: %s: %zu loaded: %s", cfg->endpoints_dir,
             srv->gen->nendpoints, names);
  }

  /* The peers (off unless configured): the transfer helper and its
   * engines, then the channel's listener and dials. Before the client
   * sockets open: the start runs the loop for the helper's probe. */
  {
    char err[1024];
    rc = st__remote_start(srv, err, sizeof err);
    if (rc != ST_OK) {
      start_failed(setup, err);
      return rc;
    }
  }

  for (int i = 0; i < cfg->ndevices; i++) {
    char err[512];
    rc = st__listen_open(srv, cfg->devices[i], err, sizeof err);
    if (rc != ST_OK) {
      start_failed(setup, err);
      return rc;
    }
  }


  const st__workers_runner_t lua_runner = {
      .vm_new = st__vm_new,
      .vm_free = st__vm_free,
      .vm_generation = st__vm_generation,
      .vm_build = st__vm_build,
      .limits = {.lua_memory_bytes = cfg->lua_memory_bytes,
                 .default_timeout_s = cfg->default_timeout_s},
  };
  char err[256];
  rc = st__workers_start(cfg->workers, &lua_runner, srv->gen, notify_loop, srv, &srv->workers, err,
                      sizeof err);
  if (rc != ST_OK) {
    start_failed(setup, err);
    return rc;
  }
  st__workers_set_prepare_fn(srv->workers, st__pool_conn_prepare);
  if ((rc = st__workers_set_homes(srv->workers, srv->nloops)) != ST_OK) {
    start_failed(setup, "out of memory");
    return rc;
  }
  st__workers_set_spin(srv->workers, cfg->spin_us * 1e-6);
  ST_LOG_I("server", "workers: %d; limits: max_message_bytes %zu, max_connections %d, "
           "max_inflight %d, frame_timeout_ms %d, lua_memory_bytes %llu, default_timeout_s %g; "
           "spin_us %d",
           cfg->workers, cfg->max_message_bytes, cfg->max_connections, cfg->max_inflight,
           cfg->frame_timeout_ms, (unsigned long long)cfg->lua_memory_bytes,
           cfg->default_timeout_s, cfg->spin_us);
  ST_LOG_I("server", "memory budget: cpu %llu bytes%s; tasks: ttl %g s, capacity %d",
           (unsigned long long)cfg->budgets[0].bytes, cfg->budgets[0].bytes ? "" : " (none)",
           cfg->task_ttl_s, cfg->task_capacity);
  st__loopprof_start(srv);
  ST_LOG_I("server", "ready");
  st__notify("READY=1\nSTATUS=serving %zu endpoints\nMAINPID=%ld", srv->gen->nendpoints,
             (long)getpid());
  return ST_OK;
}

/* With builds of this loop in flight, polls for their completions for up
 * to spin_s instead of sleeping in epoll_wait: a completion is then
 * handled without the eventfd write, the wake-up and the read of ev_async
 * (libev skips the write while the loop is not in its poll, and the next
 * iteration feeds the watcher). Sockets are polled too, every few
 * microseconds, so other connections wait no longer than that. With
 * several loop threads the server lock is let go of between those
 * iterations. lp's thread. */
static void spin_for_completions(st__server_t *srv, st__loop_t *lp, double spin_s) {
  st__workers_t *workers = srv->workers;
  int home = lp->index;
  double start = st__now_mono(), deadline = start + spin_s;
  while (!srv->stopped && st__workers_outstanding(workers, home)) {
    st__loop_unlock(srv);
    for (int i = 0; i < 31 && !st__workers_done_pending(workers, home); i++) st__cpu_relax();
    st__loop_lock(srv);
    ev_run(lp->ev, EVRUN_NOWAIT);
    if (st__now_mono() > deadline) break;
  }
  st__loopprof_spin(st__now_mono() - start);
}

/* Runs loop lp until the server stops (loop 0) or the loops stop (the
 * others): one iteration at a time, each followed by the poll of
 * spin_for_completions when spin_us is set and builds of this loop's
 * connections are in flight. lp's thread (st__loops_run). */
static void run_loop(st__server_t *srv, st__loop_t *lp) {
  double spin_s = srv->cfg->spin_us * 1e-6;
  st__arena_defer_here(1);   /* slow final releases go to the releaser */
  while (!srv->stopped && !(lp->index > 0 && srv->loops_stop) &&
         ev_run(lp->ev, EVRUN_ONCE)) {
    if (spin_s > 0 && srv->workers && st__workers_outstanding(srv->workers, lp->index))
      spin_for_completions(srv, lp, spin_s);
  }
  st__arena_defer_here(0);
}

/* Runs the loops until the server stops (loops.c). Loop thread. */
void st__server_run(st__server_t *srv) {
  st__loops_run(srv, run_loop);
}

/* Closes and frees everything after the loop ended. Loop thread. */
void st__server_destroy(st__server_t *srv) {
  if (!srv->loop) return;
  st__takeover_free(srv);
  st__listen_close_all(srv);
  st__remote_stop(srv);   /* the pulls' tasks end before the tasks go */
  if (srv->signals) st__signals_stop(srv);
  srv->signals = 0;
  /* A load still running is cancelled and joined: its thread never
   * outlives the server. */
  st__reload_destroy(srv);
  /* Replies already queued get one last chance; calls still running are
   * cancelled and their results dropped with their jobs. */
  if (srv->buckets) st__conn_close_all(srv);
  /* A worker waiting for the loop to evict gets its answer now. */
  st__reclaim_stop(srv);
  int stuck = 0;
  if (srv->workers) {
    st__workers_cancel_all(srv->workers);
    stuck = st__workers_free(srv->workers, 5.0);
    if (stuck)
      ST_LOG_E("server", "%d workers did not stop within 5 s; exiting without them", stuck);
    srv->workers = NULL;
  }
  if (!stuck) st__reclaim_free(srv);
  st__conn_reap(srv);
  /* After the workers: builds and tasks no longer have jobs on it. Tasks
   * hold objects, so they go first. */
  st__work_destroy(srv);
  st__views_destroy(srv);
  st__objects_free(&srv->objects);
  st__restart_stop(srv);   /* the store keeps the state: not journaled */
  st__keys_free(&srv->keys);
  st__holdings_stop(srv);
  /* Every arena of the server is gone or queued: the releaser tears the
   * queued ones down before it stops, while the CUDA contexts live. */
  if (srv->releaser) st__arena_releaser_stop();
  srv->releaser = 0;
  ev_timer_stop(srv->loop, &srv->grace);
  ev_async_stop(srv->loop, &srv->done);
  ev_async_stop(srv->loop, &srv->stop_req);
  ev_prepare_stop(srv->loop, &srv->reap);
  st__loopprof_stop(srv);
  st__loops_free(srv);
  const st__counters_t *k = &srv->counters;
  /* Every connection is closed: nothing is in flight, so the parts add
   * up to the totals (docs/operations.md, "Counters"). */
  ST_LOG_I("server",
           "stopped after %.1f s: %llu connections, %llu requests (%llu ok, %llu failed, "
           "%llu dropped), %llu calls (%llu ok, %llu failed, %llu dropped), %llu bytes and "
           "%llu descriptors sent, %llu peers refused",
           st__now_mono() - srv->started_mono, (unsigned long long)k->connections,
           (unsigned long long)k->requests, (unsigned long long)k->requests_ok,
           (unsigned long long)k->errors, (unsigned long long)k->requests_dropped,
           (unsigned long long)k->calls, (unsigned long long)k->calls_ok,
           (unsigned long long)k->calls_failed, (unsigned long long)k->calls_dropped,
           (unsigned long long)k->bytes_sent, (unsigned long long)k->fds_sent,
           (unsigned long long)(k->auth_refused + k->limit_refused));
  st__stats_free(srv);
  st__describe_free(srv);
  if (srv->gen) st__generation_unref(srv->gen);
  srv->gen = NULL;
  free(srv->last_reload_error);
  free(srv->buckets);
  srv->buckets = NULL;
  srv->loop = NULL;
}

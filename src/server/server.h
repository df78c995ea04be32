/* src/server: the server process: its state (loop, listeners,
 * connections, counters, the current generation) and the functions of the
 * files that run it:
 *
 *   lifecycle.c  start, run, destroy; completions from the workers
 *   shutdown.c   graceful shutdown (grace period, drain)
 *   reload.c     reloads (SIGHUP, `reload`)
 *   startup.c    from flags and config.lua to a running or checked server
 *   signals.c    SIGTERM, SIGINT, SIGHUP
 *   listen.c     the sockets; peer.c who may connect
 *   devices.c    the devices and where a call builds
 *   describe.c   the result maps of hello, info and endpoints
 *   stats.c      request accounting: every request from dispatch to its
 *                reply or its connection's close (the counters add up)
 *   metrics.c    the `metrics` method's Prometheus text
 *
 * Connections (conn.h) and the wire methods (rpc.h) sit on this state;
 * builds and tasks (work.h) on both. This header declares types and
 * functions only: it depends on nothing else of src/server but config.h.
 *
 * Threads: everything in st__server_t belongs to the loop thread, except
 * the workers (engine/workers.h: locked internally) and the job completions it
 * hands back through `done` (ev_async). Worker threads never see this
 * struct and never touch a connection. With loop_threads = N > 1 there
 * are N loop threads (loops.c): each holds the write side of the server
 * lock `lock` while it runs code that reads or changes this state, so
 * that to all code but loops.c, conn.c and fastcall.c they are one loop
 * thread at a time. Loops 1..N-1 answer their connections' cache hits
 * under its read side (fastcall.c), reading this state and changing only
 * their connection, their loop's counts and relaxed atomics; a loop
 * thread lets go of the lock while it waits for events and around the
 * reads and writes of its own connections, holding no pointer into
 * shared state then.
 */
#ifndef ST_SERVER_SERVER_H
#define ST_SERVER_SERVER_H

#include <ev.h>
#include <msgpack.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "engine/generation.h"
#include "engine/job.h"
#include "engine/keys.h"
#include "engine/objects.h"
#include "engine/workers.h"
#include "server/config.h"
#include "st/errors.h"

typedef struct st__server st__server_t;

/* ------------------------------------------------------------- devices */

typedef struct st__device {
  int index;                  /* CUDA ordinal; -1 for the cpu device       */
  char kind[8];               /* "cpu" | "cuda"                            */
  char name[128];
  char uuid[48];              /* "GPU-xxxxxxxx-..." for CUDA, "" for cpu   */
  uint64_t memory_bytes;      /* total device memory (0 for cpu)           */
  int gpudirect_rdma;         /* 1: VMM allocations get the GPUDirect-RDMA
                                 flag (a NIC reads them directly)          */
} st__device_t;

typedef struct st__devices {
  int count;
  st__device_t list[1 + 64];
  int cuda_count;
  char cuda_reason[256];      /* why there is no CUDA device ("" if some)  */
} st__devices_t;

/* Fills *d: the "cpu" device first, then every CUDA device the runtime
 * reports (when built with CUDA). Never fails: a missing driver means no
 * CUDA devices and a reason in cuda_reason. Loop thread, at start. */
void st__devices_probe(st__devices_t *d);

/* The CUDA device of ordinal `ordinal`, or NULL when the server has none
 * by that number. Borrowed. */
st__device_t *st__devices_cuda(st__devices_t *d, int ordinal);

/* Where a call of `ep` that came in on socket `socket` builds
 * (docs/endpoints.md, "Devices"): the endpoint's `device` option ("cpu",
 * "cuda" = cuda:<socket>, "cuda:N"), else the socket's default (config default_device: cuda:<socket>
 * when the server has that device, else the CPU).
 * Fills *device (-1 or an ordinal) and *cuda_device (what "cuda" names in
 * the body: the socket's index). ST_OK, or ST_ERR_CAPABILITY with
 * "no CUDA device: cuda:N is unavailable: <reason>" when the server does
 * not have that device. */
int st__device_for_call(const st__devices_t *d, const st__config_t *cfg,
                        const st__endpoint_decl_t *ep, int socket, int *device, int *cuda_device,
                        char *err, size_t errlen);

/* At start: budgets of the CUDA devices the config leaves unset (90% of
 * each device's memory), primary contexts of the devices the sockets
 * build on (so that info's cuMemGetInfo never waits for one), and one log
 * line per socket saying where it builds by default. Loop thread. */
void st__devices_start(st__server_t *srv);

/* ------------------------------------------------------------- server */

/* Counters since start (docs/operations.md, "Counters", says how they add
 * up). Requests are accounted by stats.c, one entry per request from the
 * moment dispatch accepts it until its reply is queued or its connection
 * closes: requests = requests_ok + errors + requests_dropped + requests in
 * flight, and the same per method (st__stats_t). */
typedef struct st__counters {
  uint64_t requests;          /* requests received (every method)          */
  uint64_t requests_ok;       /* requests answered with a result           */
  uint64_t errors;            /* requests answered with an error           */
  uint64_t requests_dropped;  /* requests whose connection closed first    */
  uint64_t calls;             /* `call` requests received                  */
  uint64_t calls_ok;          /* `call` requests answered with a result    */
  uint64_t calls_failed;      /* `call` requests answered with an error    */
  uint64_t calls_dropped;     /* `call` requests whose connection closed   */
  uint64_t builds;            /* jobs handed to the workers                */
  uint64_t cache_hits;        /* calls answered from the cache             */
  uint64_t cache_misses;      /* calls of cached endpoints that built      */
  uint64_t joins;             /* calls that joined a build in flight       */
  uint64_t views_on_workers;  /* view walks handed to a worker (views.c)   */
  uint64_t puts_on_workers;   /* puts whose per-tensor work a worker did
                                 (put_job.c)                               */
  uint64_t tasks_submitted;   /* tasks created (submit, task endpoints)    */
  uint64_t tasks_completed;   /* tasks that ended completed                */
  uint64_t tasks_failed;      /* ... failed                                */
  uint64_t tasks_cancelled;   /* ... cancelled                             */
  uint64_t tasks_expired;     /* finished tasks dropped (TTL, capacity)    */
  uint64_t releases;          /* leases given back with release            */
  uint64_t leases_dropped;    /* leases given back otherwise: the
                                 connection closed, or the reply that
                                 carried the lease could not be sent       */
  uint64_t invalidations;     /* cache entries dropped by invalidate_*     */
  uint64_t notifications;     /* client notifications (release, or ignored) */
  uint64_t bytes_received;
  uint64_t bytes_sent;
  uint64_t fds_sent;
  uint64_t fds_received;      /* client-sent descriptors (tensor arguments) */
  uint64_t connections;       /* connections admitted since start          */
  uint64_t auth_refused;      /* peers refused by the credential check     */
  uint64_t limit_refused;     /* connections refused at max_connections    */
  uint64_t protocol_errors;   /* connections closed for a message the
                                 server could not take (bad bytes, too
                                 large, descriptors that do not match)     */
  uint64_t busy;              /* requests refused with BUSY                */
  uint64_t timeouts;          /* connections closed for a half-sent frame  */
  uint64_t read_pauses;       /* reading paused: a client's replies piled up */
  uint64_t sliced_decodes;    /* large messages decoded a slice per loop turn */
  uint64_t reloads;           /* successful reloads                        */
  uint64_t reload_failures;
} st__counters_t;

/* ------------------------------------------------------------- stats.c */

/* Methods the stats can tell apart (methods.c has fewer rows); requests
 * for a method name that has no row count under index ST__STATS_NMETHODS. */
#define ST__STATS_NMETHODS 48
/* Upper bounds of the request latency buckets, seconds (+Inf is last). */
#define ST__STATS_BUCKETS                                                                   {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,    2.5, 5.0, 10.0, 30.0, 60.0}
#define ST__STATS_NBUCKETS 18
/* Endpoint names whose calls are counted one by one; the calls of more
 * names count together under the name "" (shown as "(other)"). */
#define ST__STATS_MAX_ENDPOINTS 256

typedef struct st__method_stats {
  uint64_t requests, ok, failed, dropped;
  uint64_t inflight;          /* accepted, not answered yet                */
  uint64_t buckets[ST__STATS_NBUCKETS + 1];   /* answered, by latency; not
                                 cumulative; the last is +Inf              */
  double seconds;             /* sum of the answered requests' latencies   */
} st__method_stats_t;

typedef struct st__endpoint_stats {
  char *name;                 /* owned; "" for the names past the cap      */
  uint64_t ok, failed, dropped;
} st__endpoint_stats_t;

/* One request a connection is owed an answer for (stats.c). */
typedef struct st__open_req {
  uint32_t id;
  uint8_t used;
  uint8_t method;             /* index of the method row; NMETHODS: none   */
  uint16_t endpoint;          /* 0: none; else 1 + index in `endpoints`    */
  double accepted;            /* monotonic time dispatch accepted it       */
} st__open_req_t;

/* A connection's open requests: open addressing by request id (ids a
 * client reuses while one is open are kept apart). At most its in-flight
 * requests plus the one being dispatched. */
typedef struct st__open_reqs {
  st__open_req_t *slots;      /* owned; NULL while cap is 0                */
  uint32_t cap;               /* a power of two, or 0                      */
  uint32_t count;
} st__open_reqs_t;

typedef struct st__stats {
  const char *method_names[ST__STATS_NMETHODS];   /* static; NULL past the rows */
  size_t nmethods;
  st__method_stats_t methods[ST__STATS_NMETHODS + 1];
  uint64_t errors_by_code[1 - ST_ERR_MIN];   /* error replies by -code (0: outside the table) */
  int call_method;            /* index of `call`, -1 before st__stats_init  */
  st__endpoint_stats_t *endpoints[ST__STATS_MAX_ENDPOINTS + 1];
  size_t nendpoints;
  void *endpoint_index;       /* owned st__smap_t: name -> 1 + index       */
} st__stats_t;

typedef struct st__conn st__conn_t;
typedef struct st__work st__work_t;
struct st__message;

/* What a reload did (the `reload` method's reply; docs/protocol.md). */
typedef struct st__reload_report {
  int refused;                /* ST_ERR_*: no load ran for the request
                                 (SHUTTING_DOWN, OUT_OF_MEMORY) and `error`
                                 says why; 0: the fields below tell */
  int ok;
  uint64_t generation;        /* the generation serving afterwards */
  char *error;                /* owned; NULL when ok */
  char **names[3];            /* owned arrays: changed, added, removed */
  size_t counts[3];
} st__reload_report_t;

enum { ST_RELOAD_CHANGED = 0, ST_RELOAD_ADDED = 1, ST_RELOAD_REMOVED = 2 };

/* `reload` requests that may wait at once (for the load running and the
 * next one together); more get BUSY. */
#define ST__RELOAD_MAX_WAITING 64

/* Reloads in progress and the requests waiting for them (reload.c). */
typedef struct st__reloader st__reloader_t;

/* Answers one `reload` request (conn_id, request_id) with what the load
 * did: r is borrowed for the call. The connection may be gone. Loop
 * thread. */
typedef void (*st__reload_done_fn)(st__server_t *srv, uint64_t conn_id, uint32_t request_id,
                                   const st__reload_report_t *r);

typedef struct st__listener {
  ev_io io;
  ev_timer retry;             /* re-arms accept after EMFILE              */
  st__server_t *srv;
  int fd;                     /* -1 when closed                            */
  int device;                 /* socket index (config devices[])          */
  char path[108];
  dev_t st_dev;               /* identity of the socket file we bound,    */
  ino_t st_ino;               /* so we only ever unlink our own           */
} st__listener_t;

/* One event loop and its thread (loops.c). Loop 0 is the server's own
 * (srv->loop, the thread of st__server_run): the listeners, signals,
 * completions, timers of tasks and reloads, and its share of the
 * connections; loops 1..N-1 run only their connections. */
/* What a loop's thread counted under the read side of the server lock
 * (fastcall.c, conn.c): answered cache hits (`calls`, each also a
 * request, ok, and a cache hit) by latency and endpoint, bytes read and
 * written. Added into the server's counters and stats, and zeroed, by
 * whoever takes the write side next (loops.c). */
#define ST__LOOP_COUNTED_ENDPOINTS 16
typedef struct st__loop_counts {
  int dirty;
  uint64_t calls;
  uint64_t buckets[ST__STATS_NBUCKETS + 1];
  double seconds;
  uint64_t bytes_received, bytes_sent;
  int nendpoints;
  uint16_t endpoint[ST__LOOP_COUNTED_ENDPOINTS];   /* stats index + 1 */
  uint64_t endpoint_ok[ST__LOOP_COUNTED_ENDPOINTS];
} st__loop_counts_t;

typedef struct st__loop {
  struct ev_loop *ev;
  st__server_t *srv;
  int index;
  ev_async kick;              /* another thread put work on `todo`         */
  ev_prepare service;         /* before each poll: `todo`, then `dead`     */
  st__conn_t *todo;           /* connections whose watchers or write queue
                                 wait for this loop's thread (conn.c)      */
  st__conn_t *dead;           /* closed; freed before this loop's next poll */
  pthread_t thread;
  int running;                /* its thread runs (index > 0)               */
  st__loop_counts_t counts;   /* its thread's, under the read side         */
} st__loop_t;

struct st__server {
  struct ev_loop *loop;
  const st__config_t *cfg;    /* borrowed; outlives the server             */

  /* What a connection hands upward, set at start (st__dispatch of rpc.h
   * and st__holdings_release of holdings.h), so that conn.c calls nothing
   * above it: each decoded message, and the close of a connection. */
  void (*on_message)(st__conn_t *c, struct st__message *msg);
  /* Tried first on each message (st__fast_call, fastcall.c): 1 when it
   * answered it (under either side of the server lock), 0 when on_message
   * must, under the write side. */
  int (*on_fast_message)(st__conn_t *c, const struct st__message *msg);
  void (*on_conn_closed)(st__server_t *srv, st__conn_t *c);
  /* What a loop does before each poll (st__conn_service of conn.h), so
   * that loops.c calls nothing above it. */
  void (*on_loop_service)(st__loop_t *lp);
  /* How each loop runs (st__loops_run's `run`). */
  void (*run_loop)(st__server_t *srv, st__loop_t *lp);

  st__listener_t listeners[ST_MAX_DEVICES];
  int nlisteners;
  int spare_fd;               /* reserve descriptor (listen.c): given up to
                                 accept and refuse a connection when the
                                 process is out of descriptors; -1 if none */

  /* connections by id (chained hash); ids start at 1 and are never reused */
  st__conn_t **buckets;
  size_t nbuckets;            /* power of two                              */
  st__conn_t *conns, *conns_tail; /* the same connections, oldest first    */
  int nconns;
  uint64_t next_conn_id;
  /* Every kind a connection may hold, in release order (holdings.h; set
   * at start). */
  const struct st__holding_kind *const *holding_kinds;
  size_t nholding_kinds;
  void **holding_state;       /* each kind's state, by its place (holdings.h) */
  struct st__holding_row *holding_rows; /* info's: the connections that
                                 hold anything and their counts
                                 (holdings.c), grown on demand */
  size_t holding_rows_cap;
  ev_prepare reap;            /* before each poll: the drain check         */

  /* The loops (loops.c): nloops = loop_threads; loops[0].ev is `loop`. */
  st__loop_t *loops;          /* owned                                     */
  int nloops;
  unsigned next_loop;         /* the loop of the next connection           */
  int threaded;               /* loops 1..N-1 run: `lock` is in use        */
  int loops_stop;             /* loops 1..N-1: leave ev_run                */
  pthread_rwlock_t lock;      /* the server lock, while threaded           */

  st__generation_t *gen;      /* owned reference: the current generation  */
  int last_reload_done;       /* a reload was attempted                    */
  int last_reload_ok;
  char *last_reload_error;    /* owned, NULL when ok                       */
  double last_reload_at;      /* unix time                                 */
  st__reloader_t *reloader;   /* owned: the load running on its thread,
                                 the requests waiting for it (reload.c)   */

  st__workers_t *workers;    /* the worker threads (engine/workers.h)     */
  ev_async done;              /* workers: "completions are queued"         */

  st__objects_t objects;      /* objects, cache, leases, budgets           */
  struct st__reclaim *reclaim; /* eviction for the ledger (reclaim.h)      */
  int releaser;                /* started mem/arena_release.h's thread     */
  st__work_t *work;           /* builds, flights, serialized queues, tasks */
  ev_signal sig_term, sig_int, sig_hup;
  int signals;                /* the signal watchers are ours to stop      */
  ev_async stop_req;          /* st__server_request_stop, from any thread  */
  ev_timer grace;             /* shutdown: in-flight work deadline         */

  st__counters_t counters;
  st__stats_t stats;          /* requests by method, errors by name, latency */
  /* What connections hold (conn.h): unclaimed descriptors clients sent,
   * and replies' descriptors and arena bytes not yet read. */
  uint64_t held_fds, held_bytes;
  st__devices_t devices;
  char server_id[33];         /* 128 random bits, hex                      */
  double started_at;          /* unix time                                 */
  double started_mono;
  int shutting_down;
  int grace_expired;          /* in-flight calls were cancelled           */
  int stopped;                /* the loop was told to stop                 */
  st__keys_t keys;            /* published keys (rpc_keys.c)               */
  struct st__views *views;    /* copies for views in flight (views.c), made
                                 at the first; NULL before */
  struct st__info_fixed *info_fixed; /* owned: info's pairs that move only at
                                 start or on a reload, packed (describe.c) */
  struct st__peer *peer;      /* owned: the server-to-server channel
                                 (src/peer), on loop 0; NULL when config.lua
                                 configures no peer.listen and no peers    */
  struct st__remote *remote;  /* owned: the transfer helper, pulls and
                                 lends (remote.h); NULL without peers     */
  struct st__restart *restart; /* owned: the fd store, the journal and
                                 what the start restored (restart.h)      */
  struct st__takeover *takeover; /* owned: a takeover by a new server in
                                 progress (takeover.h); NULL: none         */
  int handed_over;            /* a new server took over: exit 0 and leave
                                 it the socket files                       */
  struct st__fdstore_entry *handed; /* borrowed, at start only: what a
                                 takeover handed this server (restart.h) */
  size_t nhanded;
};

/* ------------------------------------------------------------- startup.c */

/* Command-line options (main.c); NULL / 0 means "not given". */
typedef struct st__options {
  const char *config;         /* --config                                  */
  const char *base_path;      /* --base-path                               */
  const char *endpoints;      /* --endpoints                               */
  int workers;                /* --workers, 0 = config                     */
  int log_level;              /* --log-level, -1 = config                  */
  int check;                  /* --check                                   */
  int takeover;               /* --takeover (takeover.h)                   */
} st__options_t;

/* Everything after flag parsing: loads the config, applies the flags, then
 * either checks (--check) or runs the server until SIGTERM/SIGINT. Returns
 * the process exit status (0 ok, 1 error). Main thread. */
int st__server_main(const st__options_t *opts);

/* -------------------------------------------------------------- notify.c */

/* Sends one notification ("READY=1\nSTATUS=...", printf-style) to the
 * service manager at $NOTIFY_SOCKET; nothing when it is unset. Never
 * fails the caller (a send error is logged). Loop thread. */
void st__notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Sends one notification of `len` bytes with `nfds` (at most 8)
 * descriptors riding on it (SCM_RIGHTS; they stay the caller's), waiting
 * up to 2 s for room in the manager's queue. ST_OK (the datagram is in
 * the manager's queue: it outlives this process), CAPABILITY (no
 * $NOTIFY_SOCKET), CONFIGURATION (not a socket path), BUSY (no room in
 * time), IO, with the reason in err. Loop thread. */
int st__notify_send(const char *msg, size_t len, const int *fds, int nfds, char *err,
                    size_t errlen);

/* ------------------------------------------------------- install_paths.c */

/* The config file of an installed server: <sysconfdir>/sharedtensor/
 * config.lua next to the prefix the running binary lives in (/etc for
 * /usr). Writes its path to out and returns 0 when that file is readable,
 * -1 otherwise (a build tree, a moved binary). Any thread. */
int st__installed_config(char *out, size_t cap);

/* ------------------------------------------------------------- lifecycle.c */

/* Loads the generation, opens the sockets, starts the workers and the signal
 * watchers, on libev's default loop. ST_OK, or an error already logged
 * (the caller still runs st__server_destroy). `cfg` is borrowed and must
 * outlive the server. Loop thread. */
int st__server_init(st__server_t *srv, const st__config_t *cfg);

/* How st__server_start runs a server; NULL means as stserver does. */
typedef struct st__server_setup {
  struct ev_loop *loop;       /* borrowed; NULL: libev's default loop      */
  int no_signals;             /* no SIGTERM/SIGINT/SIGHUP watchers, and
                                 SIGPIPE left alone (an embedded server
                                 must not take over its host's signals;
                                 every send uses MSG_NOSIGNAL anyway)      */
  char *err;                  /* a failed start says why here, one line per
                                 problem (file:line: ...); may be NULL     */
  size_t errlen;
  int quiet;                  /* a failed start is not logged: the caller
                                 reports what err says                     */
  struct st__fdstore_entry *handed; /* what a takeover handed over (the
                                 old server's listeners, journal and
                                 arenas: takeover.h); taken at start      */
  size_t nhanded;
} st__server_setup_t;

/* st__server_init on the loop and with the signals `setup` says. The
 * thread that calls it is the server's loop thread from then on. */
int st__server_start(st__server_t *srv, const st__config_t *cfg,
                     const st__server_setup_t *setup);

/* Asks the server to shut down as SIGTERM does (st__server_shutdown on the
 * loop thread: drain, then st__server_run returns). Any thread, any number
 * of times, between st__server_start and st__server_destroy. */
void st__server_request_stop(st__server_t *srv);

/* Runs the loop until the server stopped (after SIGTERM and the drain).
 * Loop thread. */
void st__server_run(st__server_t *srv);

/* Closes connections and listeners, stops the workers and frees everything.
 * Loop thread, after st__server_run. */
void st__server_destroy(st__server_t *srv);

/* ------------------------------------------------------------- loops.c */

/* Makes the loops (cfg->loop_threads; the first is srv->loop) and their
 * watchers. ST_OK or ST_ERR_INTERNAL / OUT_OF_MEMORY with a message in
 * err. Loop thread, at start. */
int st__loops_init(st__server_t *srv, char *err, size_t errlen);

/* Runs loop 0 on this thread and loops 1..N-1 on threads of their own,
 * each by run(srv, lp) (until the server stops, for loop 0; until
 * `loops_stop`, for the others), the server lock taken around every
 * callback, until loop 0 ends; then stops and joins the others (their
 * connections stay open: destroy closes them). Loop thread. */
void st__loops_run(st__server_t *srv, void (*run)(st__server_t *srv, st__loop_t *lp));

/* Frees the loops 1..N-1 and the watchers (after st__loops_run and the
 * close of every connection). Loop thread, at exit. */
void st__loops_free(st__server_t *srv);

/* The loop a new connection goes to: round robin. Loop thread. */
st__loop_t *st__loops_pick(st__server_t *srv);

/* Whether this thread may run lp's watchers and the system calls of its
 * connections: it is lp's thread, or no thread but the caller's runs. */
int st__loop_is_current(const st__loop_t *lp);

/* Wakes lp's thread (its `todo` or timers changed) when it is not this
 * one. Loop thread, the server lock held. */
void st__loop_kick(st__loop_t *lp);

/* Whether this thread runs a loop of the server (it may hold the server
 * lock; a worker never does). Any thread. */
int st__loop_thread(void);

/* Lets go of / takes back the side of the server lock this thread holds
 * around a system call of the current loop's own connection (nothing when
 * not threaded). */
void st__loop_unlock(st__server_t *srv);
void st__loop_lock(st__server_t *srv);

/* Makes sure this loop thread holds the write side of the server lock
 * (loops.c): returns 1 when it had to let go of the read side for it, so
 * that anything read before may have changed (a connection closed by
 * another thread: c->dead); 0 when it held it already or nothing is
 * threaded. Loop thread. */
int st__loop_exclusive(st__server_t *srv);

/* The counts of this thread's loop when it holds only the read side of
 * the server lock (counters go there), else NULL (counters go straight to
 * srv->counters and srv->stats). Any thread. */
st__loop_counts_t *st__loop_counts(void);

/* ------------------------------------------------------------- shutdown.c */

/* Prepares the grace timer of a shutdown. Loop thread, at start. */
void st__shutdown_init(st__server_t *srv);

/* SIGTERM/SIGINT: stop accepting, unlink the sockets, refuse new calls,
 * let in-flight calls finish within shutdown_grace_s, then stop the loop.
 * A second call stops at once. Loop thread. */
void st__server_shutdown(st__server_t *srv, const char *why);

/* Ends a shutdown in progress once no call is in flight any more (the
 * loop checks before each poll). Loop thread. */
void st__server_check_drained(st__server_t *srv);

/* ------------------------------------------------------------- reload.c */

/* Starts the reload machinery (its wake-up watcher). ST_OK or
 * OUT_OF_MEMORY. Loop thread, at start. */
int st__reload_init(st__server_t *srv);

/* Stops a load in progress (the file running now is cancelled at its next
 * hook check), joins its thread and frees everything; waiting requests
 * are not answered (their connections are closed). Loop thread, at exit. */
void st__reload_destroy(st__server_t *srv);

/* SIGHUP (done NULL) and the `reload` method: loads a new generation on a
 * loader thread (the loop keeps serving) and, back on the loop thread,
 * swaps it in or, on failure, keeps the current one and records the
 * errors for info; caches of changed and removed endpoints are dropped.
 * A request made while a load runs is answered by one more load that
 * starts when it ends (requests coalesce; SIGHUPs too). done(srv, conn_id,
 * request_id, report) answers a request once its load ended. Returns
 * ST_OK (done will be called, except at exit), BUSY when
 * ST__RELOAD_MAX_WAITING requests
 * already wait, SHUTTING_DOWN, OUT_OF_MEMORY (a loader thread could not
 * start). Loop thread. */
int st__server_reload(st__server_t *srv, st__reload_done_fn done, uint64_t conn_id,
                      uint32_t request_id);

/* Nonzero while a load runs. Loop thread. */
int st__reload_pending(const st__server_t *srv);

/* ------------------------------------------------------------- pieces */

/* listen.c: socket path of device `index` into out (ST_ERR_LIMIT with a
 * message naming the length when it does not fit in sun_path). */
int st__socket_path(const char *base, int index, char *out, size_t len, char *err,
                    size_t errlen);

/* sockdir.c: when cfg->base_path is NULL (no --base-path, config key or
 * $SHARED_TENSOR_BASE_PATH), sets it (owned by cfg) to the first default
 * base (common/sockdir.h) this process can use: $XDG_RUNTIME_DIR's when
 * XDG_RUNTIME_DIR is a directory of ours that we can write; /run's when
 * /run/sharedtensor exists or we can make it; else the /tmp fallback.
 * `why` gets one line for the log: which base and why, with the entries
 * passed over; "" when the base was already set. Creates nothing
 * (st__listen_open makes and checks the directory). ST_OK or
 * ST_ERR_OUT_OF_MEMORY. Main thread, at start. */
int st__sockdir_choose(st__config_t *cfg, char *why, size_t whylen);

/* listen.c: the gid of socket_group `name` (a group name of this host, or
 * a number). ST_OK, or ST_ERR_CONFIGURATION "socket_group 'x' is not a
 * group of this host". */
int st__socket_group_id(const char *name, gid_t *gid, char *err, size_t errlen);

/* listen.c: checks/creates the socket's directory, handles an existing
 * file at the path (stale socket: replaced; live server or non-socket:
 * refused), binds with socket_mode and starts accepting. A listening
 * socket handed over by a takeover (st__restart_listener) is taken
 * instead, after checking it is bound to that path. ST_OK or
 * ST_ERR_CONFIGURATION/ST_ERR_IO/ST_ERR_INVALID_ARGUMENT with a message.
 * Loop thread. */
int st__listen_open(st__server_t *srv, int device, char *err, size_t errlen);

/* listen.c: stops accepting, closes every listener and unlinks its socket
 * file if it is still the one we bound (not after srv->handed_over: the
 * new server serves it). Idempotent. Loop thread. */
void st__listen_close_all(st__server_t *srv);

/* listen.c: stops accepting (pause), connections wait in the backlog, or
 * accepts again. Loop thread. */
void st__listen_pause(st__server_t *srv, int pause);

/* peer.c: nonzero if the peer of connected socket fd, with these
 * credentials, may use the server: root, our own uid, a uid of
 * allow_uids, or a gid of allow_gids among its primary and supplementary
 * groups (SO_PEERGROUPS: the groups it had when it connected). */
int st__peer_admitted(const st__config_t *cfg, int fd, const struct ucred *cred);

/* peer.c: answers a connection we will not serve with one error response
 * (id 0) and closes it. Takes ownership of fd. Loop thread. */
void st__peer_refuse(int fd, int err, const char *message);

/* signals.c: starts the SIGTERM/SIGINT/SIGHUP watchers and ignores
 * SIGPIPE. Loop thread. */
void st__signals_start(st__server_t *srv);
void st__signals_stop(st__server_t *srv);

/* stats.c: request accounting (see st__counters_t). Loop thread only.
 *
 * st__stats_init: name_at(i) is the method of row i (n rows, static
 * strings; `call` among them). ST_OK or OUT_OF_MEMORY.
 * st__stats_free: frees the endpoint table.
 * st__stats_open: dispatch accepted request `id` of method row `method`
 * (ST__STATS_NMETHODS for an unknown name): counted, and open on `open`.
 * ST_OK, or OUT_OF_MEMORY: then it is counted as failed with that error
 * and the caller answers it with st__conn_send_fault.
 * st__stats_endpoint: the open call `id` names endpoint `name` (copied).
 * st__stats_answered: a reply to `id` was queued, with `code` (ST_OK: a
 * result). Nothing when no request `id` is open (a fault, or a second
 * reply).
 * st__stats_dropped: the connection closed: its open requests are
 * dropped and `open` is freed. */
int st__stats_init(st__server_t *srv, const char *(*name_at)(size_t), size_t n);
void st__stats_free(st__server_t *srv);
int st__stats_open(st__server_t *srv, st__open_reqs_t *open, uint32_t id, size_t method);
void st__stats_endpoint(st__server_t *srv, st__open_reqs_t *open, uint32_t id, const char *name);
void st__stats_answered(st__server_t *srv, st__open_reqs_t *open, uint32_t id, int code);
void st__stats_dropped(st__server_t *srv, st__open_reqs_t *open);

/* The latency bucket bounds (ST__STATS_NBUCKETS values), seconds. */
extern const double st__stats_bucket_bounds[ST__STATS_NBUCKETS];

/* metrics.c: appends the `metrics` method's text (Prometheus text format
 * 0.0.4; docs/operations.md, "Monitoring") to *sb. Loop thread. */
void st__metrics_text(st__server_t *srv, msgpack_sbuffer *sb);

/* describe.c: the result maps of hello (for a connection on socket
 * `device`), info and endpoints, and the device list of hello and info.
 * Loop thread. */
void st__describe_hello(msgpack_packer *pk, st__server_t *srv, int device);
void st__describe_info(msgpack_packer *pk, st__server_t *srv);
void st__describe_endpoints(msgpack_packer *pk, const st__generation_t *gen);
/* Frees what describe.c keeps in srv (info's packed fixed pairs). Loop
 * thread, as the server is destroyed. */
void st__describe_free(st__server_t *srv);

#endif

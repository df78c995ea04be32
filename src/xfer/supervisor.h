/* src/xfer/supervisor.h: the server's handle on its transfer helper
 * (supervisor.c; docs/multihost.md, "The transfer helper").
 *
 * The supervisor spawns `stserver --xfer-helper FD` (fork and exec of the
 * server's own binary), talks to it over a SOCK_SEQPACKET socketpair
 * watched by a libev io watcher, and calls back per transfer. When the
 * helper dies every transfer it ran fails ("the transfer helper exited
 * (signal 9)") and a new helper is spawned after a backoff; a transfer
 * that outlives its deadline is aborted, and when the abort is not
 * answered within the grace the helper is killed: the abort of last
 * resort.
 *
 * Threads: every function and every callback runs on the thread of the
 * loop given to st__xfer_sup_new; nothing blocks (a kill's reaping is
 * polled by a timer).
 */
#ifndef ST_XFER_SUPERVISOR_H
#define ST_XFER_SUPERVISOR_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "xfer/engine.h"

typedef struct st__xfer_sup st__xfer_sup_t;

typedef struct st__xfer_sup_config {
  const char *exe;          /* the binary to run with --xfer-helper; NULL:
                               /proc/self/exe (the server's own)          */
  const char *ucx_library;  /* NULL: libucp.so.0 (peer.ucx_library)       */
  const char *nccl_library; /* NULL: libnccl.so.2 (peer.nccl_library)     */
  unsigned max_transfers;   /* at once; 0: 16; at most ST_XFER_MAX_TRANSFERS */
  double kill_grace;        /* seconds from a transfer's deadline to its
                               abort being answered before the helper is
                               killed; 0: 5                               */
  double restart_min;       /* backoff of a respawn, seconds; 0: 0.1      */
  double restart_max;       /* 0: 10                                      */
  int log_level;            /* the helper's st__log level; -1: info       */
} st__xfer_sup_config_t;

/* Per-transfer callbacks. After a successful st__xfer_sup_open, `done`
 * is called exactly once (and nothing after it); `opened` at most once,
 * before it; `progress` any number of times between. A callback may call
 * open, start, abort and probe, not st__xfer_sup_free. */
typedef struct st__xfer_sup_cbs {
  /* The helper opened the transfer: blob[0..len) is the local rendezvous
   * blob to hand to the peer (borrowed for the call; an NCCL unique id is
   * a secret: send it over the peer channel only, never log it). */
  void (*opened)(void *ud, uint64_t xfer, const uint8_t *blob, size_t len);
  void (*progress)(void *ud, uint64_t xfer, uint64_t bytes, uint64_t total);   /* may be NULL */
  /* ok: every byte moved (a receiver: every byte is in its arenas; a
   * sender: the receiver said so). The helper has let go of the arenas
   * when this is called. code: ST_OK or the failure's ST_ERR_*. */
  void (*done)(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code, const char *error);
} st__xfer_sup_cbs_t;

/* One arena to move, for st__xfer_sup_start. */
typedef struct st__xfer_sup_arena {
  int fd;                   /* borrowed: the supervisor sends a dup       */
  uint64_t bytes;           /* the arena's size (the helper checks it
                               against the descriptor)                    */
  int cuda;                 /* 1: an exported VMM allocation              */
  const char *uuid;         /* CUDA: the device's "GPU-..." UUID          */
  uint64_t off, len;        /* len > 0: only the window [off, off + len)
                               of the arena moves (a hand-off's chunk);
                               0: all of it                               */
} st__xfer_sup_arena_t;

/* What st__xfer_sup_probe answers: one row per engine of engines.c. */
typedef struct st__xfer_sup_probe {
  const char *engine;       /* "ucx", "nccl"                              */
  st__xfer_probe_t probe;
} st__xfer_sup_probe_t;
typedef void (*st__xfer_sup_probe_cb)(void *ud, const st__xfer_sup_probe_t *rows, size_t n);

/* Creates the supervisor and spawns the helper. `cfg` is copied (its
 * strings too). ST_OK with *out, or ST_ERR_IO / ST_ERR_OUT_OF_MEMORY
 * with the reason (socketpair or fork failed). Loop thread. */
int st__xfer_sup_new(struct ev_loop *loop, const st__xfer_sup_config_t *cfg,
                     st__xfer_sup_t **out, char *err, size_t errlen);

/* Stops the watchers, closes the socket (the helper exits), kills and
 * reaps the helper (waitpid, bounded by SIGKILL) and frees everything.
 * No callback is called for transfers in flight. NULL is a no-op. */
void st__xfer_sup_free(st__xfer_sup_t *s);

/* Opens a transfer: `engine` "ucx" or "nccl", `role`, `nranks` (2, or
 * N+1 for a fan-out to N receivers where the engine has it) and `rank`
 * (the sender 0), `timeout_ms` for the whole transfer. *xfer receives
 * its id. On ST_OK the callbacks of `cbs` (borrowed, must outlive the
 * transfer) are called with `ud`; an error return (ST_ERR_LIMIT: as many
 * transfers as max_transfers; ST_ERR_INVALID_ARGUMENT) calls none. */
int st__xfer_sup_open(st__xfer_sup_t *s, const char *engine, st__xfer_role_t role, int nranks,
                      int rank, uint32_t timeout_ms, const st__xfer_sup_cbs_t *cbs, void *ud,
                      uint64_t *xfer, char *err, size_t errlen);

/* Starts an opened transfer with the peer's blob (copied) and the arenas
 * (their descriptors dup'ed; the caller keeps its own). ST_OK, or
 * ST_ERR_NOT_FOUND (no such transfer), ST_ERR_INVALID_ARGUMENT (started
 * already, bad blob or arena count), ST_ERR_IO (dup failed): then the
 * transfer goes on as before, and the caller may abort it. */
int st__xfer_sup_start(st__xfer_sup_t *s, uint64_t xfer, const uint8_t *peer, size_t peer_len,
                       const st__xfer_sup_arena_t *arenas, size_t n, char *err, size_t errlen);

/* Asks the helper to stop the transfer; its done callback then reports
 * the failure with `reason` (NULL: "aborted"). ST_OK or ST_ERR_NOT_FOUND. */
int st__xfer_sup_abort(st__xfer_sup_t *s, uint64_t xfer, const char *reason);

/* Asks the helper what each engine is here (library, version, reason);
 * cb is called once, with the rows, or with every row unavailable and
 * the reason when the helper died first. ST_OK or ST_ERR_LIMIT (16
 * probes in flight). */
int st__xfer_sup_probe(st__xfer_sup_t *s, st__xfer_sup_probe_cb cb, void *ud, char *err,
                       size_t errlen);

/* The helper's pid (0 while none runs) and how many helpers were
 * spawned in all: tests and metrics. */
pid_t st__xfer_sup_pid(const st__xfer_sup_t *s);
unsigned st__xfer_sup_spawns(const st__xfer_sup_t *s);

#endif

/* src/xfer/engine.h: the interface every transfer engine implements.
 *
 * An engine moves the bytes of a list of arenas from one process to
 * another host's process (docs/multihost.md, "Engines"). It runs in the
 * transfer helper only (helper.c), on the helper's one thread, never in
 * the server. A transfer's life:
 *
 *   open(role)  -> a local rendezvous blob (UCX: the worker's address;
 *                  NCCL: the unique id, on the sending side)
 *   the two servers swap blobs over their peer channel
 *   start(peer blob, arenas)
 *   poll ... until DONE or FAILED (bytes done so far on every call)
 *   abort(reason) at any time after open; close once, after the end
 *
 * A third engine (Mooncake's or NIXL's C API) is one more file that fills
 * a st__xfer_engine_t and one row of engine.c's table.
 */
#ifndef ST_XFER_ENGINE_H
#define ST_XFER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

/* Longest rendezvous blob an engine may hand out or accept (a UCX worker
 * address over TCP and shared memory is a few hundred bytes; NCCL's
 * unique id is 128). */
#define ST_XFER_BLOB_MAX 4096
/* Most arenas one transfer moves. */
#define ST_XFER_MAX_ARENAS 1024

typedef enum { ST_XFER_SEND = 0, ST_XFER_RECV = 1 } st__xfer_role_t;

typedef enum {
  ST_XFER_RUNNING = 0,
  ST_XFER_DONE = 1,
  ST_XFER_FAILED = 2,
} st__xfer_state_t;

/* What kind of memory an engine moves. */
typedef enum { ST_XFER_MEM_CPU = 1, ST_XFER_MEM_CUDA = 2 } st__xfer_mem_t;

/* What a probe found: the library's version even when something else is
 * missing (so that two servers can compare versions), whether the engine
 * can run here, and why not. */
typedef struct st__xfer_probe {
  int available;          /* 1: transfers can run                          */
  char version[32];       /* "1.13.1", "2.28.9"; "" when none was read     */
  char library[256];      /* what was loaded: the path or soname asked for */
  char reason[320];       /* when !available: what is missing, and the key */
} st__xfer_probe_t;

/* One arena of a transfer, mapped in the helper. */
typedef struct st__xfer_arena {
  void *addr;             /* CPU: the mapping; CUDA: the device address    */
  uint64_t bytes;         /* bytes to move (the whole arena)               */
  int device;             /* CUDA: the device ordinal in the helper; -1    */
} st__xfer_arena_t;

/* The parameters of a transfer's open. */
typedef struct st__xfer_open {
  st__xfer_role_t role;
  int nranks;             /* 2 for one sender and one receiver; N+1 for a
                             fan-out to N receivers (engines that say
                             fanout)                                        */
  int rank;               /* the sender is 0; receivers 1..nranks-1        */
  double deadline;        /* st__now_mono() by which the transfer must end */
  uint64_t id;            /* the transfer's id, for messages               */
} st__xfer_open_t;

typedef struct st__xfer st__xfer_t;   /* an engine's per-transfer state */

typedef struct st__xfer_engine {
  const char *name;       /* "ucx", "nccl": the name on the wire          */
  st__xfer_mem_t memory;  /* the memory its arenas must be               */
  int fanout;             /* 1: nranks > 2 is supported                    */

  /* Loads the engine's library (`library`: a path; NULL: its soname) and
   * fills *out. ST_OK when available, else ST_ERR_CAPABILITY. The first
   * successful probe fixes the library the process uses. */
  int (*probe)(const char *library, st__xfer_probe_t *out);

  /* Opens a transfer. On ST_OK *x is the engine's state (owned by the
   * caller, released with close) and blob[0..*blob_len) the rendezvous
   * blob for the peer (*blob_len <= ST_XFER_BLOB_MAX; may be 0). A
   * failure returns a negative ST_ERR_* with the reason in err. The
   * probe must have found the engine available. */
  int (*open)(const st__xfer_open_t *o, st__xfer_t **x, uint8_t *blob, size_t *blob_len,
              char *err, size_t errlen);

  /* Starts moving: `peer`/`peer_len` is the other side's blob (for a
   * fan-out's sender, the blob of any receiver), arenas[0..n) the
   * memory (borrowed: mapped until close returns). ST_OK, or a negative
   * ST_ERR_* with the reason (the transfer is then failed; close it). */
  int (*start)(st__xfer_t *x, const uint8_t *peer, size_t peer_len,
               const st__xfer_arena_t *arenas, size_t n, char *err, size_t errlen);

  /* Advances the transfer without blocking. Returns its state; *bytes
   * receives the bytes done so far; on ST_XFER_FAILED err says why (a
   * peer that died, the deadline passed in which phase, ...). */
  st__xfer_state_t (*poll)(st__xfer_t *x, double now, uint64_t *bytes, char *err,
                           size_t errlen);

  /* What the helper may sleep on: returns 1 with *fd a descriptor that
   * becomes readable when poll has work (armed: sleep is safe), 0 when
   * poll must run again before sleeping, -1 when the engine has no
   * descriptor (the helper polls it on a short tick). */
  int (*wait_fd)(st__xfer_t *x, int *fd);

  /* Stops the transfer; later polls report FAILED with `why`. Bounded:
   * an engine that could block here (NCCL) uses its abort call. */
  void (*abort)(st__xfer_t *x, const char *why);

  /* Releases the transfer (after DONE, FAILED or abort); NULL is a no-op.
   * The arenas may be unmapped once it returns. */
  void (*close)(st__xfer_t *x);
} st__xfer_engine_t;

/* The engines' rows (ucx.c, nccl.c); engines.c lists them. */
extern const st__xfer_engine_t st__xfer_ucx_engine;
extern const st__xfer_engine_t st__xfer_nccl_engine;

#endif

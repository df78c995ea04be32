/* src/server: keys that cross hosts (docs/multihost.md, "Pulling a key").
 *
 * remote.c starts what peers need when config.lua configures any: the
 * transfer helper (src/xfer/supervisor.h), whose probe of the engines
 * goes into the peer channel's hellos, then the channel itself
 * (src/peer/peer.h); and it serves the peer methods of the side that
 * holds a key: peer_describe (a version's value and arenas, for exported
 * keys only), peer_xfer_open (its arenas lent to the helper for one
 * transfer) and peer_xfer_abort. rpc_pull.c is the side that asks: the
 * `pull` method, a task that describes, allocates (charged before any
 * byte moves), transfers and publishes.
 *
 * Loop 0 only (the channel's loop and the supervisor's), with the write
 * side of the server lock.
 */
#ifndef ST_SERVER_REMOTE_H
#define ST_SERVER_REMOTE_H

#include <msgpack.h>
#include <stdint.h>

#include "engine/result.h"
#include "peer/peer.h"
#include "proto/proto.h"
#include "server/server.h"

struct st__xfer_sup;
struct st__pull;
struct st__lend;

/* The engines as the helper's probe found them (peer_hello's). */
typedef struct st__remote_engine {
  char name[16];
  char version[32];           /* "" when unavailable */
  char why[320];
} st__remote_engine_t;

/* The per-server state of remote.c and rpc_pull.c (srv->remote). */
typedef struct st__remote {
  struct st__xfer_sup *sup;   /* owned: the transfer helper's handle, or
                                 NULL when it could not start            */
  st__remote_engine_t engines[4];
  size_t nengines;
  int probed;                 /* the probe answered                       */
  struct st__pull *pulls;     /* rpc_pull.c: the pulls in flight          */
  struct st__lend *lends;     /* remote.c: arenas lent to peers' pulls    */
  uint64_t pulls_done, pulls_failed, lends_done, lends_failed;
  uint64_t bytes_in, bytes_out;
} st__remote_t;

/* Starts the helper (when the channel is configured), waits up to a few
 * seconds for its engines' probe, then starts the channel with them and
 * adds the peer methods. Nothing at all when config.lua configures no
 * peer. ST_OK, or the error of the channel's start in err (a bind, the
 * key file): the server does not start then. A helper that cannot start
 * is logged; the engines are then reported unavailable with why. */
int st__remote_start(st__server_t *srv, char *err, size_t errlen);

/* Aborts every transfer, ends every pull's task CANCELLED, stops the
 * channel and the helper. NULL state is fine. */
void st__remote_stop(st__server_t *srv);

/* rpc_pull.c: the pulls in flight, for the channel's state changes and
 * the stop. */
typedef struct st__pull st__pull_t;
/* What a pull asks (st__pull_start). */
typedef struct st__pull_req {
  const char *peer, *key, *as;      /* as: the name here                */
  uint64_t version;                 /* 0: the latest                    */
  int device;                       /* -1 cpu, N cuda:N, -3 the key's kind */
  int policy;                       /* st__key_policy_t                 */
  const struct st__grant *readers;  /* NULL: none                       */
  uid_t uid;                        /* who owns the replica             */
  int pushed;                       /* a peer's replicate: answer ...   */
  st__peer_ticket_t push_ticket;    /* ... this peer_pull when it ends  */
  uint64_t push_id;                 /* the pusher's replicate task      */
} st__pull_req_t;

/* Starts a pull task (rpc_pull.c): ST_OK with its id in *task_id (the
 * task may already have failed: status says why), or an error with the
 * reason (no channel, a name, the peer not up or not a peer, the task
 * table). */
int st__pull_start(st__server_t *srv, const st__pull_req_t *q, uint64_t *task_id, char *err,
                   size_t errlen);

/* Stops the pulls that peer `peer`'s replicate task push_id started. */
void st__pulls_stop_pushed(st__server_t *srv, const char *peer, uint64_t push_id);

/* rpc_replicate.c: the peer methods of a push's receiver (peer_pull,
 * peer_pull_cancel), added to the channel by st__remote_start. ST_OK or
 * the channel's error. */
int st__replicate_methods(st__server_t *srv);

/* Ends every pull from `peer` (NULL: every pull) with `code` and `why`. */
void st__pulls_fail(st__server_t *srv, const char *peer, int code, const char *why);
/* How many pulls from `peer` (NULL: any) run now, and the bytes they
 * move. */
void st__pulls_of(const st__server_t *srv, const char *peer, unsigned *n, uint64_t *bytes);

/* info's `transfers` (docs/protocol.md, "info"): nil without peers,
 * else {helper_pid, helper_spawns, engines: {name: version | "unavailable:
 * why"}, pulls, pulls_done, pulls_failed, lends, lends_done, lends_failed,
 * bytes_in, bytes_out}. */
void st__remote_pack_info(msgpack_packer *pk, const st__server_t *srv);

/* A fresh buffer and its packer for a peer message; `request`: the
 * params array of a request begins (one map follows). The caller
 * destroys sb. */
void st__remote_pack_begin(msgpack_sbuffer *sb, msgpack_packer *pk, int request);

/* A peer request's parameters (nothing a peer sends is trusted): the
 * string `k` of the map, whole and not empty, copied into out[cap]; the
 * unsigned integer `k` in *out. 1, or 0 when absent or not such a value
 * (out untouched). params may be NULL. */
int st__remote_param_str(const msgpack_object *params, const char *k, char *out, size_t cap);
int st__remote_param_u64(const msgpack_object *params, const char *k, uint64_t *out);

/* ST_OK when `peer` is a configured peer whose link is up, else
 * NOT_FOUND ("'x' is not a peer of this server (peer.peers)") or
 * CAPABILITY ("peer 'x' is down (stcli peers says why)") in err. */
int st__remote_peer_up(const st__server_t *srv, const char *peer, char *err, size_t errlen);

struct st__xfer_sup_arena;
/* The arenas of res as the helper takes them: one new descriptor each
 * (read-only when `readonly`; a CUDA arena's export), in fds[], and
 * their rows in arenas[] (uuid strings in descs[]). The count, or an
 * error with the reason (what was opened is closed). The caller closes
 * the descriptors once the helper has them. */
int st__remote_arena_fds(const st__build_result_t *res, int readonly, int *fds,
                         struct st__xfer_sup_arena *arenas, st__arena_desc_t *descs, char *err,
                         size_t errlen);

/* The engine a pull uses: "nccl" when both ends are CUDA memory and
 * `nccl_usable` (both servers have NCCL, and the same version), else
 * "ucx" (CPU memory; a CUDA end is staged through host memory by the
 * helper, src/xfer/helper.c). */
const char *st__remote_engine_for(int src_cuda, int dst_cuda, int nccl_usable);

/* Whether `engine` can move a source key of this memory kind: "ucx" any
 * (CUDA staged), "nccl" CUDA only. */
int st__remote_engine_fits(const char *engine, int cuda);

#endif

/* src/server: what the peer side of the server shares (docs/multihost.md):
 * its state (srv->remote), reading and packing peer messages, the
 * exported keys, the arenas as the transfer helper takes them, and the
 * engine a transfer uses. The units that serve peers build on it:
 * remote.c (the start and stop, and the side of a pull that holds the
 * key), rpc_pull.c and replica.c (the side that asks), rpc_replicate.c
 * (pushes), live_source.c (the subscriptions to this server's live keys).
 *
 * Loop 0 only (the channel's loop and the supervisor's), with the write
 * side of the server lock.
 */
#ifndef ST_SERVER_PEERING_H
#define ST_SERVER_PEERING_H

#include <msgpack.h>
#include <stdint.h>

#include "engine/keys.h"
#include "engine/result.h"
#include "peer/peer.h"
#include "proto/proto.h"
#include "server/server.h"

struct st__xfer_sup;
struct st__pull;
struct st__lend;
struct st__replica;
typedef struct st__live_sub st__live_sub_t;

/* The engines as the helper's probe found them (peer_hello's). */
typedef struct st__remote_engine {
  char name[16];
  char version[32];           /* "" when unavailable */
  char why[320];
} st__remote_engine_t;

/* The per-server state of the peer side (srv->remote), made by
 * st__remote_start. */
typedef struct st__remote {
  struct st__xfer_sup *sup;   /* owned: the transfer helper's handle, or
                                 NULL when it could not start            */
  st__remote_engine_t engines[4];
  size_t nengines;
  char gpus[ST__PEER_DEVICES_MAX];    /* this server's CUDA devices' UUIDs,
                                         space-separated (NCCL's devices in
                                         peer_hello)                      */
  int probed;                 /* the probe answered                       */
  struct st__pull *pulls;     /* rpc_pull.c: the pulls in flight          */
  struct st__lend *lends;     /* remote.c: arenas lent to peers' pulls    */
  uint64_t pulls_done, pulls_failed, lends_done, lends_failed;
  uint64_t lends_staged;      /* live versions sent from a staging copy   */
  uint64_t bytes_in, bytes_out;
  st__live_sub_t *subs;       /* live_source.c: peers' replicas of our keys */
  struct st__pwatch *lpwatch; /* live_source.c: reads their pages at each
                                 update (page_watch.h), or NULL            */
  struct st__replica *replicas;   /* replica.c: our replicas of peers' keys */
  uint64_t next_xfer;         /* replica.c: ids of its transfers           */
  struct st__hsrc *hsrcs;     /* handoff_source.c: peers following our hand-offs */
  struct st__hsend *hsends;   /* handoff_source.c: chunks lent to the helper */
  struct st__pwatch *hpwatch; /* handoff_source.c: reads their pages on
                                 each publish (page_watch.h), or NULL      */
  struct st__mirror *mirrors; /* handoff_mirror.c: our mirrors of peers' hand-offs */
  ev_timer mcheck;            /* handoff_mirror.c: mirrors left without consumers */
  int mcheck_on;
} st__remote_t;

/* A fresh buffer and its packer for a peer message; `request`: the
 * params array of a request begins (one map follows). The caller
 * destroys sb. */
void st__remote_pack_begin(msgpack_sbuffer *sb, msgpack_packer *pk, int request);

/* A st__peer_reply_fn for a request whose answer nobody waits for (a
 * notice to a peer, an abort): it ignores the outcome. */
void st__remote_ignore_reply(void *ud, const char *peer, int code, const char *message,
                             const msgpack_object *result);

/* Answers a peer request {blob: this side's rendezvous blob}. */
void st__remote_reply_blob(st__peer_t *p, st__peer_ticket_t ticket, const uint8_t *blob,
                           size_t len);

/* The blob of a peer's answer to a request that opens a transfer
 * (peer_xfer_open, peer_handoff_send): ST_OK with *blob (borrowed from
 * result), or the peer's error, or PROTOCOL for an answer without one,
 * with the reason in err. */
int st__remote_answer_blob(const char *peer, const char *method, int code, const char *message,
                           const msgpack_object *result, const msgpack_object **blob, char *err,
                           size_t errlen);

/* Whether `name` may leave this host: a glob of peer.export matches all
 * of it (keys and hand-offs alike). */
int st__remote_exported(const st__peer_conf_t *pc, const char *name);

/* Answers a peer request `true`. */
void st__remote_reply_true(st__peer_t *p, st__peer_ticket_t ticket);

/* The seconds a whole transfer may take (peer.transfer_timeout_s; 600
 * when unset), and a peer request that should be answered at once
 * (peer.connect_timeout_s; 10 when unset). */
double st__remote_transfer_timeout(const st__server_t *srv);
double st__remote_connect_timeout(const st__server_t *srv);

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

/* Asks peer `peer` to send key `key` (its version `version`; a live key
 * with `live`) to this server's receive `xfer_id`, opened over `engine`
 * with blob[0..len) (peer_xfer_open); cb gets the answer with ud, and
 * *req names the request while it is pending. ST_OK, or the error with
 * the reason in err (cb is then never called). */
int st__remote_ask_send(st__server_t *srv, const char *peer, const char *key, uint64_t version,
                        uint64_t xfer_id, const char *engine, int live, const uint8_t *blob,
                        size_t len, st__peer_reply_fn cb, void *ud, uint64_t *req, char *err,
                        size_t errlen);

/* The sender's answer to peer_xfer_open (code, message and result as cb
 * of st__remote_ask_send gets them) starts the helper's receive `xfer`
 * into res's arenas (writable descriptors), the sender's blob in hand:
 * at_start(ud) (may be NULL) runs just before the helper is told. ST_OK,
 * or the error with the reason in err (the receive is not started). */
int st__remote_start_receive(st__server_t *srv, const char *peer, int code, const char *message,
                             const msgpack_object *result, uint64_t xfer,
                             const st__build_result_t *res, void (*at_start)(void *ud), void *ud,
                             char *err, size_t errlen);

/* The version `version` (0: the latest) of exported key `name`, for a
 * peer: ST_OK with *key and *v (borrowed), or an error with the reason
 * (AUTH: not exported; the table's NOT_FOUND, STALE_HANDLE). A live key
 * is refused unless `live` (its bytes change in place: a pull copies a
 * version that stays). */
int st__remote_find_exported(st__server_t *srv, const char *name, uint64_t version, int live,
                             st__key_t **key, st__key_version_t **v, char *err, size_t errlen);

/* The engine a pull uses: "nccl" when both ends are CUDA memory and
 * `nccl_usable` (both servers have NCCL, and the same version), else
 * "ucx" (CPU memory; a CUDA end is staged through host memory by the
 * helper, src/xfer/helper.c). */
const char *st__remote_engine_for(int src_cuda, int dst_cuda, int nccl_usable);

/* Whether `engine` can move a source key of this memory kind: "ucx" any
 * (CUDA staged), "nccl" CUDA only. */
int st__remote_engine_fits(const char *engine, int cuda);

#endif

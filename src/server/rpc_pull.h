/* src/server: `pull`, the side of a pull that asks (rpc_pull.c;
 * docs/protocol.md, "pull"; docs/multihost.md, "Pulling a key"): a task
 * that describes, allocates (charged before any byte moves), transfers
 * and publishes. Loop 0, the write side of the server lock. */
#ifndef ST_SERVER_RPC_PULL_H
#define ST_SERVER_RPC_PULL_H

#include "server/peering.h"

/* The pulls in flight, for the channel's state changes and the stop. */
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
  int live;                         /* a live key, followed (replica.c) */
} st__pull_req_t;

/* Starts a pull task (rpc_pull.c): ST_OK with its id in *task_id (the
 * task may already have failed: status says why), or an error with the
 * reason (no channel, a name, the peer not up or not a peer, the task
 * table). */
int st__pull_start(st__server_t *srv, const st__pull_req_t *q, uint64_t *task_id, char *err,
                   size_t errlen);

/* peer_live_sent for a live pull's first transfer (`xfer`: its id):
 * 1 when it was one of ours (taken), else 0. */
int st__pull_live_sent(st__server_t *srv, const char *peer, uint64_t xfer, uint64_t version,
                       int whole);

/* Stops the pulls that peer `peer`'s replicate task push_id started. */
void st__pulls_stop_pushed(st__server_t *srv, const char *peer, uint64_t push_id);


/* Ends every pull from `peer` (NULL: every pull) with `code` and `why`. */
void st__pulls_fail(st__server_t *srv, const char *peer, int code, const char *why);
/* How many pulls from `peer` (NULL: any) run now, and the bytes they
 * move. */
void st__pulls_of(const st__server_t *srv, const char *peer, unsigned *n, uint64_t *bytes);

#endif

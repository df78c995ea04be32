/* src/server: the side of a live replication that holds the replica
 * (replica.c; docs/multihost.md, "Live replication"). Loop 0, the write
 * side of the server lock. */
#ifndef ST_SERVER_REPLICA_H
#define ST_SERVER_REPLICA_H

#include "server/peering.h"

/* Adds peer_live_version and peer_live_sent. */
int st__replica_methods(st__server_t *srv);
/* A live pull published its replica (key `as`, from peer's `key`, the
 * version the first transfer brought, its arenas and page): the
 * subscription starts, and every later version is brought in place. The
 * pull's id names it to the peer. ST_OK or the reason. */
int st__replica_start(st__server_t *srv, uint64_t id, const char *peer, const char *key,
                      const char *as, const char *engine, uint64_t version, char *err,
                      size_t errlen);
/* The link to `peer` went down (NULL: the server stops): its replicas
 * keep their last complete version and say the source is lost. */
void st__replicas_lost(st__server_t *srv, const char *peer, const char *why);
/* How many replicas here follow a peer's key, the lost ones included
 * (info). */
unsigned st__replicas_count(const st__server_t *srv);
/* Frees every replica (the server stops; st__replicas_lost first). */
void st__replicas_free(st__server_t *srv);
/* The replica state of key `as` here, or nil (replicas' `source`):
 * {peer, key, version, updates, torn, lost, why}. */
void st__replica_pack(msgpack_packer *pk, const st__server_t *srv, const char *as);
/* Ends the subscription of replica `as` (the key stays, with its last
 * version, in *version (may be NULL), as a live key of no publisher),
 * for `who` (NULL: the server itself): ST_OK, NOT_FOUND, or AUTH when
 * the key is another uid's and who is no admin. */
int st__replica_unsubscribe(st__server_t *srv, const char *as, const st__who_t *who,
                            uint64_t *version, char *err, size_t errlen);
/* Whether key `name` is a replica its subscription writes: a client's
 * live put into it is refused (keys_live.c asks). */
int st__replica_busy(const st__server_t *srv, const char *name);

#endif

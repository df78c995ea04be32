/* src/server: the receiving side of a push (rpc_replicate.c;
 * docs/multihost.md, "Pushing a key"), and the `replicate` method.
 * Loop 0, the write side of the server lock. */
#ifndef ST_SERVER_RPC_REPLICATE_H
#define ST_SERVER_RPC_REPLICATE_H

#include "server/peering.h"

/* The peer methods of a push's receiver (peer_pull,
 * peer_pull_cancel), added to the channel by st__remote_start. ST_OK or
 * the channel's error. */
int st__replicate_methods(st__server_t *srv);

#endif

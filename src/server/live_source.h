/* src/server: the side of a live replication that holds the live key
 * (live_source.c; docs/multihost.md, "Live replication"). Loop 0, the
 * write side of the server lock. */
#ifndef ST_SERVER_LIVE_SOURCE_H
#define ST_SERVER_LIVE_SOURCE_H

#include "server/peering.h"

/* Adds peer_live_subscribe and peer_live_unsubscribe. */
int st__live_source_methods(st__server_t *srv);
/* How many peers' replicas follow this server's keys (info). */
unsigned st__live_source_count(const st__server_t *srv);
/* Ends peer's subscriptions (its link went down). */
void st__live_source_peer_down(st__server_t *srv, const char *peer);
/* Ends every subscription, each announced gone (the server stops). */
void st__live_source_stop(st__server_t *srv);
/* The subscribers of live key `key` (replicas' `subscribers`):
 * [{peer, version (the last announced), since}]. */
void st__live_source_pack(msgpack_packer *pk, const st__server_t *srv, const char *key);
/* A lend of a fenced live version ended (ok: the receiver has every
 * byte): the version checked, the fence dropped (when `raised`), and the
 * receiver told (peer_live_sent {xfer, version, whole}). `page` NULL: the
 * lend sent a staging copy checked whole when it was made (live_stage.h). */
void st__live_lend_sent(st__server_t *srv, const char *peer, uint64_t remote_xfer,
                        st__key_page_t *page, uint64_t version, int raised, int ok);

#endif

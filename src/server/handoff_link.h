/* src/server: hand-offs across servers (docs/multihost.md, "Hand-offs
 * across servers"; docs/protocol.md, "Hand-offs").
 *
 * A client opens `name@peer`: this server mirrors peer's hand-off `name`
 * in a hand-off of its own of the same geometry (handoff_mirror.c), whose
 * producer is the server and whose consumers are its clients; on the
 * peer, the mirror holds one consumer slot of the hand-off
 * (handoff_source.c). Each chunk the peer's producer publishes is
 * announced, moved by the transfer helpers into the same chunk of the
 * mirror and published there under the peer's sequence number, so that a
 * ticket (chunk, seq) the producer hands out reads the same on both
 * servers; the peer's chunk is acknowledged for the mirror once every
 * byte arrived, and is recycled as for a local consumer.
 *
 * Loop 0 with the write side of the server lock, but where said.
 */
#ifndef ST_SERVER_HANDOFF_LINK_H
#define ST_SERVER_HANDOFF_LINK_H

#include "server/peering.h"
#include "server/rpc.h"
#include "xfer/supervisor.h"

/* ------------------------------------------------------------- the source side */

/* Adds peer_handoff_subscribe, peer_handoff_unsubscribe and
 * peer_handoff_send. */
int st__hsrc_methods(st__server_t *srv);
/* Ends peer's subscriptions (NULL: all; its link went down, or the
 * server stops: `stopping`, no hand-off is touched then). */
void st__hsrc_peer_down(st__server_t *srv, const char *peer, int stopping);
/* How many of this server's hand-offs peers follow (info). */
unsigned st__hsrc_count(const st__server_t *srv);
/* Packs the peers that follow hand-off `serial`: [{peer, slot, since}]
 * (the `handoffs` listing). */
void st__hsrc_pack(msgpack_packer *pk, const st__server_t *srv, uint64_t serial);

/* ------------------------------------------------------------- the mirror side */

/* Adds peer_handoff_ready. */
int st__mirror_methods(st__server_t *srv);
/* handoff_open of a name "name@peer" (r's `name`): the mirror is opened,
 * made first when there is none (answered once the peer took the
 * subscription). Any loop, the write side held. */
void st__mirror_open(st__rpc_req_t *r, const char *name, size_t len);
/* A connection left a hand-off: mirrors without consumers end (their
 * subscription too) on loop 0 soon after. Any loop, the write side held. */
void st__mirrors_check(st__server_t *srv);
/* The link to `peer` went down (NULL: the server stops): its mirrors
 * keep what was published and say the producer is gone. */
void st__mirrors_lost(st__server_t *srv, const char *peer, const char *why);
/* Frees every mirror (the server stops, after st__mirrors_lost): no
 * hand-off is touched. */
void st__mirrors_free(st__server_t *srv);
/* How many mirrors this server keeps (info). */
unsigned st__mirrors_count(const st__server_t *srv);
/* Packs what hand-off `serial` mirrors: {peer, source, state ("opening",
 * "live", "lost"), why, engine, chunks_in, bytes_in, queued, moving}, or
 * nil when it is no mirror (the `handoffs` listing). */
void st__mirror_pack(msgpack_packer *pk, const st__server_t *srv, uint64_t serial);

/* Shared by both sides (handoff_source.c): the descriptor of a hand-off's
 * data arena (read-only when `readonly` and on the CPU) and the windows
 * of chunks `chunk[0..n)` of `len[0..n)` bytes at `stride`, as the helper
 * takes them. The descriptor (the caller closes it), or an error. */
int st__handoff_windows(st__arena_t *data, int readonly, uint64_t stride, const uint32_t *chunk,
                        const uint64_t *len, size_t n, st__xfer_sup_arena_t *out,
                        st__arena_desc_t *desc, char *err, size_t errlen);

/* The pseudo connection ids that hold a slot (a peer's subscription) or
 * the producer's place (a mirror) of a hand-off: apart from every
 * client's. */
#define ST__HANDOFF_PEER_CONN (UINT64_C(1) << 63)
#define ST__HANDOFF_MIRROR_CONN (UINT64_C(3) << 62)

#endif

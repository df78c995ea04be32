/* src/server: keys that cross hosts (docs/multihost.md, "Pulling a key").
 *
 * remote.c starts what peers need when config.lua configures any: the
 * transfer helper (src/xfer/supervisor.h), whose probe of the engines
 * goes into the peer channel's hellos, then the channel itself
 * (src/peer/peer.h), with the peer methods of every unit that serves
 * peers (peering.h); and it serves those of the side that holds a key:
 * peer_describe (a version's value and arenas, for exported keys only),
 * peer_xfer_open (its arenas lent to the helper for one transfer; a live
 * key's under its page's fence) and peer_xfer_abort.
 *
 * Loop 0 only (the channel's loop and the supervisor's), with the write
 * side of the server lock.
 */
#ifndef ST_SERVER_REMOTE_H
#define ST_SERVER_REMOTE_H

#include <msgpack.h>

#include "server/server.h"

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

/* info's `transfers` (docs/protocol.md, "info"): nil without peers,
 * else {helper_pid, helper_spawns, engines: {name: version | "unavailable:
 * why"}, pulls, pulls_done, pulls_failed, lends, lends_done, lends_failed,
 * bytes_in, bytes_out, live_subscribers, live_replicas}. */
void st__remote_pack_info(msgpack_packer *pk, const st__server_t *srv);

#endif

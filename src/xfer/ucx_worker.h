/* src/xfer/ucx_worker.h: the UCX engine's one worker per transfer helper
 * and its endpoints to peers' workers, kept between transfers (ucx.c runs
 * the transfers on them; docs/multihost.md, "The UCX engine").
 *
 * A worker and an endpoint cost milliseconds to make (the worker binds its
 * transports, an endpoint's first message wires up a connection); a batch
 * of hand-off chunks or a live key's update must not pay that per
 * transfer. So the helper keeps one worker for all its transfers, and one
 * endpoint per remote worker address for as long as the peer lives:
 * transfers tell their messages apart by their tags (ucx.c).
 *
 * An endpoint that fails (the peer's helper died, the connection broke)
 * is dead: the transfers that use it are told (st__ucx_on_dead), no new
 * transfer takes it, and it is closed once the last one let go. A
 * transfer that ends with its traffic cut short may leave messages for
 * it in the worker; the worker is made again, fresh, once no transfer is
 * open (st__ucx_worker_dirty). At most ST__UCX_MAX_PEERS endpoints: past
 * it the least recently used idle one is closed.
 *
 * Everything runs on the helper's one thread.
 */
#ifndef ST_XFER_UCX_WORKER_H
#define ST_XFER_UCX_WORKER_H

#ifdef ST_HAVE_UCX
#include <stddef.h>
#include <stdint.h>

#include "xfer/ucx_api.h"

#define ST__UCX_MAX_PEERS 64

typedef struct st__ucx_peer st__ucx_peer_t;

/* The shared worker, made (with the process's UCP context) on first use
 * or after a reset: *w, its event descriptor (-1: none; poll on a tick)
 * and its address. ST_OK or ST_ERR_CAPABILITY / ST_ERR_INTERNAL with the
 * reason. `idle`: no transfer is open (a dirty worker is made again). */
int st__ucx_worker(const st__ucx_api_t *u, int idle, ucp_worker_h *w, int *efd,
                   const uint8_t **addr, size_t *len, char *err, size_t errlen);

/* Something of a transfer may be left in the worker (it ended with its
 * traffic cut short): make the worker again once no transfer is open. */
void st__ucx_worker_dirty(void);

/* Called when endpoint pe fails, with the reason; set once by ucx.c. */
void st__ucx_on_dead(void (*fn)(st__ucx_peer_t *pe, const char *why));

/* The live endpoint to the worker at addr[0..len), made when there is
 * none, with a reference for the caller; NULL with the reason in err. */
st__ucx_peer_t *st__ucx_peer_get(const uint8_t *addr, size_t len, char *err, size_t errlen);

/* Its UCP endpoint (NULL once dead and closed). */
ucp_ep_h st__ucx_peer_ep(const st__ucx_peer_t *pe);

/* Drops the caller's reference. */
void st__ucx_peer_put(st__ucx_peer_t *pe);

/* Closes pe at once (forced: every request on it completes, cancelled)
 * and marks it dead; its users are told through st__ucx_on_dead. For a
 * transfer that must stop sends the peer will never take. Bounded. */
void st__ucx_peer_kill(st__ucx_peer_t *pe, const char *why);

/* Progresses the worker (when there is one) until it has nothing to do,
 * and closes dead endpoints nobody uses any more. */
void st__ucx_progress(void);

#endif
#endif

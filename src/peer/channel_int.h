/* src/peer/channel_int.h: what the channel's files share (channel.c: the
 * listener, dials, hellos, messages and the tick; requests.c: requests
 * to peers, replies, the method table and the queries; conf.c: the peer
 * table's checks and addresses). Private to src/peer. Everything here
 * belongs to the channel's loop thread unless a function says otherwise.
 */
#ifndef ST_PEER_CHANNEL_INT_H
#define ST_PEER_CHANNEL_INT_H

#include <ev.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "peer/link.h"
#include "peer/peer.h"
#include "peer/resolve.h"
#include "peer/tls.h"

#define WHO "peer"
/* The channel's timer: deadlines, pings and dials are looked at this often. */
#define TICK_S 0.1
/* Dial backoff: first wait, factor 2, at most. */
#define BACKOFF_MIN_S 0.25
#define BACKOFF_MAX_S 10.0
/* A link that is up is pinged this often (peer_ping: liveness and rtt). */
#define PING_EVERY_S 5.0
/* Handlers at most. */
#define MAX_METHODS 64
/* Links of one peer at once (its incoming and outgoing ones). */
#define MAX_LINKS_PER_PEER 4

typedef struct peer_rec {
  const st__peer_entry_t *e;     /* borrowed from the configuration      */
  st__peer_state_t reported;     /* what the state listener last heard   */
  double since;                  /* unix time of the last state change   */
  char last_error[512];
  int refused;                   /* the last attempt was refused          */
  st__link_t *up;                /* the link that is up, or NULL          */
  st__link_t *dialing;           /* our outgoing link being made          */
  double next_dial;              /* monotonic                             */
  double backoff;
  int resolving;                 /* its host name is being resolved       */
} peer_rec_t;

typedef struct method_row {
  char name[64];
  st__peer_method_fn fn;
  void *ud;
} method_row_t;

typedef struct pending {
  uint64_t handle;
  uint64_t link;                 /* serial of the link it went out on     */
  uint32_t id;
  double deadline;
  st__peer_reply_fn cb;          /* NULL: internal (peer_ping, hello)     */
  void *ud;
  char peer[ST__PEER_ID_MAX + 1];
  struct pending *next;
} pending_t;

struct st__peer {
  struct ev_loop *loop;
  pthread_t thread;
  const st__peer_conf_t *conf;
  st__tls_ctx_t *tls;
  int lfd;                       /* listener, -1 when none               */
  ev_io accept_io;
  ev_timer tick;
  ev_async wake;
  st__resolver_t *resolver;      /* host names of peers, off the loop     */
  char listen_addr[96];
  int npeers;
  peer_rec_t peers[ST__PEER_MAX_PEERS];
  st__link_t *links;             /* every link, open or closed (freed by
                                    the tick once closed)                 */
  int pending_links;             /* incoming, not yet identified         */
  uint64_t next_serial, next_handle;
  pending_t *pending;
  int nmethods;
  method_row_t methods[MAX_METHODS];
  size_t nengines;
  st__peer_engine_t engines[ST__PEER_MAX_ENGINES];   /* owned strings */
  st__peer_state_fn on_state;
  void *on_state_ud;
  uint64_t refused_total;        /* incoming links refused or failed     */
  char last_refused[512];
  int stopping;
};

/* printf into dst (n bytes), cut where it does not fit: the messages here
 * are for people, and a cut one still says what happened. */
void st__peer_say(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* conf.c: ids of 1..255 of [A-Za-z0-9._-] (1), and "host:port" or
 * "[v6]:port" split into host and port (0, or -1 with err naming `key`;
 * port 0 only with allow_zero). */
int st__peer_id_ok(const char *id);
int st__peer_split_addr(const char *key, const char *addr, char *host, size_t hostlen,
                        char *port, size_t portlen, int allow_zero, char *err, size_t errlen);

/* channel.c: the record of peer `id` (len bytes), or NULL; the state a
 * peer is in now; a frame queued on l and sent now when this is the
 * loop thread, else the loop woken (any thread; ST_OK or the error, the
 * link then closed); an error reply. */
peer_rec_t *st__peer_find(const st__peer_t *p, const char *id, size_t len);
st__peer_state_t st__peer_state_of(const st__peer_t *p, const peer_rec_t *r);
int st__peer_send_frame(st__peer_t *p, st__link_t *l, const msgpack_sbuffer *sb);
int st__peer_send_error(st__peer_t *p, st__link_t *l, uint32_t id, int code, const char *msg);

/* requests.c: a pending request on l (its id taken from l), NULL when out
 * of memory; the one of (link serial, id) unlinked and returned, or NULL;
 * every pending request of link serial `link` (0: all) failed with its
 * callback. */
pending_t *st__peer_add_pending(st__peer_t *p, st__link_t *l, const char *peer, double timeout_s,
                                st__peer_reply_fn cb, void *ud);
pending_t *st__peer_take_pending(st__peer_t *p, uint64_t link, uint32_t id);
void st__peer_fail_pending(st__peer_t *p, uint64_t link, int code, const char *why);

#endif

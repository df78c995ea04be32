/* src/peer: one link of the channel: a TCP socket, its TLS connection
 * (tls.h), the frame reader (src/proto) and the queue of plaintext frames
 * to send. link.c moves bytes and cuts frames; what the frames mean is
 * channel.c's, through the hooks. Loop thread of the channel only.
 */
#ifndef ST_PEER_LINK_H
#define ST_PEER_LINK_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>

#include "peer/peer.h"
#include "peer/tls.h"
#include "proto/proto.h"

typedef struct st__link st__link_t;

/* What a link tells its owner. Each may close the link (st__link_close). */
typedef struct st__link_hooks {
  void (*on_secure)(st__link_t *l);                    /* TLS is up       */
  void (*on_message)(st__link_t *l, st__message_t *m); /* borrowed msg    */
  void (*on_closed)(st__link_t *l, const char *why);   /* once            */
} st__link_hooks_t;

enum { ST__LINK_CONNECT = 0, ST__LINK_TLS, ST__LINK_OPEN, ST__LINK_CLOSED };

/* One engine as a link compares it (peer_hello). */
typedef struct st__link_engine {
  char name[32];
  char local[64], remote[64];  /* versions; "" when that side lacks it   */
  int usable;
  char why[256];
} st__link_engine_t;

struct st__link {
  /* link.c's */
  struct ev_loop *loop;
  ev_io io;
  int fd;
  int stage;
  int outgoing;
  uint64_t serial;
  char remote[96];             /* "ip:port" of the other end             */
  st__tls_t *tls;
  st__reader_t rd;
  char *out;                   /* plaintext frames: [off, len)           */
  size_t off, len, cap;
  const st__link_hooks_t *hooks;
  void *owner;
  st__link_t *next;            /* the owner's list                       */
  /* channel.c's */
  void *peer;                  /* the peer record, once known            */
  double deadline;             /* connect + TLS + hello must end by then */
  double opened;               /* monotonic time it was made             */
  int hello_got;               /* we accepted the other side's hello     */
  int hello_ok;                /* the other side accepted ours           */
  int up;
  int refused;                 /* closed by a refusal (state "refused")  */
  char refusal[400];           /* why                                     */
  int close_after_flush;       /* an error reply is queued; then close   */
  uint32_t next_id;
  uint32_t hello_id;
  double hello_sent;
  double ping_sent;            /* 0: none outstanding                    */
  uint32_t ping_id;
  double rtt_us;
  int nengines;
  st__link_engine_t engines[2 * ST__PEER_MAX_ENGINES];
};

/* A link over fd (taken: closed by st__link_close): `connecting` when a
 * non-blocking connect is in progress (outgoing), else TLS starts now.
 * ST_OK with *out, or an error in err (fd closed). */
int st__link_new(struct ev_loop *loop, int fd, st__tls_ctx_t *ctx, int outgoing, int connecting,
                 const st__link_hooks_t *hooks, void *owner, st__link_t **out, char *err,
                 size_t errlen);

/* Queues one whole frame (copied). ST_OK, or ST_ERR_LIMIT past
 * ST__PEER_MAX_QUEUED / ST_ERR_OUT_OF_MEMORY (the caller closes). Sent by
 * the next st__link_pump. */
int st__link_queue(st__link_t *l, const void *frame, size_t len);

/* Moves what can move now: connect, handshake, queued frames out,
 * frames in (each handed to on_message). May close the link. */
void st__link_pump(st__link_t *l);

/* Whether frames wait to be sent. */
int st__link_has_output(const st__link_t *l);

/* Closes the socket and the TLS connection, calls on_closed(why) once;
 * the struct stays until st__link_free. Idempotent. */
void st__link_close(st__link_t *l, const char *why);
void st__link_free(st__link_t *l);

#endif

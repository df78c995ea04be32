/* src/server: one client connection (loop thread only).
 *
 * Reading: recvmsg into the frame reader (src/proto). Descriptors a client
 * sends (tensor arguments) queue in arrival order, at most
 * ST_CONN_MAX_PENDING_FDS; a request that lists N arenas takes the first N
 * (st__conn_take_fds), as docs/protocol.md says. Linux delivers a
 * sendmsg's descriptors with the read that holds its first byte, and ends
 * that read there; a request's own come with its first byte. So
 * descriptors that came with bytes all at or before the end of a handled
 * message cannot belong to a later one (what that message did not take is
 * a stray and is closed at once), those of a read that began after the
 * start of the half-sent frame that is all that remains belong to no
 * message (closed at once), and at the end of input all are closed. A
 * batch that would pass a descriptor limit is closed on arrival and
 * queued as -1s: its request gets LIMIT (dispatch.c). Each complete message goes
 * to the server's message hook (srv->on_message: st__dispatch, rpc.h). A
 * frame that stays half-sent
 * for frame_timeout_ms gets TIMEOUT and the connection is closed.
 *
 * Writing: a queue of frames (bytes + optional descriptors). A frame with
 * descriptors goes out with one SCM_RIGHTS control message on the sendmsg
 * that carries its first byte; the queue owns those descriptors and closes
 * them once sent or when the connection dies.
 *
 * Holdings: the descriptors and arena bytes of a reply count (out_fds,
 * out_bytes, and srv->held_fds/held_bytes with the unclaimed received
 * descriptors) from st__conn_send_pinned until the client has read it:
 * once sent they wait in the client's socket, where they still keep their
 * arenas alive; SIOCOUTQ = 0 (asked on reads, flushes, replies and every
 * 100 ms while some are out) says they were read. A connection whose
 * replies reach its limits is not read (back-pressure); a reply past them
 * is refused (st__conn_reply_room); a connection whose peer finished
 * sending stays until its replies were read or the peer left.
 *
 * Lifetime: closing (conn.c) unlinks the connection from the id table,
 * tells the server's close hook (srv->on_conn_closed) and closes its
 * socket at once, but the struct is freed only before the next
 * poll (ev_prepare), so code that still holds the pointer in the current
 * callback may test c->dead. Jobs name the connection by id: a completion
 * whose connection is gone finds nothing and drops its result.
 *
 * Loops (server.h, loops.c): a connection belongs to one loop (c->loop),
 * whose thread alone runs its watchers, reads and writes it, closes its
 * socket and frees it. With several loops, every function here may be
 * called from any loop thread holding the write side of the server lock:
 * what needs the connection's own thread (a write, a watcher, the close
 * of the socket) is left on its loop's `todo` list and done there before
 * the next poll (st__conn_service); a write queued by the connection's
 * own thread goes out after the message being handled. The connection's
 * own thread reads it, decodes its messages, answers the cache hits of
 * fastcall.c and writes plain replies under the read side (it alone
 * touches the connection then: others need the write side), and takes
 * the write side (st__loop_exclusive) before anything else. The thread
 * lets go of the lock only around its recvmsg and sendmsg, so the state
 * above stays consistent; what another thread did meanwhile (a close, a
 * reply queued) is looked at when it has the lock again.
 */
#ifndef ST_SERVER_CONN_H
#define ST_SERVER_CONN_H

#include <ev.h>
#include <stdint.h>
#include <sys/socket.h>

#include "engine/argcache.h"
#include "server/kept.h"
#include "proto/proto.h"
#include "st/wire.h"
#include "server/server.h"

/* Received descriptors a connection may hold before its requests claim
 * them. Those of one request at most, while the server reads; two while
 * it does not (back-pressure), when a request already read may still
 * wait for its turn beside the next one's. */
#define ST_CONN_MAX_PENDING_FDS (2 * ST_MAX_FDS_PER_MESSAGE)

typedef struct st__wframe {
  struct st__wframe *next;
  char *data;                 /* owned msgpack bytes                        */
  size_t len, off;            /* off: bytes already sent                    */
  int held_fds;               /* descriptors it carries (counted in out_fds) */
  uint64_t pinned;            /* arena bytes they pin (counted in out_bytes) */
  int nfds;                   /* descriptors still ours (sent with byte 0)  */
  int fds[];
} st__wframe_t;

struct st__conn {
  st__server_t *srv;
  st__loop_t *loop;           /* the loop whose thread does its I/O        */
  uint64_t id;
  int fd;
  int device;                 /* socket index it came in on                 */
  struct ucred cred;
  st__reader_t reader;
  ev_io rio, wio;
  ev_timer frame_timer;       /* runs while a frame is half-received        */
  ev_idle resume;             /* handles messages buffered while paused     */
  ev_check decode_step;       /* a large message decoded a slice per loop
                                 turn (conn.c, "Large messages")           */
  ev_idle decode_idle;        /* keeps the loop turning meanwhile           */
  int slicing;                /* such a message is being decoded: not
                                 reading                                   */
  st__wframe_t *wq_head, *wq_tail;
  size_t wq_bytes;
  /* Replies with descriptors count from queued until the client has read
   * them (SIOCOUTQ is 0): sent descriptors in a socket's queue are held
   * for us by the kernel and keep their arenas alive. */
  int out_fds;                /* descriptors of those replies               */
  uint64_t out_bytes;         /* arena bytes they pin                       */
  int unread_fds;             /* the part already sent, not yet read        */
  uint64_t unread_bytes;
  ev_timer unread_check;      /* polls SIOCOUTQ while unread_fds/bytes > 0:
                                 first after 100 us, each next poll twice
                                 as late, 100 ms at most (conn.c) */
  int inflight;               /* requests waiting for a reply (calls)       */
  int closing;                /* close once the write queue is flushed      */
  int eof;                    /* peer finished sending: close when idle     */
  int read_paused;            /* write queue too long: not reading          */
  int end_input;              /* st__conn_stop_reading, for its loop thread */
  int dead;                   /* closed; struct freed before the next poll  */
  double opened_at;           /* monotonic                                  */
  uint64_t requests;
  st__open_reqs_t open;       /* requests owed an answer (stats.c)          */
  uint64_t leases;            /* leases it holds on objects                 */
  char client[64];            /* from hello, for logs                       */
  int rx_fds[ST_CONN_MAX_PENDING_FDS]; /* received, unclaimed, arrival order;
                                 -1: closed on arrival at a limit */
  uint64_t rx_fd_start[ST_CONN_MAX_PENDING_FDS]; /* stream offsets where the */
  uint64_t rx_fd_end[ST_CONN_MAX_PENDING_FDS];   /* read that brought each one
                                 began and ended */
  size_t rx_nfds;
  int rx_held;                /* entries of rx_fds that are open            */
  uint64_t rx_bytes;          /* bytes received (committed to the reader)   */
  struct st__targs *targs;    /* during st__dispatch: the tensor arguments of
                                 the request (call/submit move them out)   */
  st__argcache_t argcache;    /* tensor arguments kept by arg_id
                                 (argcache.c); each entry holds one
                                 descriptor, counted like rx_held          */
  struct st__mpool *pool;     /* result pool (hello feature "pool"), or NULL;
                                 one reference (server/pool_conn.c)        */
  st__keptset_t kept_arenas;     /* arenas sent once (kept.h)                 */
  st__keptset_t kept_objects;    /* objects sent once (kept.h)                */
  int arg_results;               /* the hello asked for "arg_results": a call's
                                    result arena that is one of its tensor
                                    arguments goes as {arg: i} (reply.c)     */
  st__conn_t *hnext;          /* id hash chain                              */
  st__conn_t *onext, *oprev;  /* every open connection, oldest first
                                 (srv->conns; info's holdings walk it)     */
  st__conn_t *dnext;          /* its loop's dead list                       */
  st__conn_t *tnext;          /* its loop's todo list                       */
  int on_todo;                /* on that list                               */
  int armed;                  /* its loop started reading it                */
  int io_closed;              /* socket closed, queue and reader freed      */
};

/* Adopts an accepted, admitted socket (non-blocking, close-on-exec) and
 * starts reading. Takes ownership of fd (closed on failure). Loop thread. */
void st__conn_open(st__server_t *srv, int fd, int device, const struct ucred *cred);

/* Connection by id, or NULL when it is gone. Borrowed. */
st__conn_t *st__conn_find(st__server_t *srv, uint64_t id);

/* Queues the bytes of sb (taken; sb is left empty) as a frame without
 * descriptors, holding nothing and writing nothing: the caller writes the
 * queue (conn.c does after a message fastcall.c answered). ST_OK, or
 * OUT_OF_MEMORY with sb untouched. Either side of the server lock, on
 * c's own loop's thread (fastcall.c). */
int st__conn_queue(st__conn_t *c, msgpack_sbuffer *sb);

/* Queues a frame: takes the bytes of `sb` (left empty) and the `nfds`
 * descriptors (ownership moves to the connection, closed even on failure)
 * and starts writing at once. Does nothing but close the fds on a dead
 * connection. May close the connection on a write error: test c->dead
 * afterwards. Loop thread. */
void st__conn_send(st__conn_t *c, msgpack_sbuffer *sb, const int *fds, int nfds);

/* st__conn_send for a reply whose descriptors pin `pinned` bytes of
 * arenas: the descriptors and bytes count against the connection's and
 * the server's limits until the client has read the reply (or the
 * connection closed). Check st__conn_reply_room first. Loop thread. */
void st__conn_send_pinned(st__conn_t *c, msgpack_sbuffer *sb, const int *fds, int nfds,
                          uint64_t pinned);

/* Whether a reply with `nfds` descriptors pinning `bytes` of arenas fits
 * the limits (config.h): the connection's (max_fds_per_connection,
 * max_queued_bytes_per_connection: a connection that holds nothing may
 * always take one reply) and all connections' together
 * (max_fds_all_connections, max_queued_bytes_all_connections). ST_OK, or
 * ST_ERR_LIMIT with a message naming the limit, its value and its key.
 * Loop thread. */
int st__conn_reply_room(st__conn_t *c, int nfds, uint64_t bytes, char *err, size_t errlen);

/* Queues an error response [1, id, {code, name, message}, nil] that
 * answers request `id` (counted as a failed request: stats.c). Loop
 * thread. */
void st__conn_send_error(st__conn_t *c, uint32_t id, int err, const char *message);

/* The same frame for what answers no request: the connection is at fault
 * (bad bytes, a response message, a half-sent frame) and is closed after
 * it. Counted by the caller's own counter (protocol_errors, timeouts).
 * Loop thread. */
void st__conn_send_fault(st__conn_t *c, uint32_t id, int err, const char *message);

/* A reply for one in-flight request was queued: drops the in-flight count
 * and closes a connection whose peer already finished sending once nothing
 * is left to send. Loop thread. */
void st__conn_request_done(st__conn_t *c);

/* Stops reading c as if its client had finished sending (a takeover,
 * takeover.c): whole requests already read are answered, a half-sent one
 * is dropped, and c closes once every reply is out and read, so its
 * client sees the end of the connection and knows that what was not
 * answered never ran. Loop thread, the write side of the server lock (a
 * connection of another loop is stopped by its own thread before its
 * next poll). */
void st__conn_stop_reading(st__conn_t *c);

/* Stops reading and closes once the write queue is flushed. */
void st__conn_close_after_flush(st__conn_t *c, const char *why);

/* Frees the connections of every loop closed since the last call (the
 * loops' threads have stopped). Loop thread, at exit. */
void st__conn_reap(st__server_t *srv);

/* Before lp's poll, on lp's thread: does what its `todo` connections
 * wait for (start reading a new one, write queued replies, stop reading
 * one that closes, close the socket of a closed one), then frees the
 * connections closed since the last call. */
void st__conn_service(st__loop_t *lp);

/* Closes every connection, trying one last non-blocking flush of each. */
void st__conn_close_all(st__server_t *srv);

/* ------------------------------------------------------------- holdings.c */

/* A reply's descriptors and arena bytes start (hold) or stop (unhold)
 * counting for c and for the server. Loop thread. */
void st__conn_hold(st__conn_t *c, int fds, uint64_t bytes);
void st__conn_unhold(st__conn_t *c, int fds, uint64_t bytes);

/* Sent replies stop counting once the client has read everything sent
 * (SIOCOUTQ is 0; the poll timer stops). Returns 1 when they did, 0 when
 * nothing changed. Loop thread. */
int st__conn_unread_check(st__conn_t *c);

/* Queues the descriptors a client attached to the read of stream bytes
 * [start, end) (see the top of this file); a batch past a descriptor
 * limit is closed and queued as -1s. 0, or -1 when they do not fit the
 * queue or the kernel cut them (all closed: close the connection). */
int st__conn_rx_queue(st__conn_t *c, struct msghdr *mh, uint64_t start, uint64_t end);

/* Closes the queued descriptors no request can claim: those of reads that
 * ended at or before `next` (where the first message not yet handled
 * begins), and with `only_next` (that message is a half-sent frame or
 * none) those of reads that began after it. */
void st__conn_rx_drop_stray(st__conn_t *c, uint64_t next, int only_next);

/* No request of c will claim a descriptor any more (it closes, or its
 * input ended): every one it sent is closed. */
void st__conn_rx_close_all(st__conn_t *c);

/* Moves the first n received descriptors to out[] (the caller owns them;
 * an entry is -1 for a descriptor closed on arrival because a descriptor
 * limit was reached). Returns 0, or -1 when fewer than n are queued
 * (nothing moved). */
int st__conn_take_fds(st__conn_t *c, int *out, size_t n);

/* ----------------------------------------------------------- argcache.c */

/* The connection's argument cache of tensor arguments (docs/pool.md,
 * section 4): entries count as held descriptors of the connection and of
 * the server (max_fds_per_connection, max_fds_all_connections) and are
 * at most limits.max_cached_arguments. Loop thread. */

/* Keeps every allocation of the request's tensor arguments `t` that came
 * with a descriptor and an arg_id, evicting the least recently used
 * entries to stay within the limits; one that cannot fit is not kept
 * (the client resends it). */
struct st__targs;
void st__conn_argcache_keep(st__conn_t *c, const struct st__targs *t);

/* Drops the entries params.forget names (an array of arg ids; unknown ids
 * are ignored). ST_OK, or ST_ERR_INVALID_ARGUMENT with the reason in err
 * when forget is not an array of integers >= 1 (nothing dropped then). */
int st__conn_argcache_forget(st__conn_t *c, const msgpack_object *params, char *err,
                          size_t errlen);

/* Drops the least recently used entry. Returns 1 when there was one. */
int st__conn_argcache_evict_one(st__conn_t *c);

/* Drops every entry (the connection closes). */
void st__conn_argcache_drop_all(st__conn_t *c);

#endif

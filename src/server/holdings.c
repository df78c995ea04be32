/* src/server: what a connection holds (conn.h, "Holdings"): the
 * descriptors and arena bytes of its replies until the client has read
 * them, the descriptors it sent that no request claimed yet, and the
 * limits on both (config.h: max_fds_per_connection ...); and the registry
 * of every kind of holding (holdings.h): the walk at a connection's close
 * and info's per-connection view. Loop threads, the server lock held
 * (conn.h, "Loops").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "common/log.h"
#include "common/clock.h"
#include "server/conn.h"
#include "server/holdings.h"
#include "server/loopprof.h"
#include "st/errors.h"

/* At most one warning per this many seconds about a limit being hit. */
#define LIMIT_WARN_EVERY_S 10.0

/* See conn.h. Loop thread. */
void st__conn_hold(st__conn_t *c, int fds, uint64_t bytes) {
  c->out_fds += fds;
  c->out_bytes += bytes;
  c->srv->held_fds += (uint64_t)fds;
  c->srv->held_bytes += bytes;
}

/* See conn.h. Loop thread. */
void st__conn_unhold(st__conn_t *c, int fds, uint64_t bytes) {
  c->out_fds -= fds;
  c->out_bytes -= bytes;
  c->srv->held_fds -= (uint64_t)fds;
  c->srv->held_bytes -= bytes;
}

/* Nonzero at most once per LIMIT_WARN_EVERY_S: a client that keeps
 * hitting a limit gets its errors, the log one line now and then. */
static int limit_warn_due(void) {
  static double last = -1e9;
  double now = st__now_mono();
  if (now - last < LIMIT_WARN_EVERY_S) return 0;
  last = now;
  return 1;
}

/* Closes the received descriptors i..j-1 and removes them from the queue. */
static void rx_remove(st__conn_t *c, size_t i, size_t j) {
  if (i >= j) return;
  for (size_t k = i; k < j; k++) {
    if (c->rx_fds[k] < 0) continue;
    close(c->rx_fds[k]);
    c->rx_held--;
    c->srv->held_fds--;
  }
  size_t rest = c->rx_nfds - j;
  memmove(c->rx_fds + i, c->rx_fds + j, rest * sizeof *c->rx_fds);
  memmove(c->rx_fd_start + i, c->rx_fd_start + j, rest * sizeof *c->rx_fd_start);
  memmove(c->rx_fd_end + i, c->rx_fd_end + j, rest * sizeof *c->rx_fd_end);
  c->rx_nfds -= j - i;
}

/* See conn.h. Loop thread. */
void st__conn_rx_close_all(st__conn_t *c) {
  if (c->rx_nfds)
    ST_LOG_D("conn", "conn %llu: closed %zu descriptors no request can claim",
             (unsigned long long)c->id, c->rx_nfds);
  rx_remove(c, 0, c->rx_nfds);
}


/* See conn.h. Loop thread. */
int st__conn_unread_check(st__conn_t *c) {
  if (c->dead || (!c->unread_fds && !c->unread_bytes)) return 0;
  int queued = 0;
  st__prof_begin(ST_PROF_IOCTL);
  int rc = ioctl(c->fd, SIOCOUTQ, &queued);
  st__prof_end();
  if (rc != 0 || queued > 0) return 0;
  st__conn_unhold(c, c->unread_fds, c->unread_bytes);
  c->unread_fds = 0;
  c->unread_bytes = 0;
  /* Another loop's thread leaves the timer to c's own (on_unread_check). */
  if (st__loop_is_current(c->loop)) ev_timer_stop(c->loop->ev, &c->unread_check);
  return 1;
}

/* Whether c and the server may hold `fds` more descriptors now (`fds` 0:
 * no check): the message says which limit is reached otherwise. */
static int fds_fit_now(st__conn_t *c, int fds, char *err, size_t errlen) {
  const st__config_t *cfg = c->srv->cfg;
  int holds = (int)st__holdings_fds(c);
  if (fds > 0 && holds > 0 && holds + fds > cfg->max_fds_per_connection) {
    snprintf(err, errlen,
             "this connection holds %d descriptors (replies it has not read, descriptors "
             "no request claimed yet); %d more would pass limits.max_fds_per_connection = %d",
             holds, fds, cfg->max_fds_per_connection);
    return 0;
  }
  if (fds > 0 && c->srv->held_fds + (uint64_t)fds > (uint64_t)cfg->max_fds_all_connections) {
    snprintf(err, errlen,
             "connections hold %llu descriptors in all; %d more would pass "
             "limits.max_fds_all_connections = %d",
             (unsigned long long)c->srv->held_fds, fds, cfg->max_fds_all_connections);
    return 0;
  }
  return 1;
}

/* fds_fit_now, after dropping as many of c's cached tensor arguments
 * (least recently used first) as it takes: the cache yields to replies and
 * to the descriptors of requests. */
static int fds_fit(st__conn_t *c, int fds, char *err, size_t errlen) {
  for (;;) {
    int ok = fds_fit_now(c, fds, err, errlen);
    if (ok || !st__conn_argcache_evict_one(c)) return ok;
  }
}

/* See conn.h. Loop thread. */
int st__conn_reply_room(st__conn_t *c, int nfds, uint64_t bytes, char *err, size_t errlen) {
  const st__config_t *cfg = c->srv->cfg;
  st__conn_unread_check(c);
  int ok = fds_fit(c, nfds, err, errlen);
  if (ok && bytes > 0 && c->out_bytes > 0 &&
      c->out_bytes + bytes > cfg->max_queued_bytes_per_connection) {
    snprintf(err, errlen,
             "replies this connection has not read pin %llu bytes of arenas; %llu more would "
             "pass limits.max_queued_bytes_per_connection = %llu",
             (unsigned long long)c->out_bytes, (unsigned long long)bytes,
             (unsigned long long)cfg->max_queued_bytes_per_connection);
    ok = 0;
  }
  if (ok && bytes > 0 && c->srv->held_bytes + bytes > cfg->max_queued_bytes_all_connections) {
    snprintf(err, errlen,
             "replies not yet read pin %llu bytes of arenas in all; %llu more would pass "
             "limits.max_queued_bytes_all_connections = %llu",
             (unsigned long long)c->srv->held_bytes, (unsigned long long)bytes,
             (unsigned long long)cfg->max_queued_bytes_all_connections);
    ok = 0;
  }
  if (ok) return ST_OK;
  if (limit_warn_due())
    ST_LOG_W("conn", "conn %llu (pid %d): reply refused: %s", (unsigned long long)c->id,
             (int)c->cred.pid, err);
  return ST_ERR_LIMIT;
}


/* Queues the descriptors a client attached to the read of stream bytes
 * [start, end), for the requests that list them. When they would pass a
 * descriptor limit they are closed at once, and their places hold -1: the
 * request that lists them gets LIMIT (dispatch.c). Returns 0, or -1 when
 * they do not fit the queue (or the kernel cut the control data): every
 * one of them is closed then, and the caller closes the connection, whose
 * requests and descriptors no longer match. */
int st__conn_rx_queue(st__conn_t *c, struct msghdr *mh, uint64_t start, uint64_t end) {
  int overflow = (mh->msg_flags & MSG_CTRUNC) != 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char *p = CMSG_DATA(cm);
    if (c->rx_nfds + n > ST_CONN_MAX_PENDING_FDS) overflow = 1;
    char why[200];
    int refuse = !overflow && !fds_fit(c, (int)n, why, sizeof why);
    if (refuse && limit_warn_due())
      ST_LOG_W("conn", "conn %llu (pid %d): %zu descriptors closed on arrival: %s",
               (unsigned long long)c->id, (int)c->cred.pid, n, why);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, p + i * sizeof fd, sizeof fd);
      if (overflow || refuse) close(fd);
      if (overflow) continue;
      c->rx_fd_start[c->rx_nfds] = start;
      c->rx_fd_end[c->rx_nfds] = end;
      c->rx_fds[c->rx_nfds++] = refuse ? -1 : fd;
      if (refuse) continue;
      c->rx_held++;
      c->srv->held_fds++;
    }
    c->srv->counters.fds_received += n;
  }
  return overflow ? -1 : 0;
}

/* See conn.h. Loop thread. */
int st__conn_take_fds(st__conn_t *c, int *out, size_t n) {
  if (n > c->rx_nfds) return -1;
  for (size_t i = 0; i < n; i++) {
    out[i] = c->rx_fds[i];
    if (out[i] < 0) continue;
    c->rx_fds[i] = -1;   /* the caller's now: rx_remove skips it */
    c->rx_held--;
    c->srv->held_fds--;
  }
  rx_remove(c, 0, n);
  return 0;
}

/* Closes the queued descriptors no request can claim (see conn.h): a
 * request's descriptors come with the read that holds its first byte.
 * `next` is where the first message not yet handled begins: those of a
 * read whose bytes all lie before it were not taken by their request;
 * and when `only_next` says that message is the last one buffered (a
 * half-sent frame, or none), those of a read that began after it belong
 * to no message either. */
void st__conn_rx_drop_stray(st__conn_t *c, uint64_t next, int only_next) {
  size_t i = 0;
  while (i < c->rx_nfds && c->rx_fd_end[i] <= next) i++;
  size_t n = i;
  if (i) rx_remove(c, 0, i);
  if (only_next) {
    size_t j = 0;
    while (j < c->rx_nfds && c->rx_fd_start[j] <= next) j++;
    n += c->rx_nfds - j;
    rx_remove(c, j, c->rx_nfds);
  }
  if (n)
    ST_LOG_D("conn", "conn %llu: closed %zu descriptors no request listed",
             (unsigned long long)c->id, n);
}


/* ------------------------------------------------------------- registry */

static void replies_release(st__server_t *srv, st__conn_t *c) {
  (void)srv;
  /* Its queued replies will never be read: they stop counting now (their
   * frames go with the socket). */
  st__conn_unhold(c, c->out_fds, c->out_bytes);
  c->unread_fds = 0;
  c->unread_bytes = 0;
}

static void replies_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  (void)srv;
  n->fds = (uint64_t)c->out_fds;
  n->bytes = c->out_bytes;
}

/* Every reply's descriptors and bytes count in the server's held_fds and
 * held_bytes too, every received descriptor in held_fds. */
static int replies_none(st__server_t *srv) { return !srv->held_fds && !srv->held_bytes; }

static int received_none(st__server_t *srv) { return !srv->held_fds; }

const st__holding_kind_t st__holding_replies = {.name = "replies",
                                                .release = replies_release,
                                                .count = replies_count,
                                                .limits_fds = 1,
                                                .none = replies_none};

static void received_release(st__server_t *srv, st__conn_t *c) {
  (void)srv;
  st__conn_rx_close_all(c);
}

static void received_count(st__server_t *srv, const st__conn_t *c, st__holding_count_t *n) {
  (void)srv;
  n->fds = (uint64_t)c->rx_held;
}

const st__holding_kind_t st__holding_received = {.name = "received",
                                                 .release = received_release,
                                                 .count = received_count,
                                                 .limits_fds = 1,
                                                 .none = received_none};

/* See holdings.h. Loop thread, at start. */
int st__holdings_start(st__server_t *srv) {
  srv->holding_state = calloc(srv->nholding_kinds, sizeof *srv->holding_state);
  if (!srv->holding_state) return ST_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < srv->nholding_kinds; i++) {
    size_t bytes = srv->holding_kinds[i]->state_bytes;
    if (bytes && !(srv->holding_state[i] = calloc(1, bytes))) return ST_ERR_OUT_OF_MEMORY;
  }
  return ST_OK;
}

/* See holdings.h. Loop thread, at the end. */
void st__holdings_stop(st__server_t *srv) {
  free(srv->holding_rows);
  srv->holding_rows = NULL;
  srv->holding_rows_cap = 0;
  if (!srv->holding_state) return;
  for (size_t i = 0; i < srv->nholding_kinds; i++) {
    void *state = srv->holding_state[i];
    if (state && srv->holding_kinds[i]->stop) srv->holding_kinds[i]->stop(srv, state);
    free(state);
  }
  free(srv->holding_state);
  srv->holding_state = NULL;
}

/* See holdings.h. Loop threads. */
void *st__holdings_state(st__server_t *srv, int index) {
  if (!srv->holding_state || index < 0 || (size_t)index >= srv->nholding_kinds) return NULL;
  return srv->holding_state[index];
}

/* See holdings.h. Loop thread. */
void st__holdings_release(st__server_t *srv, st__conn_t *c) {
  for (size_t i = 0; i < srv->nholding_kinds; i++) srv->holding_kinds[i]->release(srv, c);
}

/* See holdings.h. Loop thread. */
uint64_t st__holdings_fds(const st__conn_t *c) {
  const st__server_t *srv = c->srv;
  uint64_t fds = 0;
  for (size_t i = 0; i < srv->nholding_kinds; i++) {
    const st__holding_kind_t *k = srv->holding_kinds[i];
    if (!k->limits_fds) continue;
    st__holding_count_t n = {0, 0, 0};
    k->count(c->srv, c, &n);
    fds += n.fds;
  }
  return fds;
}

/* A connection that holds something, and its count of every kind. */
struct st__holding_row {
  const st__conn_t *c;
  st__holding_count_t n[ST__HOLDING_NKINDS];
};

/* See holdings.h. The open connections are walked once (srv->conns, not
 * the id table's buckets); the rows of those that hold anything are kept
 * in srv->holding_rows (a row is reused by the next connection when its
 * own holds nothing), then packed. Loop thread. */
void st__holdings_pack(msgpack_packer *pk, st__server_t *srv) {
  size_t nk = srv->nholding_kinds, need = (size_t)srv->nconns;
  if (nk > ST__HOLDING_NKINDS) nk = ST__HOLDING_NKINDS;
  if (need > srv->holding_rows_cap) {
    struct st__holding_row *p = realloc(srv->holding_rows, need * sizeof *p);
    if (p) {
      srv->holding_rows = p;
      srv->holding_rows_cap = need;
    }
  }
  /* The kinds some connection may hold now; the others count 0 for all. */
  size_t live[ST__HOLDING_NKINDS], nlive = 0;
  unsigned char counted[ST__HOLDING_NKINDS];
  for (size_t i = 0; i < nk; i++) {
    counted[i] = !srv->holding_kinds[i]->none || !srv->holding_kinds[i]->none(srv);
    if (counted[i]) live[nlive++] = i;
  }
  /* Out of memory: only the connections the rows have room for. */
  size_t cap = srv->holding_rows ? srv->holding_rows_cap : 0, nrows = 0;
  for (const st__conn_t *c = srv->conns; c && nrows < cap && nlive; c = c->onext) {
    struct st__holding_row *row = &srv->holding_rows[nrows];
    uint64_t any = 0;
    for (size_t k = 0; k < nlive; k++) {
      st__holding_count_t *n = &row->n[live[k]];
      n->items = n->fds = n->bytes = 0;
      srv->holding_kinds[live[k]]->count(srv, c, n);
      any |= n->items | n->fds | n->bytes;
    }
    if (!any) continue;
    for (size_t i = 0; i < nk; i++)
      if (!counted[i]) row->n[i].items = row->n[i].fds = row->n[i].bytes = 0;
    row->c = c;
    nrows++;
  }
  msgpack_pack_array(pk, nrows);
  for (size_t k = 0; k < nrows; k++) {
    const struct st__holding_row *row = &srv->holding_rows[k];
    size_t held = 0;
    for (size_t i = 0; i < nk; i++)
      held += (row->n[i].items | row->n[i].fds | row->n[i].bytes) != 0;
    msgpack_pack_map(pk, 3 + held);
    st__pack_kv_uint(pk, "conn", row->c->id);
    st__pack_kv_int(pk, "pid", (int64_t)row->c->cred.pid);
    st__pack_kv_str(pk, "client", row->c->client);
    for (size_t i = 0; i < nk; i++) {
      const st__holding_count_t *n = &row->n[i];
      if (!(n->items | n->fds | n->bytes)) continue;
      st__pack_cstr(pk, srv->holding_kinds[i]->name);
      msgpack_pack_map(pk, 3);
      st__pack_kv_uint(pk, "items", n->items);
      st__pack_kv_uint(pk, "fds", n->fds);
      st__pack_kv_uint(pk, "bytes", n->bytes);
    }
  }
}

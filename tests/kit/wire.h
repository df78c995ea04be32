/* Raw-socket helpers for tests that speak msgpack-RPC to a real stserver:
 * frames from text (stt_pack, mpbuf.h), a reader for a stream that may
 * carry several messages and descriptors, the fields of replies, and the
 * checks of a reply's outcome:
 *
 *   OPEN_RC(c, S.socket);            // rc_t c, connected, or the test fails
 *   CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, "loud", "[0, 1, 'ping', [{loud: true}]]");
 *   msg_t m;
 *   CHECK(rc_rpcf(&c, &m, "[0, 2, 'info', []]") == 1);
 *   CHECK_REPLY(&m, ST_OK, NULL);
 *   msg_free(&m);
 *   rc_close(&c);
 *
 * Header-only (static functions), like the tests that include it.
 */
#ifndef STT_WIRE_H
#define STT_WIRE_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <linux/sockios.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "mpbuf.h"
#include "proc.h"
#include "proto/proto.h"
#include "st/errors.h"
#include "st/wire.h"

/* ------------------------------------------------------------- stream */

#define RC_MAXFDS 256

typedef struct rc {
  int fd;
  msgpack_unpacker up;
  int fds[RC_MAXFDS];     /* received, not yet taken, in arrival order */
  int nfds;
  int eof;
} rc_t;

typedef struct msg {
  msgpack_unpacked u;
  int type;
  uint32_t id;
  const msgpack_object *error;   /* NULL on success */
  const msgpack_object *result;
} msg_t;

static inline int rc_adopt(rc_t *c, int fd) {
  memset(c, 0, sizeof *c);
  c->fd = fd;
  if (fd < 0) return -1;
  msgpack_unpacker_init(&c->up, 1 << 16);
  return 0;
}

static inline int rc_open(rc_t *c, const char *path) {
  return rc_adopt(c, stt_connect(path));
}

/* A memfd of `bytes` whose first float64 is `value`, to pass as an
 * argument's arena; sealed against shrinking and growing unless
 * `unsealed`. The descriptor (the caller closes it), or -1. */
static inline int rc_memfd_with(size_t bytes, double value, int unsealed) {
  int fd = memfd_create("rc-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)bytes) != 0 || pwrite(fd, &value, sizeof value, 0) != sizeof value ||
      (!unsealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* rc_open for a test's main: exits with status 1 when it cannot
 * connect. */
static inline void rc_open_or_exit(rc_t *c, const char *path) {
  if (rc_open(c, path) == 0) return;
  fprintf(stderr, "connect failed\n");
  exit(1);
}

/* In a test: declares `rc_t c` connected to the socket at path, and fails
 * the test when it cannot connect. */
#define OPEN_RC(c, path)                                             \
  rc_t c;                                                            \
  CHECK(rc_open(&c, (path)) == 0)

/* Closes every descriptor received so far. */
static inline void rc_drop_fds(rc_t *c) {
  for (int i = 0; i < c->nfds; i++) close(c->fds[i]);
  c->nfds = 0;
}

static inline void rc_close(rc_t *c) {
  if (c->fd >= 0) {
    close(c->fd);
    msgpack_unpacker_destroy(&c->up);
  }
  rc_drop_fds(c);
  c->fd = -1;
}

static inline int rc_send(rc_t *c, const void *buf, size_t len) {
  return stt_send_all(c->fd, buf, len);
}

/* Sends the frames of the text fmt (stt_pack). 0 or -1. */
static inline int rc_sendf(rc_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int rc_sendf(rc_t *c, const char *fmt, ...) {
  mpbuf_t b;
  va_list ap;
  va_start(ap, fmt);
  mpbuf_vtext(&b, fmt, ap);
  va_end(ap);
  int rc = rc_send(c, b.sb.data, b.sb.size);
  mpbuf_free(&b);
  return rc;
}

/* Bytes this socket sent that the server has not read yet. */
static inline int rc_unread(rc_t *c) {
  int n = 0;
  if (ioctl(c->fd, SIOCOUTQ, &n) != 0) return -1;
  return n;
}

/* Waits (polling, with a deadline) until the server read everything sent. */
static inline int rc_wait_drained(rc_t *c, int timeout_ms) {
  double end = stt_now_ms() + timeout_ms;
  while (stt_now_ms() < end) {
    if (rc_unread(c) == 0) return 0;
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

static inline void msg_free(msg_t *m) {
  msgpack_unpacked_destroy(&m->u);
}

/* Next message already buffered (no I/O): 1, or 0 (m needs no free). */
static inline int rc_take(rc_t *c, msg_t *m) {
  msgpack_unpacked_init(&m->u);
  if (msgpack_unpacker_next(&c->up, &m->u) != MSGPACK_UNPACK_SUCCESS) {
    msg_free(m);
    return 0;
  }
  const msgpack_object *o = &m->u.data;
  m->type = -1;
  m->id = 0;
  m->error = m->result = NULL;
  if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4) {
    m->type = (int)o->via.array.ptr[0].via.u64;
    m->id = (uint32_t)o->via.array.ptr[1].via.u64;
    if (o->via.array.ptr[2].type != MSGPACK_OBJECT_NIL) m->error = &o->via.array.ptr[2];
    m->result = &o->via.array.ptr[3];
  }
  return 1;
}

/* Reads what arrives within `ms` into the stream, keeping descriptors.
 * 1 on bytes, 0 when nothing came, -1 on error (EOF sets c->eof). */
static inline int rc_read(rc_t *c, int ms) {
  struct pollfd p = {.fd = c->fd, .events = POLLIN};
  int pr = poll(&p, 1, ms);
  if (pr <= 0) return pr < 0 && errno != EINTR ? -1 : 0;
  msgpack_unpacker_reserve_buffer(&c->up, 1 << 16);
  char ctl[CMSG_SPACE(sizeof(int) * 253)];
  struct iovec iov = {.iov_base = msgpack_unpacker_buffer(&c->up),
                      .iov_len = msgpack_unpacker_buffer_capacity(&c->up)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                      .msg_controllen = sizeof ctl};
  ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
  if (n < 0 && errno == EINTR) return 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
      if (c->nfds < RC_MAXFDS) c->fds[c->nfds++] = fd;
      else close(fd);
    }
  }
  if (n == 0 || (n < 0 && errno == ECONNRESET)) {
    c->eof = 1;
    return 0;
  }
  if (n < 0) return -1;
  msgpack_unpacker_buffer_consumed(&c->up, (size_t)n);
  return 1;
}

/* Next whole message: 1, 0 at EOF, -1 on error or timeout. */
static inline int rc_next(rc_t *c, msg_t *m, int timeout_ms) {
  double end = stt_now_ms() + timeout_ms;
  for (;;) {
    if (rc_take(c, m)) return 1;
    if (c->eof) return 0;
    int left = (int)(end - stt_now_ms());
    if (left <= 0 || rc_read(c, left) < 0) return -1;
  }
}

/* Reads what is there now (non-blocking) into the stream. Returns bytes
 * read, 0 at EOF, -1 when nothing is there (or on error). */
static inline ssize_t rc_pump(rc_t *c) {
  msgpack_unpacker_reserve_buffer(&c->up, 1 << 16);
  ssize_t n = recv(c->fd, msgpack_unpacker_buffer(&c->up),
                   msgpack_unpacker_buffer_capacity(&c->up), MSG_DONTWAIT);
  if (n > 0) msgpack_unpacker_buffer_consumed(&c->up, (size_t)n);
  if (n == 0) c->eof = 1;
  return n;
}

/* Sends a built frame with nfds descriptors (closed here: the kernel took
 * its own references), frees it and reads the next message. 1 on one. */
static inline int rc_rpc_fds(rc_t *c, mpbuf_t *b, const int *fds, int nfds, msg_t *m) {
  int rc = stt_send_fds(c->fd, b->sb.data, b->sb.size, fds, nfds);
  mpbuf_free(b);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  if (rc != 0) return -1;
  return rc_next(c, m, 10000);
}

static inline int rc_vrpcf(rc_t *c, msg_t *m, const int *fds, int nfds, const char *fmt,
                           va_list ap) {
  mpbuf_t b;
  mpbuf_vtext(&b, fmt, ap);
  return rc_rpc_fds(c, &b, fds, nfds, m);
}

/* Sends the frame of the text fmt and reads the next message into *m
 * (the caller frees it). 1 on a message. */
static inline int rc_rpcf(rc_t *c, msg_t *m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int rc_rpcf(rc_t *c, msg_t *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = rc_vrpcf(c, m, NULL, 0, fmt, ap);
  va_end(ap);
  return rc;
}

/* The same with descriptors riding on the frame (closed here). */
static inline int rc_rpcf_fds(rc_t *c, msg_t *m, const int *fds, int nfds, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static inline int rc_rpcf_fds(rc_t *c, msg_t *m, const int *fds, int nfds, const char *fmt,
                              ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = rc_vrpcf(c, m, fds, nfds, fmt, ap);
  va_end(ap);
  return rc;
}

/* ------------------------------------------------------------- objects */

static inline const msgpack_object *obj_get(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
  size_t n = strlen(key);
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
        memcmp(k->via.str.ptr, key, n) == 0)
      return &map->via.map.ptr[i].val;
  }
  return NULL;
}

/* Dotted path "counters.requests". */
static inline const msgpack_object *obj_path(const msgpack_object *map, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  const msgpack_object *o = map;
  for (char *save = NULL, *part = strtok_r(buf, ".", &save); part && o;
       part = strtok_r(NULL, ".", &save))
    o = obj_get(o, part);
  return o;
}

static inline int64_t obj_int(const msgpack_object *o) {
  if (!o) return INT64_MIN;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (int64_t)o->via.u64;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return o->via.i64;
  if (o->type == MSGPACK_OBJECT_BOOLEAN) return o->via.boolean;
  return INT64_MIN;
}

/* A float or an integer as a double, -1e300 when absent or another kind. */
static inline double obj_num(const msgpack_object *o) {
  if (!o) return -1e300;
  if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) return o->via.f64;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (double)o->via.u64;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (double)o->via.i64;
  return -1e300;
}

/* A STR copied into a static buffer ("" when absent). */
static inline const char *obj_str(const msgpack_object *o) {
  static char buf[8][4096];
  static int next;
  char *b = buf[next++ & 7];
  b[0] = '\0';
  if (o && o->type == MSGPACK_OBJECT_STR) {
    size_t n = o->via.str.size < 4095 ? o->via.str.size : 4095;
    memcpy(b, o->via.str.ptr, n);
    b[n] = '\0';
  }
  return b;
}

/* Error code of a response (0 on success). */
static inline int msg_code(const msg_t *m) {
  return m->error ? (int)obj_int(obj_get(m->error, "code")) : 0;
}

static inline const char *msg_errname(const msg_t *m) {
  return m->error ? obj_str(obj_get(m->error, "name")) : "";
}

static inline const char *msg_errmsg(const msg_t *m) {
  return m->error ? obj_str(obj_get(m->error, "message")) : "";
}

/* ------------------------------------------------------------- outcomes */

/* Whether reply m is `want`: ST_OK (no error), or that error (its code
 * and its name, a nil result) with a message containing `part` (NULL:
 * any). When it is not, why[] says what came instead. */
static inline int reply_is(const msg_t *m, int want, const char *part, char *why, size_t len) {
  int code = -msg_code(m);
  const char *msg = msg_errmsg(m);
  if (want == ST_OK ? !m->error
                    : code == want && strcmp(msg_errname(m), st_err_name(want)) == 0 &&
                          (!part || strstr(msg, part)) && m->result &&
                          m->result->type == MSGPACK_OBJECT_NIL)
    return 1;
  char got[4200] = "ST_OK (0)";
  if (m->error) snprintf(got, sizeof got, "ST_ERR_%s (%d) \"%s\"", msg_errname(m), code, msg);
  snprintf(why, len, "reply %u = %s, want %s (%d)%s%s%s", (unsigned)m->id, got,
           stt_err_label(want), want, part ? " containing \"" : "", part ? part : "",
           part ? "\"" : "");
  return 0;
}

/* Fails the test with why[] when `call`, which fills stt_why_, is 0. */
#define CHECK_WHY(call)                                              \
  do {                                                               \
    char stt_why_[6000];                                             \
    if (!(call)) STT_FAIL("%s", stt_why_);                           \
  } while (0)

#define CHECK_REPLY(m, want, part) \
  CHECK_WHY(reply_is((m), (want), (part), stt_why_, sizeof stt_why_))

/* Sends the frame of the text fmt with nfds descriptors (closed here),
 * reads the reply and checks that it answers the request's id with `want`
 * (as reply_is); the reply is freed. 1 when it does, else 0 with why[]
 * naming the request. */
static inline int rc_vexpect(rc_t *c, const int *fds, int nfds, int want, const char *part,
                             char *why, size_t len, const char *fmt, va_list ap) {
  char text[2048];
  vsnprintf(text, sizeof text, fmt, ap);
  mpbuf_t b;
  mpbuf_init(&b);
  stt_pack(&b.pk, "%s", text);
  const msgpack_object *rq = mpbuf_obj(&b);
  uint32_t id = rq && rq->type == MSGPACK_OBJECT_ARRAY && rq->via.array.size > 1
                    ? (uint32_t)rq->via.array.ptr[1].via.u64 : 0;
  msg_t m;
  if (rc_rpc_fds(c, &b, fds, nfds, &m) != 1) {
    snprintf(why, len, "no reply to %s", text);
    return 0;
  }
  int ok = reply_is(&m, want, part, why, len);
  if (ok && m.id != id) snprintf(why, len, "reply %u answers request %u", m.id, id);
  ok = ok && m.id == id;
  msg_free(&m);
  if (!ok) {
    size_t used = strlen(why);
    snprintf(why + used, len - used, "; the request: %s", text);
  }
  return ok;
}

static inline int rc_expect(rc_t *c, int want, const char *part, char *why, size_t len,
                            const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static inline int rc_expect(rc_t *c, int want, const char *part, char *why, size_t len,
                            const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int ok = rc_vexpect(c, NULL, 0, want, part, why, len, fmt, ap);
  va_end(ap);
  return ok;
}

static inline int rc_expect_fds(rc_t *c, const int *fds, int nfds, int want, const char *part,
                                char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
static inline int rc_expect_fds(rc_t *c, const int *fds, int nfds, int want, const char *part,
                                char *why, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int ok = rc_vexpect(c, fds, nfds, want, part, why, len, fmt, ap);
  va_end(ap);
  return ok;
}

/* CHECK of rc_expect: CHECK_RPC(&c, ST_ERR_X, "part", "[0, 1, ...]", ...). */
#define CHECK_RPC(c, want, part, ...) \
  CHECK_WHY(rc_expect((c), (want), (part), stt_why_, sizeof stt_why_, __VA_ARGS__))

/* The same with descriptors riding on the frame (closed here). */
#define CHECK_RPC_FDS(c, fds, nfds, want, part, ...) \
  CHECK_WHY(rc_expect_fds((c), (fds), (nfds), (want), (part), stt_why_, sizeof stt_why_, \
                          __VA_ARGS__))

/* A row of a table of requests and what each must get. */
typedef struct frame_case {
  const char *frame;  /* stt_pack text */
  int want;           /* ST_OK or ST_ERR_* */
  const char *part;   /* a part of the error message, or NULL */
} frame_case_t;

/* CHECK_RPC for every row of a table (n rows). */
#define CHECK_RPC_TABLE(c, table, n)                                 \
  do {                                                               \
    for (size_t stt_i_ = 0; stt_i_ < (n); stt_i_++)                  \
      CHECK_RPC((c), (table)[stt_i_].want, (table)[stt_i_].part, "%s", (table)[stt_i_].frame); \
  } while (0)

/* What a server answers to a stream it gives up on: one error reply for
 * no request (id 0) of `want`, message containing `part`, then EOF. 1
 * when so, else 0 with why[]. */
static inline int rc_expect_close(rc_t *c, int want, const char *part, char *why, size_t len) {
  msg_t m;
  if (rc_next(c, &m, 5000) != 1) {
    snprintf(why, len, "no error reply before the connection ended");
    return 0;
  }
  int ok = reply_is(&m, want, part, why, len);
  if (ok && (m.type != ST_MSG_RESPONSE || m.id != 0))
    snprintf(why, len, "a message of type %d for request %u, not a response for none",
             m.type, (unsigned)m.id);
  ok = ok && m.type == ST_MSG_RESPONSE && m.id == 0;
  msg_free(&m);
  if (ok && rc_next(c, &m, 5000) != 0) {
    snprintf(why, len, "the connection stays open after the error");
    ok = 0;
  }
  return ok;
}

#define CHECK_CLOSED_WITH(c, want, part) \
  CHECK_WHY(rc_expect_close((c), (want), (part), stt_why_, sizeof stt_why_))

/* ------------------------------------------------------------- info */

/* info of the server as a fresh message (caller frees); 1 on success. */
static inline int rc_info(rc_t *c, uint32_t id, msg_t *m) {
  int rc = rc_rpcf(c, m, "[0, %u, 'info', []]", id);
  if (rc == 1 && m->error) {
    msg_free(m);
    return -1;
  }
  return rc;
}

/* One integer of info (dotted path), or INT64_MIN. */
static inline int64_t rc_info_int(rc_t *c, const char *path) {
  msg_t m;
  if (rc_info(c, 999999, &m) != 1) return INT64_MIN;
  int64_t v = obj_int(obj_path(m.result, path));
  msg_free(&m);
  return v;
}

/* Polls info until `path` equals `want` (deadline in ms). 0 or -1. */
static inline int rc_wait_info(rc_t *c, const char *path, int64_t want, int timeout_ms) {
  double end = stt_now_ms() + timeout_ms;
  while (stt_now_ms() < end) {
    if (rc_info_int(c, path) == want) return 0;
    stt_sleep_ms(5);
  }
  return -1;
}

/* Polls (5 s at most) until process pid holds at most (above = 0) or at
 * least (above = 1) n descriptors: a server closes them asynchronously,
 * after its reply. 0, or -1 (said on stderr). */
static inline int proc_fd_count_reaches(pid_t pid, int n, int above) {
  double end = stt_now_ms() + 5000;
  int now = stt_proc_fd_count(pid);
  while (!(above ? now >= n : now <= n) && stt_now_ms() < end) {
    stt_sleep_ms(1);
    now = stt_proc_fd_count(pid);
  }
  if (above ? now >= n : now <= n) return 0;
  fprintf(stderr, "   process %d holds %d descriptors, expected %s %d\n", (int)pid, now,
          above ? "at least" : "at most", n);
  return -1;
}

/* ------------------------------------------------------------- methods */

/* One request with an id-like parameter (task_id, object_id), reply in *m. */
static inline int rk_id(rc_t *c, const char *method, const char *param, uint64_t value,
                        msg_t *m) {
  return rc_rpcf(c, m, "[0, 77, '%s', [{%s: %llu}]]", method, param, (unsigned long long)value);
}

/* call ep with one integer argument (name NULL: no argument); reply in
 * *m, descriptors kept in c->fds. An error reply is printed. 1 on a reply. */
static inline int rc_call(rc_t *c, const char *ep, const char *arg, int64_t v, msg_t *m) {
  char args[128] = "{}";
  if (arg) snprintf(args, sizeof args, "{%s: %lld}", arg, (long long)v);
  int rc = rc_rpcf(c, m, "[0, 5, 'call', [{endpoint: '%s', args: %s}]]", ep, args);
  if (rc == 1 && m->error)
    fprintf(stderr, "   call %s: %s: %s\n", ep, msg_errname(m), msg_errmsg(m));
  return rc;
}

/* rc_call, the descriptors dropped. */
static inline int rk_call(rc_t *c, const char *ep, const char *arg, int64_t v, msg_t *m) {
  int rc = rc_call(c, ep, arg, v, m);
  rc_drop_fds(c);
  return rc;
}

/* call ep as request id with `extra` appended to its params map (",
 * key: value ...", or NULL): 0 with the reply in *m (the caller frees it)
 * and *fds the descriptors that came with it (kept in c->fds), or -1 on
 * no reply or an error reply (printed and freed). */
static inline int rc_call_extra(rc_t *c, uint32_t id, const char *ep, const char *extra, msg_t *m,
                                int *fds) {
  int before = c->nfds;
  if (rc_rpcf(c, m, "[0, %u, 'call', [{endpoint: '%s'%s}]]", id, ep, extra ? extra : "") != 1)
    return -1;
  if (m->error) {
    fprintf(stderr, "   call %s: %s: %s\n", ep, msg_errname(m), msg_errmsg(m));
    msg_free(m);
    return -1;
  }
  *fds = c->nfds - before;
  return 0;
}

/* Connects c to the socket at path and says hello with `features` (the
 * items of its features list as stt_pack text, e.g. "'object_refs'", or
 * "" for none). 0, or -1 when it cannot connect or the hello fails
 * (printed). */
static inline int rc_open_hello(rc_t *c, const char *path, const char *features) {
  if (rc_open(c, path) != 0) return -1;
  msg_t m;
  int rc = rc_rpcf(c, &m, "[0, 1, 'hello', [{protocol: 1, features: [%s]}]]", features);
  int ok = rc == 1 && !m.error;
  if (!ok && rc == 1) fprintf(stderr, "   hello: %s: %s\n", msg_errname(&m), msg_errmsg(&m));
  if (rc == 1) msg_free(&m);
  return ok ? 0 : -1;
}

/* result.object.<key> of a call reply, as an integer (INT64_MIN if none). */
static inline int64_t obj_field(const msg_t *m, const char *key) {
  return obj_int(obj_get(obj_get(m->result, "object"), key));
}

/* Arena id i of a call reply (INT64_MIN if none). */
static inline int64_t arena_id(const msg_t *m, uint32_t i) {
  const msgpack_object *a = obj_get(m->result, "arenas");
  if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size <= i) return INT64_MIN;
  return obj_int(obj_get(&a->via.array.ptr[i], "id"));
}

/* object_info(id).<key> as an integer; INT64_MIN when it fails (for
 * instance STALE_HANDLE). */
static inline int64_t info_field(rc_t *c, uint64_t oid, const char *key) {
  msg_t m;
  if (rk_id(c, "object_info", "object_id", oid, &m) != 1) return INT64_MIN;
  int64_t v = m.error ? INT64_MIN : obj_int(obj_get(m.result, key));
  msg_free(&m);
  return v;
}

/* submit ep with one number argument (name NULL: none; an integral v goes
 * as an integer): the task id, or 0. */
static inline uint64_t rk_submit(rc_t *c, const char *ep, const char *arg, double v) {
  char args[128] = "{}";
  if (arg && v == (double)(int64_t)v) snprintf(args, sizeof args, "{%s: %lld}", arg, (long long)v);
  else if (arg) snprintf(args, sizeof args, "{%s: %#.17g}", arg, v);
  msg_t m;
  if (rc_rpcf(c, &m, "[0, 6, 'submit', [{endpoint: '%s', args: %s}]]", ep, args) != 1) return 0;
  uint64_t id = 0;
  if (m.error) fprintf(stderr, "   submit %s: %s\n", ep, msg_errmsg(&m));
  else id = (uint64_t)obj_int(obj_get(m.result, "task_id"));
  msg_free(&m);
  return id;
}

/* status of a task ("" when the request fails). */
static inline const char *rk_status(rc_t *c, uint64_t task) {
  msg_t m;
  if (rk_id(c, "status", "task_id", task, &m) != 1) return "";
  const char *s = m.error ? "" : obj_str(obj_get(m.result, "status"));
  msg_free(&m);
  return s;
}

/* Polls status until it is `want` (deadline in ms). 0 or -1. */
static inline int rk_wait_status(rc_t *c, uint64_t task, const char *want, int timeout_ms) {
  double end = stt_now_ms() + timeout_ms;
  while (stt_now_ms() < end) {
    if (strcmp(rk_status(c, task), want) == 0) return 0;
    stt_sleep_ms(2);
  }
  fprintf(stderr, "   task %llu: still '%s', not '%s'\n", (unsigned long long)task,
          rk_status(c, task), want);
  return -1;
}

#endif

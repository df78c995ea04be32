/* Raw-socket helpers for the server's integration tests: build msgpack-RPC
 * frames by hand and read responses from a stream that may carry several
 * messages and descriptors. Header-only (static functions) so that each
 * test program stays one file. */
#ifndef STT_SERVER_RAW_H
#define STT_SERVER_RAW_H

#include <dirent.h>
#include <errno.h>
#include <msgpack.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <linux/sockios.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "proto/proto.h"

/* ------------------------------------------------------------- frames */

typedef struct rq {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} rq_t;

static inline void rq_init(rq_t *r) {
  msgpack_sbuffer_init(&r->sb);
  msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static inline void rq_free(rq_t *r) {
  msgpack_sbuffer_destroy(&r->sb);
}

static inline void pk_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

/* [0, id, method, ...]: the caller packs the params array next. */
static inline void rq_head(rq_t *r, uint32_t id, const char *method) {
  msgpack_pack_array(&r->pk, 4);
  msgpack_pack_int(&r->pk, 0);
  msgpack_pack_uint32(&r->pk, id);
  pk_str(&r->pk, method);
}

/* A request with no params: [0, id, method, []]. */
static inline void rq_simple(rq_t *r, uint32_t id, const char *method) {
  rq_head(r, id, method);
  msgpack_pack_array(&r->pk, 0);
}

/* Packs `n` named values from varargs: (const char *key, char type, value)
 * with type 'i' (int64_t), 'd' (double), 's' (const char *), 'b' (int),
 * 'n' (no value). */
static inline void pk_kv_va(msgpack_packer *pk, int n, va_list ap) {
  msgpack_pack_map(pk, (size_t)n);
  for (int i = 0; i < n; i++) {
    pk_str(pk, va_arg(ap, const char *));
    int t = va_arg(ap, int);
    switch (t) {
      case 'i': msgpack_pack_int64(pk, va_arg(ap, int64_t)); break;
      case 'd': msgpack_pack_double(pk, va_arg(ap, double)); break;
      case 's': pk_str(pk, va_arg(ap, const char *)); break;
      case 'b':
        if (va_arg(ap, int)) msgpack_pack_true(pk);
        else msgpack_pack_false(pk);
        break;
      default: msgpack_pack_nil(pk); break;
    }
  }
}

/* [0, id, "call", [{endpoint = name, args = {...n pairs...}}]] */
static inline void rq_call(rq_t *r, uint32_t id, const char *endpoint, int n, ...) {
  rq_head(r, id, "call");
  msgpack_pack_array(&r->pk, 1);
  msgpack_pack_map(&r->pk, 2);
  pk_str(&r->pk, "endpoint");
  pk_str(&r->pk, endpoint);
  pk_str(&r->pk, "args");
  va_list ap;
  va_start(ap, n);
  pk_kv_va(&r->pk, n, ap);
  va_end(ap);
}

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

static inline void rc_close(rc_t *c) {
  if (c->fd >= 0) {
    close(c->fd);
    msgpack_unpacker_destroy(&c->up);
  }
  for (int i = 0; i < c->nfds; i++) close(c->fds[i]);
  c->fd = -1;
  c->nfds = 0;
}

static inline int rc_send(rc_t *c, const void *buf, size_t len) {
  return stt_send_all(c->fd, buf, len);
}

static inline int rc_send_rq(rc_t *c, rq_t *r) {
  int rc = rc_send(c, r->sb.data, r->sb.size);
  rq_free(r);
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

/* Next whole message: 1, 0 at EOF, -1 on error or timeout. */
static inline int rc_next(rc_t *c, msg_t *m, int timeout_ms) {
  msgpack_unpacked_init(&m->u);
  double end = stt_now_ms() + timeout_ms;
  for (;;) {
    msgpack_unpack_return r = msgpack_unpacker_next(&c->up, &m->u);
    if (r == MSGPACK_UNPACK_SUCCESS) {
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
    if (r != MSGPACK_UNPACK_CONTINUE) {
      msg_free(m);
      return -1;
    }
    if (c->eof) {
      msg_free(m);
      return 0;
    }
    int left = (int)(end - stt_now_ms());
    if (left <= 0) {
      msg_free(m);
      return -1;
    }
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int pr = poll(&p, 1, left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    msgpack_unpacker_reserve_buffer(&c->up, 1 << 16);
    char ctl[CMSG_SPACE(sizeof(int) * 253)];
    struct iovec iov = {.iov_base = msgpack_unpacker_buffer(&c->up),
                        .iov_len = msgpack_unpacker_buffer_capacity(&c->up)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                        .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
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
    if (n == 0) {
      c->eof = 1;
      continue;
    }
    if (n < 0) {
      if (errno == ECONNRESET) {
        c->eof = 1;
        continue;
      }
      msg_free(m);
      return -1;
    }
    msgpack_unpacker_buffer_consumed(&c->up, (size_t)n);
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

/* Next message already buffered (no I/O): 1 or 0. */
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

/* Sends a whole request and reads the next message. 1 on success. */
static inline int rc_rpc(rc_t *c, rq_t *r, msg_t *m) {
  if (rc_send_rq(c, r) != 0) return -1;
  return rc_next(c, m, 10000);
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

/* info of the server as a fresh message (caller frees); 1 on success. */
static inline int rc_info(rc_t *c, uint32_t id, msg_t *m) {
  rq_t r;
  rq_init(&r);
  rq_simple(&r, id, "info");
  int rc = rc_rpc(c, &r, m);
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
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

/* Number of open descriptors of a process. */
static inline int proc_fd_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

#endif

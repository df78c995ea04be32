/* src/xfer/wire.c: records of the server-helper socket (see wire.h). */
#include "xfer/wire.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/proto.h"
#include "st/errors.h"

int st__xfer_send(int sock, const void *data, size_t len, const int *fds, size_t nfds,
                  int nonblock, char *err, size_t errlen) {
  if (len > ST_XFER_MSG_MAX || nfds > ST_XFER_FDS_PER_MSG) {
    snprintf(err, errlen, "a record of %zu bytes and %zu descriptors is over the limit", len,
             nfds);
    return ST_ERR_LIMIT;
  }
  struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
  union {
    char buf[CMSG_SPACE(sizeof(int) * ST_XFER_FDS_PER_MSG)];
    struct cmsghdr align;
  } ctl;
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | (nonblock ? MSG_DONTWAIT : 0));
    if (n >= 0) return ST_OK;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ST_ERR_BUSY;
    snprintf(err, errlen, "sendmsg: %s", strerror(errno));
    return ST_ERR_IO;
  }
}

long st__xfer_recv(int sock, void *buf, size_t cap, int *fds, size_t *nfds, char *err,
                   size_t errlen) {
  *nfds = 0;
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  union {
    char buf[CMSG_SPACE(sizeof(int) * ST_XFER_FDS_PER_MSG)];
    struct cmsghdr align;
  } ctl;
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl.buf;
  mh.msg_controllen = sizeof ctl.buf;
  ssize_t n;
  do {
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ST_ERR_BUSY;
    if (errno == ECONNRESET) return 0;
    snprintf(err, errlen, "recvmsg: %s", strerror(errno));
    return ST_ERR_IO;
  }
  size_t got = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (got < ST_XFER_FDS_PER_MSG)
        fds[got++] = fd;
      else
        close(fd);
    }
  }
  *nfds = got;
  if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || n == 0) {
    for (size_t i = 0; i < got; i++) close(fds[i]);
    *nfds = 0;
    if (n == 0 && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) return 0;
    snprintf(err, errlen, "a record %s did not fit (%zd bytes)",
             (mh.msg_flags & MSG_CTRUNC) ? "whose descriptors" : "", n);
    return ST_ERR_PROTOCOL;
  }
  return (long)n;
}

int st__xfer_parse(const void *data, size_t len, msgpack_unpacked *up, const char **method,
                   size_t *method_len, const msgpack_object **params, char *err,
                   size_t errlen) {
  size_t off = 0;
  if (msgpack_unpack_next(up, data, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
    snprintf(err, errlen, "a record is not one msgpack value");
    return ST_ERR_PROTOCOL;
  }
  const msgpack_object *o = &up->data;
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3 ||
      o->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
      o->via.array.ptr[0].via.u64 != 2 || o->via.array.ptr[1].type != MSGPACK_OBJECT_STR ||
      o->via.array.ptr[2].type != MSGPACK_OBJECT_ARRAY ||
      o->via.array.ptr[2].via.array.size != 1 ||
      o->via.array.ptr[2].via.array.ptr[0].type != MSGPACK_OBJECT_MAP) {
    snprintf(err, errlen, "a record is not [2, method, [map]]");
    return ST_ERR_PROTOCOL;
  }
  *method = o->via.array.ptr[1].via.str.ptr;
  *method_len = o->via.array.ptr[1].via.str.size;
  *params = &o->via.array.ptr[2].via.array.ptr[0];
  return ST_OK;
}

static const msgpack_object *get(const msgpack_object *map, const char *key) {
  const msgpack_object *v = st__map_get(map, key);
  return v && v->type != MSGPACK_OBJECT_NIL ? v : NULL;
}

int st__xfer_get_uint(const msgpack_object *map, const char *key, uint64_t *out, char *err,
                      size_t errlen) {
  const msgpack_object *v = get(map, key);
  if (!v) return ST_ERR_NOT_FOUND;
  if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
    snprintf(err, errlen, "'%s' must be an integer >= 0", key);
    return ST_ERR_PROTOCOL;
  }
  *out = v->via.u64;
  return ST_OK;
}

int st__xfer_get_bool(const msgpack_object *map, const char *key, int *out, char *err,
                      size_t errlen) {
  const msgpack_object *v = get(map, key);
  if (!v) return ST_ERR_NOT_FOUND;
  if (v->type != MSGPACK_OBJECT_BOOLEAN) {
    snprintf(err, errlen, "'%s' must be a boolean", key);
    return ST_ERR_PROTOCOL;
  }
  *out = v->via.boolean;
  return ST_OK;
}

int st__xfer_get_str(const msgpack_object *map, const char *key, const char **s, size_t *len,
                     char *err, size_t errlen) {
  const msgpack_object *v = get(map, key);
  if (!v) return ST_ERR_NOT_FOUND;
  if (v->type != MSGPACK_OBJECT_STR) {
    snprintf(err, errlen, "'%s' must be a string", key);
    return ST_ERR_PROTOCOL;
  }
  *s = v->via.str.ptr;
  *len = v->via.str.size;
  return ST_OK;
}

int st__xfer_get_bin(const msgpack_object *map, const char *key, const uint8_t **b,
                     size_t *len, char *err, size_t errlen) {
  const msgpack_object *v = get(map, key);
  if (!v) return ST_ERR_NOT_FOUND;
  if (v->type != MSGPACK_OBJECT_BIN) {
    snprintf(err, errlen, "'%s' must be bytes", key);
    return ST_ERR_PROTOCOL;
  }
  *b = (const uint8_t *)v->via.bin.ptr;
  *len = v->via.bin.size;
  return ST_OK;
}

int st__xfer_is(const char *method, size_t len, const char *name) {
  return strlen(name) == len && memcmp(method, name, len) == 0;
}

void st__xfer_pack_bin(msgpack_packer *pk, const void *b, size_t len) {
  msgpack_pack_bin(pk, len);
  msgpack_pack_bin_body(pk, b, len);
}

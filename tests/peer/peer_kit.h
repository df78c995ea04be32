/* What the peer tests share (tests/peer, and the client and CLI tests of
 * pulls through remote_kit.h): key files, the peer table of a test
 * server, its listen address and `peers` entries, waits on a link's
 * state, settled descriptor counts, info figures, sealed memfds of a byte
 * pattern, and pull tasks over the raw wire. Each function is static
 * inline: every test program includes it once. */
#ifndef ST_TESTS_PEER_KIT_H
#define ST_TESTS_PEER_KIT_H

#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wire.h"

/* A key file of 32 random bytes as hex, mode 0600, at dir/name. */
static inline void make_key(const char *dir, const char *name, char *path, size_t len) {
  snprintf(path, len, "%s/%s", dir, name);
  unsigned char b[32];
  FILE *r = fopen("/dev/urandom", "rb");
  if (!r || fread(b, 1, sizeof b, r) != sizeof b) abort();
  fclose(r);
  char hex[80];
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", b[i]);
  strcat(hex, "\n");
  stt_write_file(path, hex);
  chmod(path, 0600);
}

/* Sets s's peer table (replacing earlier extra config). */
static inline void peer_config(stt_server_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void peer_config(stt_server_t *s, const char *fmt, ...) {
  char text[3000];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  s->extra_config[0] = '\0';
  stt_server_config(s, text);
}

/* info.peer.listen of the server at socket path. */
static inline void listen_addr(const stt_server_t *s, char *out, size_t len) {
  rc_t c;
  msg_t m;
  out[0] = '\0';
  if (rc_open(&c, s->socket) != 0) return;
  if (rc_rpcf(&c, &m, "[0, 1, 'info', []]") == 1) {
    snprintf(out, len, "%s", obj_str(obj_path(m.result, "peer.listen")));
    msg_free(&m);
  }
  rc_close(&c);
}

/* The `peers` entry of peer `id` on server s: its state and last error.
 * 0, or -1 when it could not be read. */
static inline int peer_entry(const stt_server_t *s, const char *id, char *state, char *err, size_t len) {
  rc_t c;
  msg_t m;
  int rc = -1;
  state[0] = err[0] = '\0';
  if (rc_open(&c, s->socket) != 0) return -1;
  if (rc_rpcf(&c, &m, "[0, 1, 'peers', []]") == 1) {
    const msgpack_object *a = m.result;
    for (uint32_t i = 0; a && a->type == MSGPACK_OBJECT_ARRAY && i < a->via.array.size; i++) {
      const msgpack_object *e = &a->via.array.ptr[i];
      if (strcmp(obj_str(obj_get(e, "id")), id) != 0) continue;
      snprintf(state, len, "%s", obj_str(obj_get(e, "state")));
      snprintf(err, len, "%s", obj_str(obj_get(e, "last_error")));
      rc = 0;
    }
    msg_free(&m);
  }
  rc_close(&c);
  return rc;
}

/* Polls until peer `id` on s is in `state` (and, when `part` is set, its
 * last error contains it): 1, or 0 after 20 s (said). */
static inline int wait_peer(const stt_server_t *s, const char *id, const char *state, const char *part) {
  char st[4096], err[4096];
  double end = stt_now_ms() + 20000;
  while (stt_now_ms() < end) {
    if (peer_entry(s, id, st, err, sizeof st) == 0 && strcmp(st, state) == 0 &&
        (!part || strstr(err, part)))
      return 1;
    stt_sleep_ms(20);
  }
  fprintf(stderr, "peer %s on %s: state '%s', last_error '%s'; wanted %s%s%s\n", id, s->dir, st,
          err, state, part ? " with " : "", part ? part : "");
  return 0;
}

/* The descriptors of pid once their count stayed the same for 0.5 s
 * (closed links are freed by the channel's next tick). */
static inline int settled_fds(pid_t pid) {
  int last = -2, same = 0;
  double end = stt_now_ms() + 10000;
  while (same < 10 && stt_now_ms() < end) {
    int n = stt_proc_fd_count(pid);
    same = n == last ? same + 1 : 0;
    last = n;
    stt_sleep_ms(50);
  }
  return last;
}

static inline int serves(const stt_server_t *s) {
  int fd = stt_connect(s->socket);
  int ok = fd >= 0 && stt_ping(fd, 7) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

/* Starts a with `a_peers`, reads its port, starts b dialling it. */
static inline int start_pair(stt_server_t *a, stt_server_t *b, const char *key_a, const char *key_b,
                      const char *a_peers, const char *b_id) {
  peer_config(a, "peer = { id = 'a', listen = '127.0.0.1:0', secret = '%s', peers = { %s } },",
              key_a, a_peers);
  if (stt_server_start(a) != 0) return -1;
  char addr[128];
  listen_addr(a, addr, sizeof addr);
  if (!addr[0]) return -1;
  peer_config(b, "peer = { id = '%s', listen = '127.0.0.1:0', secret = '%s', "
              "peers = { a = '%s' } },", b_id, key_b, addr);
  return stt_server_start(b);
}

/* info's integer at `path` ("transfers.helper_pid") on s, or -1. */
static inline int64_t server_info_int(const stt_server_t *s, const char *path) {
  rc_t c;
  if (rc_open(&c, s->socket) != 0) return -1;
  int64_t v = rc_info_int(&c, path);
  rc_close(&c);
  return v;
}

/* Polls until info's `path` on s is `want`: 1, or 0 after 20 s (said). */
static inline int server_wait_info(const stt_server_t *s, const char *path, int64_t want) {
  double end = stt_now_ms() + 20000;
  int64_t v = -1;
  while (stt_now_ms() < end) {
    if ((v = server_info_int(s, path)) == want) return 1;
    stt_sleep_ms(20);
  }
  fprintf(stderr, "   %s on %s is %lld, wanted %lld\n", path, s->dir, (long long)v,
          (long long)want);
  return 0;
}

/* A memfd of `bytes` sealed against shrinking and growing whose byte i
 * is pattern(i, k); -1 when it could not be made. */
static inline int pattern_memfd(size_t bytes, int k, uint8_t (*pattern)(size_t i, int k)) {
  int fd = rc_memfd_with(bytes, 0, 1);
  if (fd < 0) return -1;
  uint8_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return -1;
  }
  for (size_t i = 0; i < bytes; i++) p[i] = pattern(i, k);
  munmap(p, bytes);
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Starts a pull over the raw connection c with the params map's inside
 * (e.g. "key: 'w', from: 'a'"): the task id, or 0 (said). */
static inline uint64_t pull_task(rc_t *c, const char *params) {
  msg_t m;
  uint64_t id = 0;
  if (rc_rpcf(c, &m, "[0, 1, 'pull', [{%s}]]", params) == 1 && !m.error)
    id = (uint64_t)obj_int(obj_get(m.result, "task_id"));
  if (!id)
    fprintf(stderr, "   pull {%s}: %s\n", params,
            m.error ? obj_str(obj_get(m.error, "message")) : "no task id in the reply");
  msg_free(&m);
  return id;
}

/* Waits (60 s at most) for task id to end: its status ("completed", ...)
 * and error message copied out ("" when none). */
static inline void wait_task(rc_t *c, uint64_t id, char *status, char *err, size_t len) {
  msg_t m;
  status[0] = err[0] = '\0';
  if (rc_rpcf(c, &m, "[0, 2, 'wait', [{task_id: %llu, timeout: 60}]]", (unsigned long long)id) ==
          1 &&
      !m.error) {
    snprintf(status, len, "%s", obj_str(obj_get(m.result, "status")));
    const msgpack_object *e = obj_get(m.result, "error");
    if (e && e->type == MSGPACK_OBJECT_MAP) snprintf(err, len, "%s", obj_str(obj_get(e, "message")));
  } else {
    fprintf(stderr, "   wait for task %llu: %s\n", (unsigned long long)id,
            m.error ? obj_str(obj_get(m.error, "message")) : "no reply");
  }
  msg_free(&m);
}

#endif

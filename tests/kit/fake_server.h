/* A scripted stand-in for stserver, for client tests that need replies the
 * real server never sends (refusals, malformed descriptors, the same arena
 * twice, a reply that stops half-way). It runs on a thread of the test
 * process, listens on a Unix socket in a temp dir and serves each
 * connection on a thread of its own:
 *   hello -> a version-1 hello reply (unless fs->on_accept / on_request
 *            says otherwise), ping -> "pong", echo -> its params map,
 *   anything else -> fs->on_request(fs, conn, id, method, params map).
 * Header-only: each test program includes it once.
 */
#ifndef STT_FAKE_SERVER_H
#define STT_FAKE_SERVER_H

#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "mpbuf.h"

typedef struct fake_server fake_server_t;
struct fake_server {
  char dir[64];
  char path[100];
  int listen_fd;
  int stop_pipe[2];
  pthread_t thread;
  /* Called on accept; return nonzero to close the connection at once. */
  int (*on_accept)(fake_server_t *fs, int conn);
  /* Called for methods other than hello/ping/echo (and for hello when
   * hello_custom is set); return nonzero to close the connection. */
  int (*on_request)(fake_server_t *fs, int conn, uint32_t id, const char *method,
                    const msgpack_object *params);
  int hello_custom;
  void *ud;
  int requests;      /* requests seen (any method) */
  pthread_mutex_t lock;
  pthread_cond_t idle;
  int active;        /* connection threads still running */
};

typedef struct fake_conn {
  fake_server_t *fs;
  int fd;
} fake_conn_t;

/* ------------------------------------------------------------- sending */

/* [1, id, nil, <result packed by the caller into `result`>] with fds. */
static inline int fake_reply(int conn, uint32_t id, const msgpack_sbuffer *result, const int *fds,
                             int nfds) {
  mpbuf_t b;
  mpbuf_init(&b);
  msgpack_pack_array(&b.pk, 4);
  stt_pack(&b.pk, "1, %u, nil", id);
  msgpack_sbuffer_write(&b.sb, result->data, result->size);
  int rc = stt_send_fds(conn, b.sb.data, b.sb.size, fds, nfds);
  mpbuf_free(&b);
  return rc;
}

/* A reply whose result is the text fmt (stt_pack), with fds (kept open). */
static inline int fake_replyf(int conn, uint32_t id, const int *fds, int nfds, const char *fmt,
                              ...) __attribute__((format(printf, 5, 6)));
static inline int fake_replyf(int conn, uint32_t id, const int *fds, int nfds, const char *fmt,
                              ...) {
  mpbuf_t b;
  va_list ap;
  va_start(ap, fmt);
  mpbuf_vtext(&b, fmt, ap);
  va_end(ap);
  int rc = fake_reply(conn, id, &b.sb, fds, nfds);
  mpbuf_free(&b);
  return rc;
}

/* [1, id, {code, name, message}, nil] (the message packed as it is: it
 * may hold quotes). */
static inline int fake_error(int conn, uint32_t id, int code, const char *name,
                             const char *message) {
  mpbuf_t b;
  mpbuf_init(&b);
  msgpack_pack_array(&b.pk, 4);
  stt_pack(&b.pk, "1, %u", id);
  msgpack_pack_map(&b.pk, 3);
  stt_pack(&b.pk, "'code', %d, 'name', '%s', 'message'", code, name);
  msgpack_pack_str_with_body(&b.pk, message, strlen(message));
  msgpack_pack_nil(&b.pk);
  int rc = stt_send_all(conn, b.sb.data, b.sb.size);
  mpbuf_free(&b);
  return rc;
}

/* The standard hello result with a given protocol number. */
static inline int fake_hello(int conn, uint32_t id, int protocol) {
  return fake_replyf(conn, id, NULL, 0,
                     "{protocol: %d, version: '0.0.0-fake', server_id: 'fake-%d', pid: %d, "
                     "device: 0, devices: [], limits: {}}",
                     protocol, (int)getpid(), (int)getpid());
}

/* ------------------------------------------------------------- payloads */

/* The string member `key` of a params map, copied into out ("" if absent). */
static inline void fake_param_str(const msgpack_object *map, const char *key, char *out,
                                  size_t len) {
  out[0] = '\0';
  if (!map || map->type != MSGPACK_OBJECT_MAP) return;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key, *v = &map->via.map.ptr[i].val;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
        memcmp(k->via.str.ptr, key, k->via.str.size) == 0 && v->type == MSGPACK_OBJECT_STR) {
      snprintf(out, len, "%.*s", (int)v->via.str.size, v->via.str.ptr);
      return;
    }
  }
}

/* A memfd of `bytes` holding `data` (may be NULL), sealed against
 * shrinking and growing when `seal`. Returns the fd. */
static inline int fake_memfd(size_t bytes, const void *data, size_t len, int seal) {
  int fd = memfd_create("fake-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) abort();
  if (ftruncate(fd, (off_t)bytes) != 0) abort();
  if (data && len && pwrite(fd, data, len, 0) != (ssize_t)len) abort();
  if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) abort();
  return fd;
}

/* ------------------------------------------------------------- serving */

static inline int fake_params_map(const msgpack_object *params, const msgpack_object **map) {
  *map = NULL;
  if (params->type != MSGPACK_OBJECT_ARRAY) return -1;
  if (params->via.array.size == 1) *map = &params->via.array.ptr[0];
  return 0;
}

/* Serves one connection until it closes or a handler asks to stop. */
static inline void fake_serve(fake_server_t *fs, int conn) {
  msgpack_unpacker up;
  msgpack_unpacker_init(&up, 4096);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  int done = 0;
  while (!done) {
    struct pollfd p[2] = {{.fd = conn, .events = POLLIN},
                          {.fd = fs->stop_pipe[0], .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) break;
    msgpack_unpacker_reserve_buffer(&up, 4096);
    ssize_t n = recv(conn, msgpack_unpacker_buffer(&up), msgpack_unpacker_buffer_capacity(&up), 0);
    if (n <= 0) break;
    msgpack_unpacker_buffer_consumed(&up, (size_t)n);
    while (!done && msgpack_unpacker_next(&up, &u) == MSGPACK_UNPACK_SUCCESS) {
      const msgpack_object *o = &u.data;
      if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4) continue;
      const msgpack_object *it = o->via.array.ptr;
      uint32_t id = (uint32_t)it[1].via.u64;
      char method[64];
      snprintf(method, sizeof method, "%.*s", (int)it[2].via.str.size, it[2].via.str.ptr);
      const msgpack_object *map;
      fake_params_map(&it[3], &map);
      fs->requests++;
      if (strcmp(method, "hello") == 0 && !fs->hello_custom) {
        done = fake_hello(conn, id, 1) != 0;
      } else if (strcmp(method, "ping") == 0) {
        done = fake_replyf(conn, id, NULL, 0, "'pong'") != 0;
      } else if (strcmp(method, "echo") == 0) {
        mpbuf_t b;
        mpbuf_init(&b);
        if (map) msgpack_pack_object(&b.pk, *map);
        else msgpack_pack_nil(&b.pk);
        done = fake_reply(conn, id, &b.sb, NULL, 0) != 0;
        mpbuf_free(&b);
      } else if (fs->on_request) {
        done = fs->on_request(fs, conn, id, method, map) != 0;
      } else {
        done = fake_error(conn, id, 16, "UNKNOWN_METHOD", "no such method") != 0;
      }
    }
  }
  msgpack_unpacked_destroy(&u);
  msgpack_unpacker_destroy(&up);
  close(conn);
}

static void *fake_conn_main(void *arg) {
  fake_conn_t *fc = arg;
  fake_server_t *fs = fc->fs;
  if (!(fs->on_accept && fs->on_accept(fs, fc->fd)))
    fake_serve(fs, fc->fd);
  else
    close(fc->fd);
  free(fc);
  pthread_mutex_lock(&fs->lock);
  if (--fs->active == 0) pthread_cond_signal(&fs->idle);
  pthread_mutex_unlock(&fs->lock);
  return NULL;
}

static void *fake_main(void *arg) {
  fake_server_t *fs = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = fs->listen_fd, .events = POLLIN},
                          {.fd = fs->stop_pipe[0], .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) break;
    int conn = accept4(fs->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) continue;
    fake_conn_t *fc = malloc(sizeof *fc);
    if (!fc) abort();
    fc->fs = fs;
    fc->fd = conn;
    pthread_mutex_lock(&fs->lock);
    fs->active++;
    pthread_mutex_unlock(&fs->lock);
    pthread_t t;
    if (pthread_create(&t, NULL, fake_conn_main, fc) != 0) abort();
    pthread_detach(t);
  }
  return NULL;
}

/* Starts listening; handlers must be set before. Aborts on setup errors. */
static inline void fake_start(fake_server_t *fs) {
  snprintf(fs->dir, sizeof fs->dir, "/tmp/stfake-XXXXXX");
  if (!mkdtemp(fs->dir)) abort();
  snprintf(fs->path, sizeof fs->path, "%s/fake-0.sock", fs->dir);
  fs->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, fs->path, strlen(fs->path) + 1);
  if (fs->listen_fd < 0 || bind(fs->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(fs->listen_fd, 16) != 0 || pipe2(fs->stop_pipe, O_CLOEXEC) != 0)
    abort();
  pthread_mutex_init(&fs->lock, NULL);
  pthread_cond_init(&fs->idle, NULL);
  fs->active = 0;
  if (pthread_create(&fs->thread, NULL, fake_main, fs) != 0) abort();
}

/* Stops the threads (connections still open are closed) and removes the
 * socket and dir. */
static inline void fake_stop(fake_server_t *fs) {
  if (write(fs->stop_pipe[1], "x", 1) != 1) abort();
  pthread_join(fs->thread, NULL);
  pthread_mutex_lock(&fs->lock);
  while (fs->active > 0) pthread_cond_wait(&fs->idle, &fs->lock);
  pthread_mutex_unlock(&fs->lock);
  close(fs->listen_fd);
  close(fs->stop_pipe[0]);
  close(fs->stop_pipe[1]);
  unlink(fs->path);
  rmdir(fs->dir);
}

/* Waits (up to ms) until no connection thread runs. 0, or -1 on timeout. */
static inline int fake_wait_idle(fake_server_t *fs, int ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (long)(ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  int rc = 0;
  pthread_mutex_lock(&fs->lock);
  while (fs->active > 0 && rc == 0) rc = pthread_cond_timedwait(&fs->idle, &fs->lock, &until);
  int left = fs->active;
  pthread_mutex_unlock(&fs->lock);
  return left ? -1 : 0;
}

/* The end of a test program: waits (up to 2 s) for the connections to
 * end, then fake_stop. */
static inline void fake_finish(fake_server_t *fs) {
  fake_wait_idle(fs, 2000);
  fake_stop(fs);
}

/* Number of open descriptors of this process (for leak checks). */
static inline int fake_count_fds(void) {
  int n = 0;
  for (int fd = 0; fd < 4096; fd++)
    if (fcntl(fd, F_GETFD) >= 0) n++;
  return n;
}

#endif

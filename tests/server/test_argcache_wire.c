/* The argument cache of tensor arguments on the wire (docs/protocol.md,
 * "Tensor arguments"; docs/pool.md, section 4), against a real stserver
 * over raw sockets with hand-packed requests and CPU memfds, with
 * limits.max_cached_arguments = 2:
 *   - an arena sent with an fd and an arg_id is kept: a later request names
 *     it by arg_id alone (no descriptor travels: fds_received stays) and
 *     reads the memory's current contents; the body's writes land in it;
 *   - forget (on any method) drops the entry: the arena count is back;
 *   - an id the connection never sent, or another connection's, is
 *     INVALID_ARGUMENT with `uncached`, and nothing else changes;
 *   - a description that does not match the kept allocation is refused;
 *   - the bound drops the least recently used entry;
 *   - closing the connection drops every entry; an old-style request
 *     (no arg_id) keeps nothing.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;
static rc_t M;              /* the monitor connection: info */
static int base_fds;        /* the server's descriptors, M open, idle */
static int64_t base_arenas; /* info.arenas.count, idle */

static const char EP_ADD[] =
    "return st.endpoint{ name = \"add\",\n"
    "  params = { x = st.tensor_param{ dtype = \"float64\" }, k = 0 },\n"
    "  build = function(a) local v = a.x:get(0); a.x:add_(a.k); return v end }\n";

#define PAGE 4096

/* A sealed memfd of one page whose first float64 is `value`; *keep gets
 * a second descriptor of it, so that the test can rewrite it later. */
static int page_of(double value, int *keep) {
  int fd = memfd_create("argcache-wire", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  int ok = ftruncate(fd, PAGE) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0;
  ok = ok && pwrite(fd, &value, sizeof value, 0) == sizeof value;
  *keep = ok ? dup(fd) : -1;
  if (!ok || *keep < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static double first_of(int fd) {
  double v = -1;
  return pread(fd, &v, sizeof v, 0) == sizeof v ? v : -1;
}

/* Requests: call add(x = float64[1] of arena 0, k) with an arena entry
 * that carries fd 0 (SENT) or names arg_id alone (NAMED). */
#define ENTRY "bytes: 4096, device: 'cpu', backend: 'memfd', id: 1"
#define SENT(arg) "{fd: 0, " ENTRY ", arg_id: " arg "}"
#define NAMED(arg) "{" ENTRY ", arg_id: " arg "}"
#define ADD(arena) \
  "[0, %u, 'call', [{endpoint: 'add', args: {x: tensor(0, 0, 'float64', [1], [1]), k: %d}, " \
  "arenas: [" arena "]}]]"

static uint32_t next_id = 100;

/* Sends the request of fmt with one arena entry (fd: the descriptor that
 * rides, or -1) and returns the value the body read, or -1e300 with the
 * error in why. */
static double add(rc_t *c, char *why, size_t len, int fd, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static double add(rc_t *c, char *why, size_t len, int fd, const char *fmt, ...) {
  msg_t m;
  int fds[1] = {fd};
  va_list ap;
  va_start(ap, fmt);
  int rc = rc_vrpcf(c, &m, fds, fd >= 0, fmt, ap);
  va_end(ap);
  if (rc != 1) {
    snprintf(why, len, "no reply");
    return -1e300;
  }
  double v = -1e300;
  const msgpack_object *o = m.error ? NULL : obj_get(m.result, "value");
  if (m.error) snprintf(why, len, "%s: %s", msg_errname(&m), msg_errmsg(&m));
  else if (o && (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32)) v = o->via.f64;
  else if (o) v = (double)obj_int(o);
  msg_free(&m);
  return v;
}

/* add(...) must read `want`. */
#define CHECK_ADD(c, fmt, fd, k, want)                                          \
  do {                                                                          \
    char why_[300] = "";                                                        \
    double got_ = add((c), why_, sizeof why_, (fd), fmt, next_id++, (k));      \
    if (got_ != (double)(want))                                                 \
      STT_FAIL("%s: read %g, expected %g %s", #fmt, got_, (double)(want), why_); \
  } while (0)

/* The uncached ids of an error reply (the first one; -1: none). */
static int64_t uncached_of(const msg_t *m) {
  const msgpack_object *u = m->error ? obj_get(m->error, "uncached") : NULL;
  if (!u || u->type != MSGPACK_OBJECT_ARRAY || u->via.array.size == 0) return -1;
  return obj_int(&u->via.array.ptr[0]);
}

/* Polls until the server is back to its idle descriptors and arenas. */
static int back_to_baseline(void) {
  double end = stt_now_ms() + 5000;
  while (stt_now_ms() < end) {
    if (rc_info_int(&M, "connections") == 1 && rc_info_int(&M, "arenas.count") == base_arenas &&
        stt_proc_fd_count(S.pid) == base_fds)
      return 0;
    stt_sleep_ms(5);
  }
  fprintf(stderr, "   not back: arenas %lld (base %lld), fds %d (base %d)\n",
          (long long)rc_info_int(&M, "arenas.count"), (long long)base_arenas,
          stt_proc_fd_count(S.pid), base_fds);
  return -1;
}

TEST(a_kept_argument_is_named_by_id_and_read_as_it_is_now) {
  OPEN_RC(c, S.socket);
  int keep;
  int fd = page_of(1.0, &keep);
  CHECK(fd >= 0);
  int64_t received = rc_info_int(&M, "counters.fds_received");
  int64_t held = rc_info_int(&M, "held.fds");
  CHECK_ADD(&c, ADD(SENT("7")), fd, 10, 1.0);
  CHECK(first_of(keep) == 11.0);                  /* the body's write */
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + 1);
  CHECK_EQ_INT(rc_info_int(&M, "arenas.count"), base_arenas + 1);   /* kept */
  CHECK_EQ_INT(rc_info_int(&M, "held.fds"), held + 1);
  double five = 5.0;
  CHECK(pwrite(keep, &five, sizeof five, 0) == sizeof five);        /* write between calls */
  CHECK_ADD(&c, ADD(NAMED("7")), -1, 1, 5.0);
  CHECK(first_of(keep) == 6.0);
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + 1);   /* none sent */
  CHECK_EQ_INT(rc_info_int(&M, "arenas.count"), base_arenas + 1);         /* one import */

  /* forget rides on any request: the entry and its arena go */
  CHECK_RPC(&c, ST_OK, NULL, "[0, 5, 'ping', [{forget: [7, 12345]}]]");
  CHECK(rc_wait_info(&M, "arenas.count", base_arenas, 5000) == 0);
  CHECK_EQ_INT(rc_info_int(&M, "held.fds"), held);
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, "arg_id 7 is not cached", ADD(NAMED("7")), 6, 0);
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, "'forget' must be an array",
            "[0, 7, 'ping', [{forget: 'all'}]]");
  close(keep);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(an_id_never_sent_here_is_refused_and_nothing_changes) {
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  int keep;
  int fd = page_of(3.0, &keep);
  CHECK(fd >= 0);
  CHECK_ADD(&a, ADD(SENT("5")), fd, 0, 3.0);
  int64_t arenas = rc_info_int(&M, "arenas.count");
  int64_t held = rc_info_int(&M, "held.fds");
  int fds = stt_proc_fd_count(S.pid);
  /* b never sent 5 (a did), nor 99 */
  for (int i = 0; i < 2; i++) {
    msg_t m;
    CHECK((i == 0 ? rc_rpcf(&b, &m, ADD(NAMED("5")), 40u, 7)
                  : rc_rpcf(&b, &m, ADD(NAMED("99")), 41u, 7)) == 1);
    CHECK_REPLY(&m, ST_ERR_INVALID_ARGUMENT, "is not cached on this connection");
    CHECK_EQ_INT(uncached_of(&m), i == 0 ? 5 : 99);
    msg_free(&m);
  }
  CHECK_EQ_INT(rc_info_int(&M, "arenas.count"), arenas);
  CHECK_EQ_INT(rc_info_int(&M, "held.fds"), held);
  CHECK_EQ_INT(stt_proc_fd_count(S.pid), fds);
  CHECK(first_of(keep) == 3.0);                   /* the body never ran */
  CHECK_RPC(&b, ST_OK, NULL, "[0, 50, 'ping', []]");    /* b stays */
  CHECK_ADD(&a, ADD(NAMED("5")), -1, 0, 3.0);   /* a's still works */

  /* a description that is not the kept allocation's: refused, no resend */
  msg_t m;
  CHECK(rc_rpcf(&a, &m,
                "[0, %u, 'call', [{endpoint: 'add', args: {x: tensor(0, 0, 'float64', [1], [1])}, "
                "arenas: [{bytes: 8192, device: 'cpu', backend: 'memfd', id: 1, arg_id: 5}]}]]",
                60u) == 1);
  CHECK_REPLY(&m, ST_ERR_INVALID_ARGUMENT, "arg_id 5 names a memfd allocation of 4096 bytes");
  CHECK_EQ_INT(uncached_of(&m), -1);
  msg_free(&m);
  close(keep);
  rc_close(&a);
  rc_close(&b);
  CHECK(back_to_baseline() == 0);
}

TEST(the_bound_drops_the_least_recently_used) {
  OPEN_RC(c, S.socket);
  int keep[3];
  for (int i = 0; i < 3; i++) {
    int fd = page_of(10.0 * (i + 1), &keep[i]);
    CHECK(fd >= 0);
    if (i == 0) CHECK_ADD(&c, ADD(SENT("1")), fd, 0, 10.0);
    if (i == 1) CHECK_ADD(&c, ADD(SENT("2")), fd, 0, 20.0);
    if (i < 2) continue;
    /* 1 is used again first: 2 is the least recently used */
    CHECK_ADD(&c, ADD(NAMED("1")), -1, 0, 10.0);
    CHECK_ADD(&c, ADD(SENT("3")), fd, 0, 30.0);
  }
  CHECK_EQ_INT(rc_info_int(&M, "arenas.count"), base_arenas + 2);
  CHECK_ADD(&c, ADD(NAMED("1")), -1, 0, 10.0);
  CHECK_ADD(&c, ADD(NAMED("3")), -1, 0, 30.0);
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, "arg_id 2 is not cached", ADD(NAMED("2")), 70, 0);
  for (int i = 0; i < 3; i++) close(keep[i]);
  rc_close(&c);   /* closing drops the rest */
  CHECK(back_to_baseline() == 0);
}

TEST(requests_without_arg_ids_keep_nothing) {
  OPEN_RC(c, S.socket);
  int keep;
  int fd = page_of(4.0, &keep);
  CHECK(fd >= 0);
  CHECK_ADD(&c, ADD("{fd: 0, " ENTRY "}"), fd, 0, 4.0);
  CHECK(rc_wait_info(&M, "arenas.count", base_arenas, 5000) == 0);
  close(keep);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

int main(void) {
  stt_server_setup(&S, "workers = 1, limits = { max_cached_arguments = 2 },",
                   (const stt_endpoint_t[]){{"add.lua", EP_ADD}, {NULL, NULL}});
  rc_open_or_exit(&M, S.socket);
  /* Warm the worker (its Lua state) before the baselines. */
  int keep;
  int fd = page_of(0.0, &keep);
  char why[300] = "";
  if (fd < 0 || add(&M, why, sizeof why, fd, ADD("{fd: 0, " ENTRY "}"), next_id++, 0) != 0.0) {
    fprintf(stderr, "warm-up call failed: %s\n", why);
    return 1;
  }
  close(keep);
  base_fds = stt_proc_fd_count(S.pid);
  base_arenas = rc_info_int(&M, "arenas.count");
  RUN(a_kept_argument_is_named_by_id_and_read_as_it_is_now);
  RUN(an_id_never_sent_here_is_refused_and_nothing_changes);
  RUN(the_bound_drops_the_least_recently_used);
  RUN(requests_without_arg_ids_keep_nothing);
  rc_close(&M);
  return stt_server_finish(&S);
}

/* Tensor arguments on the wire (docs/protocol.md, "Tensor arguments"),
 * against a real stserver over raw sockets with hand-packed requests and
 * hand-made descriptors (CPU memfds):
 *   - a request that lists arenas without their descriptors, or whose
 *     params.arenas is not an array, is a PROTOCOL error that closes;
 *   - a descriptor that is not a sealed, writable memfd as large as the
 *     arena says (unsealed, a pipe, a regular file, read-only, too short),
 *     a tensor past its arena or naming a missing arena, a module as an
 *     argument, backend "legacy", an fd index out of order, arenas sent to
 *     ping or invalidate_call: INVALID_ARGUMENT, the connection stays, and
 *     the descriptors are consumed (the next request reads its own memory);
 *   - descriptors no request lists are closed once the request they came
 *     with is handled; more than 506 waiting for an incomplete request:
 *     PROTOCOL and the connection closes;
 *   - a client that disconnects before its reply leaks nothing;
 *   - pipelined requests, each with its own descriptor (sent one by one,
 *     all at once, or straddling request boundaries), read their own
 *     memory;
 *   - info counts fds_received, and in the end the server holds as many
 *     descriptors and arenas as before the first request.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "check.h"
#include "rpc_kit.h"
#include "st/errors.h"
#include "st/wire.h"

static stt_server_t S;
static rc_t M;              /* the monitor connection: info, fd counts */
static int base_fds;        /* the server's descriptors, M open, idle   */
static int64_t base_arenas; /* info.arenas.count, idle                  */
static uint32_t next_id = 100;

static const char EP_FIRST[] =
    "return st.endpoint{ name = \"first\",\n"
    "  params = { x = st.tensor_param{ dtype = \"float64\", device = \"cpu\" } },\n"
    "  build = function(a) return a.x:get(0) end }\n";
static const char EP_SLOW[] =
    "return st.endpoint{ name = \"slow_first\",\n"
    "  params = { x = st.tensor_param{}, s = 0.3 },\n"
    "  build = function(a) st.sleep(a.s); return a.x:get(0) end }\n";
static const char EP_ANY[] =
    "return st.endpoint{ name = \"anyarg\", cache = true, params = { v = st.required },\n"
    "  build = function(a) return 1 end }\n";

/* ------------------------------------------------------------- memory */

#define PAGE 4096

/* A memfd of `bytes` whose first float64 is `value`; sealed against
 * shrinking and growing unless `unsealed`. The descriptor, or -1. */
static int memfd_with(size_t bytes, double value, int unsealed) {
  int fd = memfd_create("targs-wire", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, (off_t)bytes) != 0 || pwrite(fd, &value, sizeof value, 0) != sizeof value ||
      (!unsealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* ------------------------------------------------------------- frames */

/* One entry of params.arenas: a CPU arena unless told otherwise. */
typedef struct arena {
  int64_t fd;              /* the "fd" index; -1: the key is left out */
  uint64_t bytes;
  const char *backend;     /* NULL: "memfd" */
  int legacy_fields;       /* add ipc_handle, device_index, storage_bytes */
} arena_t;

static void pack_arena_map(msgpack_packer *pk, const arena_t *a) {
  int legacy = a->legacy_fields;
  msgpack_pack_map(pk, (a->fd >= 0 ? 5u : 4u) + (legacy ? 4u : 0u));
  if (a->fd >= 0) {
    pk_str(pk, "fd");
    msgpack_pack_int64(pk, a->fd);
  }
  pk_str(pk, "bytes");
  msgpack_pack_uint64(pk, a->bytes);
  pk_str(pk, "device");
  pk_str(pk, legacy ? "cuda" : "cpu");
  pk_str(pk, "backend");
  pk_str(pk, a->backend ? a->backend : "memfd");
  pk_str(pk, "id");
  msgpack_pack_uint64(pk, 4242);
  if (legacy) {
    unsigned char handle[ST_IPC_HANDLE_LEN] = {1};
    pk_str(pk, "uuid");
    pk_str(pk, "GPU-00000000-0000-0000-0000-000000000000");
    pk_str(pk, "ipc_handle");
    msgpack_pack_bin(pk, sizeof handle);
    msgpack_pack_bin_body(pk, handle, sizeof handle);
    pk_str(pk, "device_index");
    msgpack_pack_int(pk, 0);
    pk_str(pk, "storage_bytes");
    msgpack_pack_uint64(pk, a->bytes);
  }
}

/* A 1-d float64 tensor of n elements at `offset` of arena `arena`. */
static void pack_f64(msgpack_packer *pk, uint32_t arena, uint64_t offset, int64_t n) {
  st__tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.arena = arena;
  d.offset = offset;
  d.dtype = ST_DTYPE_FLOAT64;
  d.ndim = 1;
  d.shape[0] = n;
  d.strides[0] = 1;
  st__pack_tensor(pk, &d);
}

/* [0, id, method, [{endpoint = ep, args = {x = <tensor>}, arenas = [...]}]]
 * (ep NULL: no endpoint key; arg NULL: no args). The tensor argument is
 * a float64 vector of n elements at `offset` of arena `tarena`. */
static void rq_targ(rq_t *r, uint32_t id, const char *method, const char *ep, const char *arg,
                    uint32_t tarena, uint64_t offset, int64_t n, const arena_t *arenas,
                    int narenas) {
  rq_init(r);
  rq_head(r, id, method);
  msgpack_pack_array(&r->pk, 1);
  msgpack_pack_map(&r->pk, (ep ? 1u : 0u) + (arg ? 1u : 0u) + (narenas >= 0 ? 1u : 0u));
  if (ep) {
    pk_str(&r->pk, "endpoint");
    pk_str(&r->pk, ep);
  }
  if (arg) {
    pk_str(&r->pk, "args");
    msgpack_pack_map(&r->pk, 1);
    pk_str(&r->pk, arg);
    pack_f64(&r->pk, tarena, offset, n);
  }
  if (narenas >= 0) {
    pk_str(&r->pk, "arenas");
    msgpack_pack_array(&r->pk, (size_t)narenas);
    for (int i = 0; i < narenas; i++) pack_arena_map(&r->pk, &arenas[i]);
  }
}

/* The usual request: call `ep` with x = 1 float64 of a one-page arena. */
static void rq_first(rq_t *r, uint32_t id, const char *ep) {
  arena_t a = {.fd = 0, .bytes = PAGE};
  rq_targ(r, id, "call", ep, "x", 0, 0, 1, &a, 1);
}

/* Sends len bytes with nfds descriptors riding on the first one. 0 or -1. */
static int send_with_fds(int sock, const void *buf, size_t len, const int *fds, int nfds) {
  if (nfds == 0) return stt_send_all(sock, buf, len);
  union {
    char buf[CMSG_SPACE(sizeof(int) * ST_MAX_FDS_PER_MESSAGE)];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                      .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
  memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
  ssize_t n;
  do n = sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return -1;
  return stt_send_all(sock, (const char *)buf + n, len - (size_t)n);
}

/* Sends a request with descriptors (closed here: the kernel took its own
 * references), frees it and reads the next message. 1 on a message. */
static int rpc_fds(rc_t *c, rq_t *r, int *fds, int nfds, msg_t *m) {
  int rc = send_with_fds(c->fd, r->sb.data, r->sb.size, fds, nfds);
  rq_free(r);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  if (rc != 0) return -1;
  return rc_next(c, m, 10000);
}

static double num(const msgpack_object *o) {
  if (!o) return -1e300;
  if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) return o->via.f64;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (double)o->via.u64;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (double)o->via.i64;
  return -1e300;
}

/* Sends a request with one descriptor and expects INVALID_ARGUMENT whose
 * message contains `want`; the connection must stay. 0 or -1. */
static int expect_invalid(rc_t *c, rq_t *r, int fd, const char *want) {
  msg_t m;
  int fds[1] = {fd};
  if (fd < 0 || rpc_fds(c, r, fds, 1, &m) != 1) return -1;
  int ok = strcmp(msg_errname(&m), "INVALID_ARGUMENT") == 0 && strstr(msg_errmsg(&m), want);
  if (!ok)
    fprintf(stderr, "   got %s: '%s', expected INVALID_ARGUMENT with '%s'\n", msg_errname(&m),
            msg_errmsg(&m), want);
  msg_free(&m);
  return ok ? 0 : -1;
}

/* A valid call on c with a fresh memfd holding a value no other request
 * used: the answer must be that value (a descriptor left over by an
 * earlier request would be taken instead and give another). 0 or -1. */
static int next_call_reads_its_own(rc_t *c) {
  static double value = 1000.25;
  value += 1;
  rq_t r;
  rq_first(&r, next_id++, "first");
  int fds[1] = {memfd_with(PAGE, value, 0)};
  msg_t m;
  if (fds[0] < 0 || rpc_fds(c, &r, fds, 1, &m) != 1) return -1;
  double got = m.error ? -1 : num(obj_get(m.result, "value"));
  if (got != value)
    fprintf(stderr, "   next call: %s '%s', value %g, expected %g\n", msg_errname(&m),
            msg_errmsg(&m), got, value);
  msg_free(&m);
  rc_drop_fds(c);
  return got == value ? 0 : -1;
}

/* Reads until the server closes c: 0 when EOF comes within 5 s. */
static int closed_by_server(rc_t *c) {
  msg_t m;
  int r;
  while ((r = rc_next(c, &m, 5000)) == 1) msg_free(&m);
  return r == 0 ? 0 : -1;
}

/* Polls until the server's descriptor count and info.arenas.count are
 * back to the baselines (closing is asynchronous). 0 or -1. */
static int back_to_baseline(void) {
  double end = stt_now_ms() + 5000;
  int fds = -1;
  int64_t arenas = -1, conns = -1;
  while (stt_now_ms() < end) {
    conns = rc_info_int(&M, "connections");
    arenas = rc_info_int(&M, "arenas.count");
    fds = proc_fd_count(S.pid);
    if (conns == 1 && arenas == base_arenas && fds == base_fds) return 0;
    rk_pause_ms(5);
  }
  fprintf(stderr, "   server: %d descriptors (baseline %d), %lld arenas (baseline %lld), "
                  "%lld connections\n",
          fds, base_fds, (long long)arenas, (long long)base_arenas, (long long)conns);
  return -1;
}

/* Polls (5 s at most) until the server holds at most (above = 0) or at
 * least (above = 1) n descriptors. 0 or -1. */
static int fd_count_reaches(int n, int above) {
  double end = stt_now_ms() + 5000;
  int now = proc_fd_count(S.pid);
  while (!(above ? now >= n : now <= n) && stt_now_ms() < end) {
    rk_pause_ms(1);
    now = proc_fd_count(S.pid);
  }
  if (above ? now >= n : now <= n) return 0;
  fprintf(stderr, "   server holds %d descriptors, expected %s %d\n", now,
          above ? "at least" : "at most", n);
  return -1;
}

/* ------------------------------------------------------------- tests */

TEST(a_valid_argument_reads_the_callers_memory) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  int64_t received = rc_info_int(&M, "counters.fds_received");
  rq_t r;
  rq_first(&r, 1, "first");
  int fds[1] = {memfd_with(PAGE, 6.5, 0)};
  CHECK(fds[0] >= 0);
  msg_t m;
  CHECK(rpc_fds(&c, &r, fds, 1, &m) == 1);
  CHECK_EQ_INT(m.id, 1);
  CHECK(m.error == NULL);
  CHECK(num(obj_get(m.result, "value")) == 6.5);
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + 1);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(arenas_without_their_descriptors_close_the_connection) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  int64_t perr = rc_info_int(&M, "counters.protocol_errors");
  rq_t r;
  rq_first(&r, 7, "first");
  msg_t m;
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(m.id, 7);
  CHECK_STR_EQ(msg_errname(&m), "PROTOCOL");
  CHECK_CONTAINS(msg_errmsg(&m), "lists 1 arenas but 0 descriptors");
  msg_free(&m);
  CHECK(closed_by_server(&c) == 0);
  rc_close(&c);
  CHECK_EQ_INT(rc_info_int(&M, "counters.protocol_errors"), perr + 1);

  /* params.arenas that is no array: PROTOCOL too */
  CHECK(rc_open(&c, S.socket) == 0);
  rq_init(&r);
  rq_head(&r, 8, "call");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 2);
  pk_str(&r.pk, "endpoint");
  pk_str(&r.pk, "first");
  pk_str(&r.pk, "arenas");
  pk_str(&r.pk, "not an array");
  int fds[1] = {memfd_with(PAGE, 1, 0)};
  CHECK(rpc_fds(&c, &r, fds, 1, &m) == 1);
  CHECK_EQ_INT(m.id, 8);
  CHECK_STR_EQ(msg_errname(&m), "PROTOCOL");
  CHECK_CONTAINS(msg_errmsg(&m), "must be an array");
  msg_free(&m);
  CHECK(closed_by_server(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(descriptors_that_are_not_sealed_writable_memfds_are_refused) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  /* unsealed */
  rq_first(&r, 10, "first");
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 1), "F_SEAL_SHRINK") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* a pipe */
  int p[2];
  CHECK(pipe2(p, O_CLOEXEC) == 0);
  close(p[1]);
  rq_first(&r, 11, "first");
  CHECK(expect_invalid(&c, &r, p[0], "not a memory file") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* a regular file, large enough */
  char path[400];
  snprintf(path, sizeof path, "%s/plain.bin", S.dir);
  int f = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  CHECK(f >= 0);
  CHECK(ftruncate(f, PAGE) == 0);
  rq_first(&r, 12, "first");
  CHECK(expect_invalid(&c, &r, f, "F_SEAL_SHRINK") == 0);
  unlink(path);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* a read-only descriptor of a sealed memfd */
  int w = memfd_with(PAGE, 1, 0);
  CHECK(w >= 0);
  char proc[64];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", w);
  int ro = open(proc, O_RDONLY | O_CLOEXEC);
  close(w);
  CHECK(ro >= 0);
  rq_first(&r, 13, "first");
  CHECK(expect_invalid(&c, &r, ro, "read-write failed") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* an arena shorter than it claims */
  arena_t big = {.fd = 0, .bytes = 4 * PAGE};
  rq_targ(&r, 14, "call", "first", "x", 0, 0, 1, &big, 1);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "the arena says 16384 bytes") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(tensors_and_arena_lists_that_do_not_match_are_refused) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  arena_t one = {.fd = 0, .bytes = PAGE};
  /* past the end: too many elements, then an offset too far */
  rq_targ(&r, 20, "call", "first", "x", 0, 0, PAGE / 8 + 1, &one, 1);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "past the end of arena 0") == 0);
  rq_targ(&r, 21, "call", "first", "x", 0, PAGE, 1, &one, 1);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "past the end of arena 0") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* a tensor naming an arena the request does not list */
  rq_targ(&r, 22, "call", "first", "x", 1, 0, 1, &one, 1);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "arena 1 is not in this request") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* backend "legacy" (complete with its own fields) */
  arena_t legacy = {.fd = -1, .bytes = PAGE, .backend = "legacy", .legacy_fields = 1};
  rq_targ(&r, 23, "call", "first", "x", 0, 0, 1, &legacy, 1);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "backend \"legacy\" cannot carry") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* fd indexes out of order: two arenas, two descriptors */
  arena_t swapped[2] = {{.fd = 1, .bytes = PAGE}, {.fd = 0, .bytes = PAGE}};
  rq_targ(&r, 24, "call", "first", "x", 0, 0, 1, swapped, 2);
  int two[2] = {memfd_with(PAGE, 1, 0), memfd_with(PAGE, 2, 0)};
  msg_t m;
  CHECK(rpc_fds(&c, &r, two, 2, &m) == 1);
  CHECK_STR_EQ(msg_errname(&m), "INVALID_ARGUMENT");
  CHECK_CONTAINS(msg_errmsg(&m), "arenas[0]: fd must be 0");
  msg_free(&m);
  CHECK(next_call_reads_its_own(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(a_module_is_no_argument) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  /* {tensors = [["w", <tensor of arena 0>]], metadata = {}} as ext 2 */
  msgpack_sbuffer payload;
  msgpack_sbuffer_init(&payload);
  msgpack_packer pp;
  msgpack_packer_init(&pp, &payload, msgpack_sbuffer_write);
  msgpack_pack_map(&pp, 2);
  pk_str(&pp, "tensors");
  msgpack_pack_array(&pp, 1);
  msgpack_pack_array(&pp, 2);
  pk_str(&pp, "w");
  pack_f64(&pp, 0, 0, 1);
  pk_str(&pp, "metadata");
  msgpack_pack_map(&pp, 0);
  rq_t r;
  rq_init(&r);
  rq_head(&r, 30, "call");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 3);
  pk_str(&r.pk, "endpoint");
  pk_str(&r.pk, "anyarg");
  pk_str(&r.pk, "args");
  msgpack_pack_map(&r.pk, 1);
  pk_str(&r.pk, "v");
  st__pack_ext(&r.pk, ST_EXT_MODULE, &payload);
  msgpack_sbuffer_destroy(&payload);
  pk_str(&r.pk, "arenas");
  msgpack_pack_array(&r.pk, 1);
  arena_t one = {.fd = 0, .bytes = PAGE};
  pack_arena_map(&r.pk, &one);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "only tensors may be passed") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  rc_close(&c);
}

TEST(methods_without_tensor_arguments_consume_the_descriptors) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  arena_t one = {.fd = 0, .bytes = PAGE};
  rq_t r;
  /* ping with a tensor argument in arenas: its only parameter is none */
  rq_targ(&r, 40, "ping", NULL, NULL, 0, 0, 0, &one, 1);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "unknown parameter 'arenas'") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* invalidate_call binds args like call but takes no arenas */
  rq_targ(&r, 41, "invalidate_call", "anyarg", "v", 0, 0, 1, &one, 1);
  CHECK(expect_invalid(&c, &r, memfd_with(PAGE, 1, 0), "unknown parameter 'arenas'") == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  /* an unknown method, and a call of an unknown endpoint */
  rq_targ(&r, 42, "frobnicate", NULL, NULL, 0, 0, 0, &one, 1);
  msg_t m;
  int fds[1] = {memfd_with(PAGE, 1, 0)};
  CHECK(rpc_fds(&c, &r, fds, 1, &m) == 1);
  CHECK_STR_EQ(msg_errname(&m), "UNKNOWN_METHOD");
  msg_free(&m);
  CHECK(next_call_reads_its_own(&c) == 0);
  rq_targ(&r, 43, "call", "nope", "x", 0, 0, 1, &one, 1);
  fds[0] = memfd_with(PAGE, 1, 0);
  CHECK(rpc_fds(&c, &r, fds, 1, &m) == 1);
  CHECK_STR_EQ(msg_errname(&m), "UNKNOWN_ENDPOINT");
  msg_free(&m);
  CHECK(next_call_reads_its_own(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

/* Sends len bytes of buf with `n` copies of `fd`. 0 or -1. */
static int send_copies(rc_t *c, const void *buf, size_t len, int fd, int n) {
  int fds[ST_MAX_FDS_PER_MESSAGE];
  for (int i = 0; i < n; i++) fds[i] = fd;
  return send_with_fds(c->fd, buf, len, fds, n);
}

TEST(descriptors_no_request_lists_are_closed) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  int64_t received = rc_info_int(&M, "counters.fds_received");
  int fd = memfd_with(PAGE, 1, 0);
  CHECK(fd >= 0);
  /* 3 x 253 with pings, which list none: each batch is closed once its
   * ping is handled, so none ever piles up */
  for (uint32_t i = 0; i < 3; i++) {
    rq_t r;
    rq_init(&r);
    rq_simple(&r, 50 + i, "ping");
    CHECK(send_copies(&c, r.sb.data, r.sb.size, fd, ST_MAX_FDS_PER_MESSAGE) == 0);
    rq_free(&r);
    msg_t m;
    CHECK(rc_next(&c, &m, 10000) == 1);
    CHECK_EQ_INT(m.id, 50 + i);
    CHECK(m.error == NULL);
    CHECK_STR_EQ(obj_str(m.result), "pong");
    msg_free(&m);
    CHECK(fd_count_reaches(base_fds + 1, 0) == 0);
  }
  close(fd);
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + 3 * ST_MAX_FDS_PER_MESSAGE);
  /* a call that lists one arena but comes with two: it takes the first,
   * the second is closed; the next call reads its own memory */
  rq_t r;
  rq_first(&r, 53, "first");
  int two[2] = {memfd_with(PAGE, 53, 0), memfd_with(PAGE, -1, 0)};
  msg_t m;
  CHECK(rpc_fds(&c, &r, two, 2, &m) == 1);
  CHECK(m.error == NULL && num(obj_get(m.result, "value")) == 53);
  msg_free(&m);
  CHECK(next_call_reads_its_own(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(more_than_506_unclaimed_descriptors_close_the_connection) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  int fd = memfd_with(PAGE, 1, 0);
  CHECK(fd >= 0);
  /* a request that stays incomplete while descriptors keep coming: they
   * wait for it, 2 x 253 fit, one more does not */
  rq_t r;
  rq_first(&r, 55, "first");
  CHECK(r.sb.size > 3);
  int64_t perr = rc_info_int(&M, "counters.protocol_errors");
  CHECK(send_copies(&c, r.sb.data, 1, fd, ST_MAX_FDS_PER_MESSAGE) == 0);
  CHECK(send_copies(&c, r.sb.data + 1, 1, fd, ST_MAX_FDS_PER_MESSAGE) == 0);
  CHECK(rc_wait_drained(&c, 5000) == 0);
  /* read and queued: the server holds them all, the connection is open */
  CHECK(fd_count_reaches(base_fds + 1 + 2 * ST_MAX_FDS_PER_MESSAGE, 1) == 0);
  CHECK_EQ_INT(rc_info_int(&M, "connections"), 2);
  CHECK(send_copies(&c, r.sb.data + 2, 1, fd, 1) == 0);
  rq_free(&r);
  close(fd);
  msg_t m;
  CHECK(rc_next(&c, &m, 10000) == 1);
  CHECK_EQ_INT(m.id, 0);
  CHECK_STR_EQ(msg_errname(&m), "PROTOCOL");
  CHECK_CONTAINS(msg_errmsg(&m), "more descriptors arrived");
  msg_free(&m);
  CHECK(closed_by_server(&c) == 0);
  rc_close(&c);
  CHECK_EQ_INT(rc_info_int(&M, "counters.protocol_errors"), perr + 1);
  CHECK(back_to_baseline() == 0);
}

TEST(a_client_gone_before_its_reply_leaks_nothing) {
  /* gone while the call is queued or running: twice, the second time
   * only once the body runs */
  for (int round = 0; round < 2; round++) {
    rc_t c;
    CHECK(rc_open(&c, S.socket) == 0);
    arena_t one = {.fd = 0, .bytes = PAGE};
    rq_t r;
    rq_targ(&r, 60, "call", "slow_first", "x", 0, 0, 1, &one, 1);
    int fds[1] = {memfd_with(PAGE, 3, 0)};
    CHECK(fds[0] >= 0);
    CHECK(send_with_fds(c.fd, r.sb.data, r.sb.size, fds, 1) == 0);
    rq_free(&r);
    close(fds[0]);
    if (round == 1) CHECK(rc_wait_info(&M, "inflight", 1, 5000) == 0);
    rc_close(&c);
    CHECK(rc_wait_info(&M, "inflight", 0, 5000) == 0);
    CHECK(back_to_baseline() == 0);
  }
}

/* Pipelines 20 calls on one connection, each with a memfd holding
 * 100 + i; `mode` 0 sends each request with its descriptor, 1 sends all
 * 20 descriptors with the first byte of the first request, 2 sends each
 * descriptor with the tail of the previous request (so it arrives while
 * that request is still incomplete). Every reply must carry its own
 * request's value. 0 or -1. */
#define NPIPE 20
static int pipelined(int mode) {
  rc_t c;
  if (rc_open(&c, S.socket) != 0) return -1;
  msgpack_sbuffer all;
  msgpack_sbuffer_init(&all);
  size_t start[NPIPE + 1];
  int fds[NPIPE];
  for (int i = 0; i < NPIPE; i++) {
    rq_t r;
    rq_first(&r, 200 + (uint32_t)i, "first");
    start[i] = all.size;
    msgpack_sbuffer_write(&all, r.sb.data, r.sb.size);
    rq_free(&r);
    fds[i] = memfd_with(PAGE, 100.0 + i, 0);
    if (fds[i] < 0) return -1;
  }
  start[NPIPE] = all.size;
  int rc = 0;
  if (mode == 1) {
    rc = send_with_fds(c.fd, all.data, all.size, fds, NPIPE);
  } else if (mode == 0) {
    for (int i = 0; i < NPIPE && rc == 0; i++)
      rc = send_with_fds(c.fd, all.data + start[i], start[i + 1] - start[i], &fds[i], 1);
  } else {
    /* piece i: the second half of request i-1 and the first half of i,
     * with descriptor i */
    size_t from = 0;
    for (int i = 0; i <= NPIPE && rc == 0; i++) {
      size_t to = i < NPIPE ? start[i] + (start[i + 1] - start[i]) / 2 : all.size;
      rc = send_with_fds(c.fd, all.data + from, to - from, i < NPIPE ? &fds[i] : NULL,
                         i < NPIPE ? 1 : 0);
      from = to;
    }
  }
  for (int i = 0; i < NPIPE; i++) close(fds[i]);
  msgpack_sbuffer_destroy(&all);
  int seen[NPIPE] = {0};
  for (int k = 0; k < NPIPE && rc == 0; k++) {
    msg_t m;
    if (rc_next(&c, &m, 10000) != 1) {
      rc = -1;
      break;
    }
    int i = (int)m.id - 200;
    double v = m.error ? -1 : num(obj_get(m.result, "value"));
    if (i < 0 || i >= NPIPE || seen[i] || v != 100.0 + i) {
      fprintf(stderr, "   mode %d: reply id %u: %s '%s' value %g\n", mode, (unsigned)m.id,
              msg_errname(&m), msg_errmsg(&m), v);
      rc = -1;
    } else {
      seen[i] = 1;
    }
    msg_free(&m);
  }
  rc_close(&c);
  return rc;
}

TEST(pipelined_requests_each_read_their_own_memory) {
  int64_t received = rc_info_int(&M, "counters.fds_received");
  CHECK(pipelined(0) == 0);
  CHECK(pipelined(1) == 0);
  CHECK(pipelined(2) == 0);
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + 3 * NPIPE);
  CHECK(back_to_baseline() == 0);
}

TEST(no_descriptor_or_arena_is_left_behind) {
  CHECK(back_to_baseline() == 0);
  fprintf(stderr, "   server: %d descriptors, %lld arenas\n", base_fds, (long long)base_arenas);
}

int main(void) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "first.lua", EP_FIRST);
  stt_write_endpoint(&S, "slow_first.lua", EP_SLOW);
  stt_write_endpoint(&S, "anyarg.lua", EP_ANY);
  stt_server_config(&S, "workers = 2,");
  if (stt_server_start(&S) != 0) return 1;
  if (rc_open(&M, S.socket) != 0) {
    fprintf(stderr, "connect failed\n");
    return 1;
  }
  /* Warm both workers (their Lua states) before the baselines: two slow
   * calls at once take one worker each. */
  rc_t w;
  rc_open(&w, S.socket);
  for (uint32_t i = 0; i < 2; i++) {
    arena_t one = {.fd = 0, .bytes = PAGE};
    rq_t r;
    rq_targ(&r, 90 + i, "call", "slow_first", "x", 0, 0, 1, &one, 1);
    int fds[1] = {memfd_with(PAGE, 1, 0)};
    send_with_fds(w.fd, r.sb.data, r.sb.size, fds, 1);
    close(fds[0]);
    rq_free(&r);
  }
  for (int i = 0; i < 2; i++) {
    msg_t m;
    if (rc_next(&w, &m, 10000) != 1 || m.error) {
      fprintf(stderr, "warm-up call failed\n");
      return 1;
    }
    msg_free(&m);
  }
  rc_close(&w);
  double end = stt_now_ms() + 5000;
  while (rc_info_int(&M, "connections") != 1 && stt_now_ms() < end) rk_pause_ms(5);
  base_fds = proc_fd_count(S.pid);
  base_arenas = rc_info_int(&M, "arenas.count");

  RUN(a_valid_argument_reads_the_callers_memory);
  RUN(arenas_without_their_descriptors_close_the_connection);
  RUN(descriptors_that_are_not_sealed_writable_memfds_are_refused);
  RUN(tensors_and_arena_lists_that_do_not_match_are_refused);
  RUN(a_module_is_no_argument);
  RUN(methods_without_tensor_arguments_consume_the_descriptors);
  RUN(descriptors_no_request_lists_are_closed);
  RUN(more_than_506_unclaimed_descriptors_close_the_connection);
  RUN(a_client_gone_before_its_reply_leaks_nothing);
  RUN(pipelined_requests_each_read_their_own_memory);
  RUN(no_descriptor_or_arena_is_left_behind);

  rc_close(&M);
  int status = stt_server_stop(&S);
  if (status != 0 || stt_failed) {
    char *log = stt_server_log(&S);
    fprintf(stderr, "server exit status %d\n--- server log\n%s\n", status, log ? log : "");
    free(log);
  }
  stt_server_cleanup(&S);
  if (status != 0) return 1;
  return stt_summary();
}

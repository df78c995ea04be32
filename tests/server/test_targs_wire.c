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
 *     with is handled; those that did not come with a request's first
 *     byte are closed on arrival, so an incomplete request holds its own
 *     (253 at most) and no more; all are closed when the input ends, even
 *     while a wait keeps the connection open;
 *   - a client that disconnects before its reply leaks nothing;
 *   - a connection reset by its client (ECONNRESET on the read) queues no
 *     descriptor left in the control buffer by an earlier read;
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
#include "wire.h"

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
static const char EP_SLOW_PLAIN[] =
    "return st.endpoint{ name = \"slow_first_plain\", params = { s = 0.3 },\n"
    "  build = function(a) st.sleep(a.s); return 1 end }\n";
static const char EP_ANY[] =
    "return st.endpoint{ name = \"anyarg\", cache = true, params = { v = st.required },\n"
    "  build = function(a) return 1 end }\n";

/* ------------------------------------------------------------- memory */

#define PAGE 4096

/* ------------------------------------------------------------- frames */

/* Pieces of requests as stt_pack text: an entry of params.arenas for a
 * CPU memfd, a 1-d float64 tensor of n elements at `off` of arena `a`. */
#define ARENA(fd, bytes) \
  "{fd: " #fd ", bytes: " #bytes ", device: 'cpu', backend: 'memfd', id: 4242}"
#define F64(a, off, n) "tensor(" #a ", " #off ", 'float64', [" #n "], [1])"
/* [0, id, method, [{endpoint = ep, args = {x = <tensor>}, arenas = [...]}]] */
#define CALL(id, ep, x, arenas) \
  "[0, " #id ", 'call', [{endpoint: '" ep "', args: {x: " x "}, arenas: [" arenas "]}]]"

/* The usual request: call `ep` with x = 1 float64 of a one-page arena. */
#define FIRST_FMT CALL(%u, "%s", F64(0, 0, 1), ARENA(0, 4096))
#define FIRST(id) CALL(id, "first", F64(0, 0, 1), ARENA(0, 4096))

/* A valid call on c with a fresh memfd holding a value no other request
 * used: the answer must be that value (a descriptor left over by an
 * earlier request would be taken instead and give another). 0 or -1. */
static int next_call_reads_its_own(rc_t *c) {
  static double value = 1000.25;
  value += 1;
  int fds[1] = {rc_memfd_with(PAGE, value, 0)};
  msg_t m;
  if (fds[0] < 0 || rc_rpcf_fds(c, &m, fds, 1, FIRST_FMT, next_id++, "first") != 1) return -1;
  double got = m.error ? -1 : obj_num(obj_get(m.result, "value"));
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
    fds = stt_proc_fd_count(S.pid);
    if (conns == 1 && arenas == base_arenas && fds == base_fds) return 0;
    stt_sleep_ms(5);
  }
  fprintf(stderr, "   server: %d descriptors (baseline %d), %lld arenas (baseline %lld), "
                  "%lld connections\n",
          fds, base_fds, (long long)arenas, (long long)base_arenas, (long long)conns);
  return -1;
}

/* ------------------------------------------------------------- tests */

TEST(a_valid_argument_reads_the_callers_memory) {
  OPEN_RC(c, S.socket);
  int64_t received = rc_info_int(&M, "counters.fds_received");
  int fds[1] = {rc_memfd_with(PAGE, 6.5, 0)};
  CHECK(fds[0] >= 0);
  msg_t m;
  CHECK(rc_rpcf_fds(&c, &m, fds, 1, FIRST_FMT, 1, "first") == 1);
  CHECK_EQ_INT(m.id, 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  CHECK(obj_num(obj_get(m.result, "value")) == 6.5);
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + 1);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

/* A put whose two arenas are two descriptors of one memfd names one
 * allocation twice: refused, nothing charged (it was charged twice and
 * reported 8192 bytes for a 4096-byte memfd). */
TEST(a_put_naming_one_memfd_twice_is_refused) {
  OPEN_RC(c, S.socket);
  int fd = rc_memfd_with(PAGE, 3, 0);
  CHECK(fd >= 0);
  int fds[2] = {fd, dup(fd)};
  CHECK_RPC_FDS(&c, fds, 2, ST_ERR_INVALID_ARGUMENT, "names the same allocation as arenas[0]",
                "[0, 1, 'put', [{key: 'twice', value: {a: tensor(0, 0, 'float32', [4], [1]), "
                "b: tensor(1, 0, 'float32', [4], [1])}, arenas: ["
                "{fd: 0, bytes: %d, device: 'cpu', backend: 'memfd', id: 1}, "
                "{fd: 1, bytes: %d, device: 'cpu', backend: 'memfd', id: 2}]}]]",
                PAGE, PAGE);
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "twice", "[0, 2, 'get', [{key: 'twice'}]]");
  /* Two memfds are two allocations. */
  int two[2] = {rc_memfd_with(PAGE, 3, 0), rc_memfd_with(PAGE, 4, 0)};
  CHECK_RPC_FDS(&c, two, 2, ST_OK, NULL,
                "[0, 3, 'put', [{key: 'twice', value: {a: tensor(0, 0, 'float32', [4], [1]), "
                "b: tensor(1, 0, 'float32', [4], [1])}, arenas: ["
                "{fd: 0, bytes: %d, device: 'cpu', backend: 'memfd', id: 1}, "
                "{fd: 1, bytes: %d, device: 'cpu', backend: 'memfd', id: 2}]}]]",
                PAGE, PAGE);
  CHECK_RPC(&c, ST_OK, NULL, "[0, 4, 'delete', [{key: 'twice'}]]");
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(arenas_without_their_descriptors_close_the_connection) {
  OPEN_RC(c, S.socket);
  int64_t perr = rc_info_int(&M, "counters.protocol_errors");
  CHECK_RPC(&c, ST_ERR_PROTOCOL, "lists 1 arenas but 0 descriptors", FIRST_FMT, 7, "first");
  CHECK(closed_by_server(&c) == 0);
  rc_close(&c);
  CHECK_EQ_INT(rc_info_int(&M, "counters.protocol_errors"), perr + 1);

  /* params.arenas that is no array: PROTOCOL too */
  CHECK(rc_open(&c, S.socket) == 0);
  int fds[1] = {rc_memfd_with(PAGE, 1, 0)};
  CHECK_RPC_FDS(&c, fds, 1, ST_ERR_PROTOCOL, "must be an array",
                "[0, 8, 'call', [{endpoint: 'first', arenas: 'not an array'}]]");
  CHECK(closed_by_server(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

/* The descriptors a refused request carries. */
enum fd_kind {
  FD_MEMFD,     /* a sealed memfd of one page */
  FD_UNSEALED,  /* the same, unsealed */
  FD_PIPE,      /* the read end of a pipe */
  FD_FILE,      /* a regular file of one page */
  FD_READ_ONLY, /* a read-only descriptor of a sealed memfd */
  FD_TWO,       /* two sealed memfds */
};

/* Makes the descriptors of `kind` into fds[]; their count, or -1. */
static int make_fds(enum fd_kind kind, int *fds) {
  int p[2];
  char path[400];
  switch (kind) {
  case FD_MEMFD:
  case FD_UNSEALED:
    fds[0] = rc_memfd_with(PAGE, 1, kind == FD_UNSEALED);
    return fds[0] >= 0 ? 1 : -1;
  case FD_PIPE:
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    close(p[1]);
    fds[0] = p[0];
    return 1;
  case FD_FILE:
    snprintf(path, sizeof path, "%s/plain.bin", S.dir);
    fds[0] = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    return fds[0] >= 0 && ftruncate(fds[0], PAGE) == 0 ? 1 : -1;
  case FD_READ_ONLY:
    p[0] = rc_memfd_with(PAGE, 1, 0);
    snprintf(path, sizeof path, "/proc/self/fd/%d", p[0]);
    fds[0] = open(path, O_RDONLY | O_CLOEXEC);
    close(p[0]);
    return fds[0] >= 0 ? 1 : -1;
  case FD_TWO:
    fds[0] = rc_memfd_with(PAGE, 1, 0);
    fds[1] = rc_memfd_with(PAGE, 2, 0);
    return 2;
  }
  return -1;
}

/* A request with its descriptors, and the error it must get. */
typedef struct refusal {
  enum fd_kind fds;
  const char *frame;
  int want;
  const char *part;
} refusal_t;

/* Sends each request of the table with its descriptors: each gets its
 * error, the connection stays, and the next call reads its own memory
 * (no descriptor of the refused request is left over). */
static void expect_refusals(const refusal_t *t, size_t n) {
  OPEN_RC(c, S.socket);
  for (size_t i = 0; i < n; i++) {
    int fds[2];
    int nfds = make_fds(t[i].fds, fds);
    CHECK(nfds > 0);
    CHECK_RPC_FDS(&c, fds, nfds, t[i].want, t[i].part, "%s", t[i].frame);
    CHECK(next_call_reads_its_own(&c) == 0);
  }
  rc_close(&c);
  char path[400];
  snprintf(path, sizeof path, "%s/plain.bin", S.dir);
  unlink(path);
  CHECK(back_to_baseline() == 0);
}

static const refusal_t not_sealed_writable_memfds[] = {
    {FD_UNSEALED, FIRST(10), ST_ERR_INVALID_ARGUMENT, "F_SEAL_SHRINK"},
    {FD_PIPE, FIRST(11), ST_ERR_INVALID_ARGUMENT, "not a memory file"},
    {FD_FILE, FIRST(12), ST_ERR_INVALID_ARGUMENT, "F_SEAL_SHRINK"},
    {FD_READ_ONLY, FIRST(13), ST_ERR_INVALID_ARGUMENT, "read-write failed"},
    /* an arena shorter than it claims */
    {FD_MEMFD, CALL(14, "first", F64(0, 0, 1), ARENA(0, 16384)), ST_ERR_INVALID_ARGUMENT,
     "the arena says 16384 bytes"},
};

TEST(descriptors_that_are_not_sealed_writable_memfds_are_refused) {
  expect_refusals(not_sealed_writable_memfds,
                  sizeof not_sealed_writable_memfds / sizeof not_sealed_writable_memfds[0]);
}

#define LEGACY_ARENA \
  "{bytes: 4096, device: 'cuda', backend: 'legacy', id: 4242, " \
  "uuid: 'GPU-00000000-0000-0000-0000-000000000000', ipc_handle: bin(64, 1), " \
  "device_index: 0, storage_bytes: 4096}"

static const refusal_t mismatched_tensors_and_arenas[] = {
    /* past the end: too many elements, then an offset too far */
    {FD_MEMFD, CALL(20, "first", F64(0, 0, 513), ARENA(0, 4096)), ST_ERR_INVALID_ARGUMENT,
     "past the end of arena 0"},
    {FD_MEMFD, CALL(21, "first", F64(0, 4096, 1), ARENA(0, 4096)), ST_ERR_INVALID_ARGUMENT,
     "past the end of arena 0"},
    /* a tensor naming an arena the request does not list */
    {FD_MEMFD, CALL(22, "first", F64(1, 0, 1), ARENA(0, 4096)), ST_ERR_INVALID_ARGUMENT,
     "arena 1 is not in this request"},
    /* backend "legacy" (complete with its own fields) */
    {FD_MEMFD, CALL(23, "first", F64(0, 0, 1), LEGACY_ARENA), ST_ERR_INVALID_ARGUMENT,
     "backend \"legacy\" cannot carry"},
    /* fd indexes out of order: two arenas, two descriptors */
    {FD_TWO, CALL(24, "first", F64(0, 0, 1), ARENA(1, 4096) ", " ARENA(0, 4096)),
     ST_ERR_INVALID_ARGUMENT, "arenas[0]: fd must be 0"},
    /* a module as an argument: {tensors = [["w", <tensor>]], metadata = {}} */
    {FD_MEMFD,
     "[0, 30, 'call', [{endpoint: 'anyarg', args: {v: ext(2, {tensors: [['w', " F64(0, 0, 1)
     "]], metadata: {}})}, arenas: [" ARENA(0, 4096) "]}]]",
     ST_ERR_INVALID_ARGUMENT, "only tensors may be passed"},
};

TEST(tensors_and_arena_lists_that_do_not_match_are_refused) {
  expect_refusals(mismatched_tensors_and_arenas,
                  sizeof mismatched_tensors_and_arenas / sizeof mismatched_tensors_and_arenas[0]);
}

static const refusal_t methods_without_tensor_arguments[] = {
    /* ping with a tensor argument in arenas: its only parameter is none */
    {FD_MEMFD, "[0, 40, 'ping', [{arenas: [" ARENA(0, 4096) "]}]]", ST_ERR_INVALID_ARGUMENT,
     "unknown parameter 'arenas'"},
    /* invalidate_call binds args like call but takes no arenas */
    {FD_MEMFD,
     "[0, 41, 'invalidate_call', [{endpoint: 'anyarg', args: {v: " F64(0, 0, 1)
     "}, arenas: [" ARENA(0, 4096) "]}]]",
     ST_ERR_INVALID_ARGUMENT, "unknown parameter 'arenas'"},
    /* an unknown method, and a call of an unknown endpoint */
    {FD_MEMFD, "[0, 42, 'frobnicate', [{arenas: [" ARENA(0, 4096) "]}]]", ST_ERR_UNKNOWN_METHOD,
     NULL},
    {FD_MEMFD, CALL(43, "nope", F64(0, 0, 1), ARENA(0, 4096)), ST_ERR_UNKNOWN_ENDPOINT, NULL},
};

TEST(methods_without_tensor_arguments_consume_the_descriptors) {
  expect_refusals(methods_without_tensor_arguments,
                  sizeof methods_without_tensor_arguments /
                      sizeof methods_without_tensor_arguments[0]);
}

/* Sends len bytes of buf with `n` copies of `fd`. 0 or -1. */
static int send_copies(rc_t *c, const void *buf, size_t len, int fd, int n) {
  int fds[ST_MAX_FDS_PER_MESSAGE];
  for (int i = 0; i < n; i++) fds[i] = fd;
  return stt_send_fds(c->fd, buf, len, fds, n);
}

TEST(descriptors_no_request_lists_are_closed) {
  OPEN_RC(c, S.socket);
  int64_t received = rc_info_int(&M, "counters.fds_received");
  int fd = rc_memfd_with(PAGE, 1, 0);
  CHECK(fd >= 0);
  /* 3 x 253 with pings, which list none: each batch is closed once its
   * ping is handled, so none ever piles up */
  for (uint32_t i = 0; i < 3; i++) {
    mpbuf_t r;
    mpbuf_init(&r);
    stt_pack(&r.pk, "[0, %u, 'ping', []]", 50 + i);
    CHECK(send_copies(&c, r.sb.data, r.sb.size, fd, ST_MAX_FDS_PER_MESSAGE) == 0);
    mpbuf_free(&r);
    msg_t m;
    CHECK(rc_next(&c, &m, 10000) == 1);
    CHECK_EQ_INT(m.id, 50 + i);
    CHECK(m.error == NULL);
    CHECK_STR_EQ(obj_str(m.result), "pong");
    msg_free(&m);
    CHECK(proc_fd_count_reaches(S.pid, base_fds + 1, 0) == 0);
  }
  close(fd);
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + 3 * ST_MAX_FDS_PER_MESSAGE);
  /* a call that lists one arena but comes with two: it takes the first,
   * the second is closed; the next call reads its own memory */
  int two[2] = {rc_memfd_with(PAGE, 53, 0), rc_memfd_with(PAGE, -1, 0)};
  msg_t m;
  CHECK(rc_rpcf_fds(&c, &m, two, 2, FIRST_FMT, 53, "first") == 1);
  CHECK(m.error == NULL && obj_num(obj_get(m.result, "value")) == 53);
  msg_free(&m);
  CHECK(next_call_reads_its_own(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

/* Polls (5 s at most) until the server holds exactly n descriptors. */
static int server_holds(int n) {
  if (proc_fd_count_reaches(S.pid, n, 1) != 0) return -1;
  return proc_fd_count_reaches(S.pid, n, 0);
}

TEST(descriptors_no_request_can_claim_are_closed_on_arrival) {
  OPEN_RC(c, S.socket);
  int fd = rc_memfd_with(PAGE, 55, 0);
  CHECK(fd >= 0);
  /* a request that stays incomplete: the descriptors that came with its
   * first byte wait for it; those that come later cannot be its own (a
   * request's descriptors ride on its first byte) and are closed at once */
  mpbuf_t r;
  mpbuf_init(&r);
  stt_pack(&r.pk, FIRST_FMT, 55, "first");
  CHECK(r.sb.size > 3);
  CHECK(send_copies(&c, r.sb.data, 1, fd, ST_MAX_FDS_PER_MESSAGE) == 0);
  CHECK(rc_wait_drained(&c, 5000) == 0);
  CHECK(server_holds(base_fds + 1 + ST_MAX_FDS_PER_MESSAGE) == 0);
  for (int i = 0; i < 3; i++) {
    CHECK(send_copies(&c, r.sb.data + 1 + i, 1, fd, ST_MAX_FDS_PER_MESSAGE) == 0);
    CHECK(rc_wait_drained(&c, 5000) == 0);
    CHECK(server_holds(base_fds + 1 + ST_MAX_FDS_PER_MESSAGE) == 0);
  }
  close(fd);
  /* the rest of the request: it takes the first descriptor of its own */
  CHECK(rc_send(&c, r.sb.data + 4, r.sb.size - 4) == 0);
  mpbuf_free(&r);
  msg_t m;
  CHECK(rc_next(&c, &m, 10000) == 1);
  CHECK(m.error == NULL && obj_num(obj_get(m.result, "value")) == 55);
  msg_free(&m);
  CHECK(server_holds(base_fds + 1) == 0);
  CHECK(next_call_reads_its_own(&c) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

TEST(descriptors_are_closed_when_the_input_ends) {
  /* a wait keeps the connection open after the client finished sending;
   * the descriptors it sent with the first byte of a request it never
   * completed are closed at once, not when the wait ends */
  OPEN_RC(c, S.socket);
  uint64_t task = rk_submit(&c, "slow_first_plain", "s", 30);
  CHECK(task > 0);
  CHECK(rc_sendf(&c, "[0, 9, 'wait', [{task_id: %llu, timeout: 60}]]",
                 (unsigned long long)task) == 0);
  int fd = rc_memfd_with(PAGE, 1, 0);
  CHECK(fd >= 0);
  mpbuf_t r;
  mpbuf_init(&r);
  stt_pack(&r.pk, FIRST_FMT, 56, "first");
  CHECK(send_copies(&c, r.sb.data, 1, fd, ST_MAX_FDS_PER_MESSAGE) == 0);
  mpbuf_free(&r);
  close(fd);
  CHECK(rc_wait_drained(&c, 5000) == 0);
  CHECK(server_holds(base_fds + 1 + ST_MAX_FDS_PER_MESSAGE) == 0);
  CHECK(shutdown(c.fd, SHUT_WR) == 0);
  CHECK(server_holds(base_fds + 1) == 0);
  CHECK_EQ_INT(rc_info_int(&M, "connections"), 2);
  CHECK_RPC(&M, ST_OK, NULL, "[0, 10, 'cancel', [{task_id: %llu}]]", (unsigned long long)task);
  CHECK(rk_wait_status(&M, task, "cancelled", 10000) == 0);
  rc_close(&c);
  CHECK(back_to_baseline() == 0);
}

/* Sends call `ep` (x = 1 float64 of a one-page memfd holding `value`)
 * without reading the reply. 0 or -1. */
static int send_first(rc_t *c, uint32_t id, const char *ep, double value) {
  mpbuf_t r;
  mpbuf_init(&r);
  stt_pack(&r.pk, FIRST_FMT, id, ep);
  int fds[1] = {rc_memfd_with(PAGE, value, 0)};
  int rc = fds[0] >= 0 ? stt_send_fds(c->fd, r.sb.data, r.sb.size, fds, 1) : -1;
  mpbuf_free(&r);
  if (fds[0] >= 0) close(fds[0]);
  return rc;
}

TEST(a_client_gone_before_its_reply_leaks_nothing) {
  /* gone while the call is queued or running: twice, the second time
   * only once the body runs */
  for (int round = 0; round < 2; round++) {
    OPEN_RC(c, S.socket);
    CHECK(send_first(&c, 60, "slow_first", 3) == 0);
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
  mpbuf_t all;
  mpbuf_init(&all);
  size_t start[NPIPE + 1];
  int fds[NPIPE];
  for (int i = 0; i < NPIPE; i++) {
    start[i] = all.sb.size;
    stt_pack(&all.pk, FIRST_FMT, 200 + (uint32_t)i, "first");
    fds[i] = rc_memfd_with(PAGE, 100.0 + i, 0);
    if (fds[i] < 0) return -1;
  }
  start[NPIPE] = all.sb.size;
  int rc = 0;
  if (mode == 1) {
    rc = stt_send_fds(c.fd, all.sb.data, all.sb.size, fds, NPIPE);
  } else if (mode == 0) {
    for (int i = 0; i < NPIPE && rc == 0; i++)
      rc = stt_send_fds(c.fd, all.sb.data + start[i], start[i + 1] - start[i], &fds[i], 1);
  } else {
    /* piece i: the second half of request i-1 and the first half of i,
     * with descriptor i */
    size_t from = 0;
    for (int i = 0; i <= NPIPE && rc == 0; i++) {
      size_t to = i < NPIPE ? start[i] + (start[i + 1] - start[i]) / 2 : all.sb.size;
      rc = stt_send_fds(c.fd, all.sb.data + from, to - from, i < NPIPE ? &fds[i] : NULL,
                         i < NPIPE ? 1 : 0);
      from = to;
    }
  }
  for (int i = 0; i < NPIPE; i++) close(fds[i]);
  mpbuf_free(&all);
  int seen[NPIPE] = {0};
  for (int k = 0; k < NPIPE && rc == 0; k++) {
    msg_t m;
    if (rc_next(&c, &m, 10000) != 1) {
      rc = -1;
      break;
    }
    int i = (int)m.id - 200;
    double v = m.error ? -1 : obj_num(obj_get(m.result, "value"));
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

TEST(a_connection_reset_queues_no_stale_descriptor) {
  /* A client that closes with a reply unread resets the connection: the
   * server's read fails with ECONNRESET. A failed read returns no control
   * data; the descriptors of an earlier read (still in the stack buffer)
   * must not be taken for new ones, queued and later closed under
   * whoever owns those numbers by then. B's calls put descriptors
   * through the read path right before each reset. */
  OPEN_RC(b, S.socket);
  int64_t received = rc_info_int(&M, "counters.fds_received");
  enum { ROUNDS = 40 };
  for (int i = 0; i < ROUNDS; i++) {
    CHECK(next_call_reads_its_own(&b) == 0);
    OPEN_RC(a, S.socket);
    CHECK(rc_sendf(&a, "[0, 1, 'ping', []]") == 0);
    struct pollfd p = {.fd = a.fd, .events = POLLIN};
    CHECK(poll(&p, 1, 5000) == 1);
    rc_close(&a);
    CHECK(rc_wait_info(&M, "connections", 2, 5000) == 0);
  }
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_received"), received + ROUNDS);
  CHECK(next_call_reads_its_own(&b) == 0);
  rc_close(&b);
  CHECK(back_to_baseline() == 0);
}

TEST(no_descriptor_or_arena_is_left_behind) {
  CHECK(back_to_baseline() == 0);
  fprintf(stderr, "   server: %d descriptors, %lld arenas\n", base_fds, (long long)base_arenas);
}

int main(void) {
  stt_server_setup(&S, "workers = 2,",
                   (const stt_endpoint_t[]){{"first.lua", EP_FIRST},
                                            {"slow_first.lua", EP_SLOW},
                                            {"anyarg.lua", EP_ANY},
                                            {"slow_first_plain.lua", EP_SLOW_PLAIN},
                                            {NULL, NULL}});
  rc_open_or_exit(&M, S.socket);
  /* Warm both workers (their Lua states) before the baselines: two slow
   * calls at once take one worker each. */
  rc_t w;
  rc_open(&w, S.socket);
  for (uint32_t i = 0; i < 2; i++) send_first(&w, 90 + i, "slow_first", 1);
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
  while (rc_info_int(&M, "connections") != 1 && stt_now_ms() < end) stt_sleep_ms(5);
  base_fds = stt_proc_fd_count(S.pid);
  base_arenas = rc_info_int(&M, "arenas.count");

  RUN(a_valid_argument_reads_the_callers_memory);
  RUN(arenas_without_their_descriptors_close_the_connection);
  RUN(descriptors_that_are_not_sealed_writable_memfds_are_refused);
  RUN(tensors_and_arena_lists_that_do_not_match_are_refused);
  RUN(methods_without_tensor_arguments_consume_the_descriptors);
  RUN(descriptors_no_request_lists_are_closed);
  RUN(descriptors_no_request_can_claim_are_closed_on_arrival);
  RUN(descriptors_are_closed_when_the_input_ends);
  RUN(a_client_gone_before_its_reply_leaks_nothing);
  RUN(pipelined_requests_each_read_their_own_memory);
  RUN(a_connection_reset_queues_no_stale_descriptor);
  RUN(a_put_naming_one_memfd_twice_is_refused);
  RUN(no_descriptor_or_arena_is_left_behind);
  rc_close(&M);
  return stt_server_finish(&S);
}

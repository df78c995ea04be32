/* libstclient against a scripted server: the replies a correct stserver
 * never sends, and the cases it cannot produce yet. Refusals at connect
 * (AUTH, version), descriptor bookkeeping (order, missing descriptors,
 * leaks), checks before a tensor is exposed (extent, file size, seals),
 * the open-cache reusing a mapping for an allocation that arrives twice,
 * server errors, timeouts and a server that stops mid-reply. */
#include <math.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"

static fake_server_t fs;

/* The descriptors a scripted reply carries: memfds of `bytes` holding
 * `data`, sealed unless `unsealed`; SHARED: a dup of the one allocation
 * that SC_SAME_ARENA_TWICE sends again and again. */
typedef struct fd_spec {
  size_t bytes;
  const float *data;
  size_t len;
  int unsealed;
} fd_spec_t;
#define SHARED {0, NULL, 0, 0}

static const float kData[8] = {0, 1, 2, 3, 4, 5, 6, 7};
static const float kOther[4] = {9, 9, 9, 9};
static const float kTens[4] = {10, 20, 30, 40};
static int shared_fd = -1;

/* Reply pieces: a float32 vector of 4 at `off` of arena `a`, and arena
 * entries as the server packs them (a "cuda" one names a UUID no device
 * has). */
#define T4(a, off) "tensor(" #a ", " #off ", 'float32', [4], [1])"
#define CPU_ARENA(fd, bytes, id) \
  "{fd: " #fd ", bytes: " #bytes ", device: 'cpu', backend: 'memfd', id: " #id "}"
#define CUDA_ARENA(fd, bytes, id)                                                        \
  "{fd: " #fd ", bytes: " #bytes ", device: 'cuda', "                                   \
  "uuid: 'GPU-00000000-0000-0000-0000-000000000000', backend: 'vmm', id: " #id "}"

/* What the scripted "call" answers; chosen per test. */
enum scenario {
  SC_SAME_ARENA_TWICE, SC_SWAPPED_FDS, SC_OUT_OF_RANGE, SC_FILE_TOO_SMALL, SC_UNSEALED,
  SC_MISSING_FD, SC_CUDA, SC_MODULE, SC_EMPTY_ARENA, SC_STRIDED, SC_SAME_ID_OTHER_FILE,
  SC_WRONG_ID, SC_CUT_OFF, SC_SILENT, SC_ERROR_BY_NAME, SC_ERROR_UNKNOWN, SC_ERROR_NUL_NAME,
  SC_NOTIFY_FIRST,
};

/* The replies that are a result with descriptors, by scenario. */
static const struct reply {
  const char *result; /* stt_pack text */
  int nfds;
  fd_spec_t fds[2];
} replies[] = {
    /* Two arena entries naming one allocation (id 7), two descriptors;
     * every call sends the same allocation again, as a cache would. */
    [SC_SAME_ARENA_TWICE] = {"{value: {a: " T4(0, 0) ", b: " T4(1, 16) "}, arenas: ["
                             CPU_ARENA(0, 4096, 7) ", " CPU_ARENA(1, 4096, 7) "]}",
                             2, {SHARED, SHARED}},
    /* Arena 0 uses descriptor 1 and arena 1 descriptor 0. */
    [SC_SWAPPED_FDS] = {"{value: [" T4(0, 0) ", " T4(1, 0) "], arenas: ["
                        CPU_ARENA(1, 64, 100) ", " CPU_ARENA(0, 64, 101) "]}",
                        2, {{64, kTens, sizeof kTens, 0}, {64, kData, sizeof kData, 0}}},
    [SC_OUT_OF_RANGE] = {"{value: tensor(0, 0, 'float32', [9], [1]), arenas: ["
                         CPU_ARENA(0, 32, 202) "]}",
                         1, {{32, kData, sizeof kData, 0}}},
    [SC_FILE_TOO_SMALL] = {"{value: " T4(0, 0) ", arenas: [" CPU_ARENA(0, 1048576, 203) "]}",
                           1, {{32, kData, sizeof kData, 0}}},
    [SC_UNSEALED] = {"{value: " T4(0, 0) ", arenas: [" CPU_ARENA(0, 32, 204) "]}",
                     1, {{32, kData, sizeof kData, 1}}},
    [SC_MISSING_FD] = {"{value: " T4(0, 0) ", arenas: [" CPU_ARENA(0, 64, 400) "]}", 0, {SHARED}},
    [SC_CUDA] = {"{value: " T4(0, 0) ", arenas: [" CUDA_ARENA(0, 64, 500) "]}",
                 1, {{64, NULL, 0, 0}}},
    [SC_MODULE] = {"{value: {m: ext(2, {tensors: [['weight', tensor(0, 0, 'float32', [2, 2], "
                   "[2, 1])], ['bias', tensor(0, 16, 'float32', [2], [1])]], "
                   "metadata: {format: 'pt'}}), n: 3}, arenas: [" CPU_ARENA(0, 4096, 600) "]}",
                   1, {{4096, kData, sizeof kData, 0}}},
    [SC_EMPTY_ARENA] = {"{value: tensor(0, 0, 'float32', [0], [1]), arenas: ["
                        CPU_ARENA(0, 0, 213) "]}",
                        1, {{4096, kData, sizeof kData, 0}}},
    /* A 2x2 view with strides {1, 2} (a transpose) at offset 4 bytes. */
    [SC_STRIDED] = {"{value: tensor(0, 4, 'float32', [2, 2], [1, 2]), arenas: ["
                    CPU_ARENA(0, 64, 300) "]}",
                    1, {{64, kData, sizeof kData, 0}}},
    /* Arena id 7 again, but a new file: not the cached allocation. */
    [SC_SAME_ID_OTHER_FILE] = {"{value: " T4(0, 0) ", arenas: [" CPU_ARENA(0, 4096, 7) "]}",
                               1, {{4096, kOther, sizeof kOther, 0}}},
};

static enum scenario scenario;

/* The replies that are not a plain result: 1 closes the connection. */
static int odd_reply(int conn, uint32_t id) {
  switch (scenario) {
  case SC_WRONG_ID:
    return fake_replyf(conn, id + 5, NULL, 0, "'x'");
  case SC_CUT_OFF: {
    /* Half a reply, then the server goes away. */
    mpbuf_t b;
    mpbuf_init(&b);
    stt_pack(&b.pk, "[1, %u, nil, {value: 'a long string that will never be finished', "
                    "arenas: []}]", id);
    stt_send_all(conn, b.sb.data, b.sb.size / 2);
    mpbuf_free(&b);
    return 1;
  }
  case SC_SILENT: {
    /* Never answers; waits until the client hangs up. */
    char b[64];
    while (recv(conn, b, sizeof b, 0) > 0) {
    }
    return 1;
  }
  case SC_ERROR_BY_NAME:
    return fake_error(conn, id, 999, "BUSY", "too many requests in flight");
  case SC_ERROR_UNKNOWN:
  case SC_ERROR_NUL_NAME: {
    /* An error no client can read: no known code, and a name that is none
     * (or only looks like one up to a NUL byte). */
    mpbuf_t b;
    mpbuf_init(&b);
    stt_pack(&b.pk, "[1, %u, {code: 999, name: '%s', message: 'odd'}, nil]", id,
             scenario == SC_ERROR_UNKNOWN ? "NOPE" : "BUSY\\0x");
    stt_send_all(conn, b.sb.data, b.sb.size);
    mpbuf_free(&b);
    return 0;
  }
  default: /* SC_NOTIFY_FIRST */ {
    mpbuf_t n;
    mpbuf_init(&n);
    stt_pack(&n.pk, "[2, 'log', []]");
    stt_send_all(conn, n.sb.data, n.sb.size);
    mpbuf_free(&n);
    return fake_replyf(conn, id, NULL, 0, "{value: 42, arenas: []}");
  }
  }
}

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  (void)params;
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  if (scenario >= sizeof replies / sizeof replies[0]) return odd_reply(conn, id);
  const struct reply *r = &replies[scenario];
  int fds[2] = {-1, -1};
  for (int i = 0; i < r->nfds; i++) {
    const fd_spec_t *d = &r->fds[i];
    if (d->bytes == 0 && shared_fd < 0) shared_fd = fake_memfd(4096, kData, sizeof kData, 1);
    fds[i] = d->bytes ? fake_memfd(d->bytes, d->data, d->len, !d->unsealed) : dup(shared_fd);
  }
  int rc = fake_replyf(conn, id, fds, r->nfds, "%s", r->result);
  for (int i = 0; i < r->nfds; i++) close(fds[i]);
  return rc;
}

static int call_scenario(st_client_t *c, enum scenario s, st_result_t **r) {
  scenario = s;
  return st_client_call(c, "x", NULL, r);
}

TEST(hello_fields) {
  OPEN_CLIENT(c, fs.path);
  char sid[64];
  snprintf(sid, sizeof sid, "fake-%d", (int)getpid());
  CHECK_STR_EQ(st_client_server_id(c), sid);
  CHECK_STR_EQ(st_client_server_version(c), "0.0.0-fake");
  CHECK_EQ_INT(st_client_server_pid(c), getpid());
  CHECK_STR_EQ(st_client_error(c), "");
  CHECK_STR_EQ(st_client_error_name(c), "");
  st_client_close(c);
}

TEST(open_cache_maps_one_allocation_once) {
  OPEN_CLIENT(c, fs.path);
  size_t mapped0, mapped;
  uint64_t reused0, reused;
  st_open_cache_stats(&mapped0, &reused0);
  st_result_t *r1 = NULL, *r2 = NULL;
  CHECK_ERR(call_scenario(c, SC_SAME_ARENA_TWICE, &r1), ST_OK);
  st_open_cache_stats(&mapped, &reused);
  CHECK_EQ_INT(mapped, mapped0 + 1);
  CHECK_EQ_INT(reused, reused0 + 1);
  const st_tensor_t *a = st_result_find(r1, "a"), *b = st_result_find(r1, "b");
  CHECK(a && b);
  CHECK((char *)b->data == (char *)a->data + 16);
  CHECK_EQ_INT(st_tensor_get(b, 0), 4);
  /* A second result naming the same allocation shares the mapping. */
  CHECK_ERR(call_scenario(c, SC_SAME_ARENA_TWICE, &r2), ST_OK);
  st_open_cache_stats(&mapped, &reused);
  CHECK_EQ_INT(mapped, mapped0 + 1);
  CHECK_EQ_INT(reused, reused0 + 3);
  CHECK(st_result_find(r2, "a")->data == a->data);
  /* The same key naming another file is another allocation. */
  st_result_t *r3 = NULL;
  CHECK_ERR(call_scenario(c, SC_SAME_ID_OTHER_FILE, &r3), ST_OK);
  st_open_cache_stats(&mapped, &reused);
  CHECK_EQ_INT(mapped, mapped0 + 2);
  CHECK_EQ_INT(reused, reused0 + 3);
  CHECK_EQ_INT(st_tensor_get(st_result_find(r3, ""), 0), 9);
  CHECK_EQ_INT(st_tensor_get(a, 0), 0);
  st_result_free(r3);
  st_result_free(r1);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0 + 1); /* r2 still uses it */
  CHECK_EQ_INT(st_tensor_get(st_result_find(r2, "a"), 3), 3);
  st_result_free(r2);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0);
  st_client_close(c);
}

TEST(descriptors_follow_the_fd_index) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_SWAPPED_FDS, &r), ST_OK);
  CHECK_EQ_INT(st_result_tensor_count(r), 2);
  CHECK_STR_EQ(st_result_tensor(r, 0)->name, "0");
  CHECK_STR_EQ(st_result_tensor(r, 1)->name, "1");
  CHECK_EQ_INT(st_tensor_get(st_result_tensor(r, 0), 1), 1);  /* arena 0 = fd 1 = kData */
  CHECK_EQ_INT(st_tensor_get(st_result_tensor(r, 1), 1), 20); /* arena 1 = fd 0 */
  st_result_free(r);
  st_client_close(c);
}

TEST(strided_view) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_STRIDED, &r), ST_OK);
  const st_tensor_t *t = st_result_find(r, "");
  CHECK(t);
  CHECK_EQ_INT(t->numel, 4);
  CHECK_EQ_INT(t->nbytes, 16);
  /* data starts at element 1: [[1, 3], [2, 4]] row-major. */
  CHECK_EQ_INT(st_tensor_get(t, 0), 1);
  CHECK_EQ_INT(st_tensor_get(t, 1), 3);
  CHECK_EQ_INT(st_tensor_get(t, 2), 2);
  CHECK_EQ_INT(st_tensor_get(t, 3), 4);
  CHECK(isnan(st_tensor_get(t, 4)));
  CHECK(isnan(st_tensor_get(t, -1)));
  st_result_free(r);
  st_client_close(c);
}

/* Replies whose descriptors must not be exposed: the call fails with the
 * error and the message part, and the connection stays. */
static const struct refusal {
  enum scenario sc;
  int want;
  const char *part;
} refusals[] = {
    {SC_OUT_OF_RANGE, ST_ERR_PROTOCOL, "reaches beyond its arena"},
    {SC_FILE_TOO_SMALL, ST_ERR_PROTOCOL, "the file has 32"},
    {SC_UNSEALED, ST_ERR_PROTOCOL, "not sealed"},
    {SC_CUDA, ST_ERR_CAPABILITY, "CUDA"},
};

TEST(bad_descriptors_are_refused_and_the_connection_stays) {
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  int fds0 = fake_count_fds();
  OPEN_CLIENT(c, fs.path);
  size_t mapped0, mapped;
  st_open_cache_stats(&mapped0, NULL);
  for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
    st_result_t *r = NULL;
    CHECK_RC(call_scenario(c, refusals[i].sc, &r), refusals[i].want, c);
    CHECK(r == NULL);
    CHECK_CONTAINS(st_client_error(c), refusals[i].part);
    CHECK_STR_EQ(st_client_error_name(c), st_err_name(refusals[i].want));
  }
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0);
  double rtt;
  CHECK_RC(st_client_ping(c, &rtt), ST_OK, c);
  CHECK_STR_EQ(st_client_error(c), "");
  st_client_close(c);
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  CHECK_EQ_INT(fake_count_fds(), fds0); /* every descriptor was closed */
}

TEST(empty_arena) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_EMPTY_ARENA, &r), ST_OK);
  const st_tensor_t *t = st_result_find(r, "");
  CHECK(t && t->numel == 0 && t->nbytes == 0);
  CHECK(isnan(st_tensor_get(t, 0)));
  st_result_free(r);
  st_client_close(c);
}

TEST(module_value) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_MODULE, &r), ST_OK);
  CHECK_EQ_INT(st_result_tensor_count(r), 2);
  const st_tensor_t *w = st_result_find(r, "m.weight"), *b = st_result_find(r, "m.bias");
  CHECK(w && b);
  CHECK_EQ_INT(w->ndim, 2);
  CHECK_EQ_INT(st_tensor_get(w, 3), 3);
  CHECK_EQ_INT(st_tensor_get(b, 1), 5);
  const st_value_t *m = st_value_get(st_result_value(r), "m");
  CHECK(m && m->kind == ST_VALUE_MODULE && m->as.module.len == 2);
  CHECK(m->as.module.tensors[0] == w);
  const st_value_t *fmt = st_value_get(m->as.module.metadata, "format");
  CHECK(fmt && fmt->kind == ST_VALUE_STRING);
  CHECK_STR_EQ(fmt->as.str.ptr, "pt");
  char *js = st_value_json(st_result_value(r), 0);
  CHECK_CONTAINS(js, "\"m\":{\"module\":{\"tensors\":[{\"name\":\"m.weight\",\"dtype\":\"float32\","
                     "\"shape\":[2,2],\"strides\":[2,1],\"device\":\"cpu\",\"nbytes\":16}");
  CHECK_CONTAINS(js, "\"metadata\":{\"format\":\"pt\"}}},\"n\":3}");
  free(js);
  st_result_free(r);
  st_client_close(c);
}

TEST(notifications_are_skipped) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_NOTIFY_FIRST, &r), ST_OK);
  CHECK_EQ_INT(st_result_value(r)->kind, ST_VALUE_INT);
  CHECK_EQ_INT(st_result_value(r)->as.integer, 42);
  st_result_free(r);
  st_client_close(c);
}

TEST(server_error_by_name) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_ERROR_BY_NAME, &r), ST_ERR_BUSY);
  CHECK_STR_EQ(st_client_error_name(c), "BUSY");
  CHECK_STR_EQ(st_client_error(c), "too many requests in flight");
  /* Unknown methods keep the connection. */
  CHECK_RC(st_client_rpc(c, "nope", NULL, &r), ST_ERR_UNKNOWN_METHOD, c);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

/* A server's error that names no known code is a PROTOCOL error of the
 * reply, not an INTERNAL one of the client. */
TEST(unreadable_server_errors_are_protocol_errors) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_ERROR_UNKNOWN, &r), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(st_client_error(c), "no known code or name");
  CHECK_ERR(call_scenario(c, SC_ERROR_NUL_NAME, &r), ST_ERR_PROTOCOL);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

TEST(stream_errors_close_the_connection) {
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  int fds0 = fake_count_fds();
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_ERR(call_scenario(c, SC_MISSING_FD, &r), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(st_client_error(c), "names 1 arenas but carries 0 descriptors");
  CHECK_RC(st_client_ping(c, NULL), ST_ERR_IO, c);
  CHECK_CONTAINS(st_client_error(c), "the connection is closed");
  st_client_close(c);

  c = stt_client_open(fs.path);
  CHECK(c);
  CHECK_ERR(call_scenario(c, SC_WRONG_ID, &r), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(st_client_error(c), "answered request");
  st_client_close(c);
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  CHECK_EQ_INT(fake_count_fds(), fds0);
}

TEST(server_gone_mid_reply) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  double t0 = stt_now_ms();
  CHECK_ERR(call_scenario(c, SC_CUT_OFF, &r), ST_ERR_IO);
  CHECK(stt_now_ms() - t0 < 2000);
  CHECK_STR_EQ(st_client_error(c), "connection closed by the server");
  CHECK_STR_EQ(st_client_error_name(c), "IO");
  CHECK_RC(st_client_ping(c, NULL), ST_ERR_IO, c);
  st_client_close(c);
}

TEST(timeout) {
  OPEN_CLIENT(c, fs.path);
  st_client_set_timeout(c, 200);
  st_result_t *r = NULL;
  double t0 = stt_now_ms();
  CHECK_ERR(call_scenario(c, SC_SILENT, &r), ST_ERR_TIMEOUT);
  double took = stt_now_ms() - t0;
  CHECK(took >= 190 && took < 1000);
  CHECK_STR_EQ(st_client_error_name(c), "TIMEOUT");
  CHECK_CONTAINS(st_client_error(c), "200 ms");
  CHECK_RC(st_client_ping(c, NULL), ST_ERR_IO, c); /* closed: the reply would be out of step */
  st_client_close(c);
}

/* --- refusals at connect --------------------------------------------- */

static int refuse_auth(fake_server_t *f, int conn) {
  (void)f;
  fake_error(conn, 0, 10, "AUTH", "uid 4242 is not allowed to connect");
  return 1;
}

static int old_hello(fake_server_t *f, int conn, uint32_t id, const char *method,
                     const msgpack_object *params) {
  (void)f;
  (void)params;
  if (strcmp(method, "hello") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  return fake_hello(conn, id, 0);
}

static int newer_client(fake_server_t *f, int conn, uint32_t id, const char *method,
                        const msgpack_object *params) {
  (void)f;
  (void)params;
  (void)method;
  return fake_error(conn, id, 1, "PROTOCOL", "client protocol 1 is newer than the server's");
}

TEST(connect_refusals) {
  fake_server_t f2 = {.on_accept = refuse_auth};
  fake_start(&f2);
  st_client_t *c = (st_client_t *)1;
  char err[256] = "";
  CHECK_ERR_MSG(st_client_connect(f2.path, &c, err, sizeof err), ST_ERR_AUTH, err);
  CHECK(c == NULL);
  CHECK_CONTAINS(err, "uid 4242 is not allowed");
  fake_stop(&f2);

  fake_server_t f3 = {.on_request = old_hello, .hello_custom = 1};
  fake_start(&f3);
  CHECK_ERR_MSG(st_client_connect(f3.path, &c, err, sizeof err), ST_ERR_PROTOCOL, err);
  CHECK_CONTAINS(err, "the server speaks protocol 0, this client needs 1");
  fake_stop(&f3);

  fake_server_t f4 = {.on_request = newer_client, .hello_custom = 1};
  fake_start(&f4);
  CHECK_ERR_MSG(st_client_connect(f4.path, &c, err, sizeof err), ST_ERR_PROTOCOL, err);
  CHECK_CONTAINS(err, "newer than the server");
  fake_stop(&f4);
}

TEST(connect_missing_socket) {
  st_client_t *c = (st_client_t *)1;
  char err[256] = "";
  double t0 = stt_now_ms();
  CHECK_ERR_MSG(st_client_connect("/nonexistent-dir/st-0.sock", &c, err, sizeof err),
                ST_ERR_IO, err);
  CHECK(stt_now_ms() - t0 < 100);
  CHECK(c == NULL);
  CHECK_CONTAINS(err, "cannot connect to /nonexistent-dir/st-0.sock: no server is listening");
  CHECK_CONTAINS(err, "No such file or directory");
  char longp[300];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  CHECK_ERR_MSG(st_client_connect(longp, &c, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_ERR_MSG(st_client_connect_device(longp, 0, &c, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
}

TEST(null_arguments) {
  st_result_t *r = (st_result_t *)1;
  CHECK_ERR(st_client_call(NULL, "x", NULL, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK(r == NULL);
  st_client_close(NULL);
  st_result_free(NULL);
  CHECK_STR_EQ(st_client_error(NULL), "");
  CHECK(st_result_value(NULL) == NULL);
  CHECK_EQ_INT(st_result_tensor_count(NULL), 0);
  CHECK(st_value_get(NULL, "x") == NULL);
  CHECK(isnan(st_tensor_get(NULL, 0)));
  OPEN_CLIENT(c, fs.path);
  CHECK_RC(st_client_call(c, "", NULL, &r), ST_ERR_INVALID_ARGUMENT, c);
  CHECK_RC(st_client_call(c, NULL, NULL, &r), ST_ERR_INVALID_ARGUMENT, c);
  st_client_close(c);
}

int main(void) {
  fs.on_request = on_request;
  fake_start(&fs);
  /* On a host with a GPU, the first CUDA descriptor makes the library start
   * the driver, which keeps descriptors of its own (/dev/nvidia*) for the
   * life of the process: every descriptor count is taken after that. */
  st_client_t *warm = stt_client_open(fs.path);
  st_result_t *r0 = NULL;
  if (!warm || call_scenario(warm, SC_CUDA, &r0) != ST_ERR_CAPABILITY) {
    fprintf(stderr, "warm-up call of the CUDA scenario failed\n");
    return 1;
  }
  st_client_close(warm);
  fake_wait_idle(&fs, 2000);
  int fds0 = fake_count_fds();
  RUN(hello_fields);
  RUN(open_cache_maps_one_allocation_once);
  RUN(descriptors_follow_the_fd_index);
  RUN(strided_view);
  RUN(bad_descriptors_are_refused_and_the_connection_stays);
  RUN(empty_arena);
  RUN(module_value);
  RUN(notifications_are_skipped);
  RUN(server_error_by_name);
  RUN(unreadable_server_errors_are_protocol_errors);
  RUN(stream_errors_close_the_connection);
  RUN(server_gone_mid_reply);
  RUN(timeout);
  RUN(connect_refusals);
  RUN(connect_missing_socket);
  RUN(null_arguments);
  fake_finish(&fs);
  if (shared_fd >= 0) close(shared_fd);
  int fds1 = fake_count_fds();
  if (fds1 != fds0 - 3) { /* fake_stop closed the listener and its pipe */
    fprintf(stderr, "descriptor leak: %d open before, %d after\n", fds0, fds1);
    stt_failed++;
  }
  return stt_summary();
}

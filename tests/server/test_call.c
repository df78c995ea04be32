/* Calls over the raw socket against a real stserver: tensor and module
 * results arrive as descriptors that map to the right values; endpoint
 * errors name file:line and leave the server serving; unknown endpoints
 * and bad arguments; a client that leaves mid-build leaks nothing. */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "check.h"
#include "proto/proto.h"
#include "raw.h"
#include "st/errors.h"
#include "st/wire.h"

static stt_server_t S;

/* Maps arena `i` of a call result, checking its descriptor. */
typedef struct mapped {
  void *base;
  size_t bytes;
} mapped_t;

static int map_arena(rc_t *c, const msgpack_object *arenas, uint32_t i, int fd_base,
                     mapped_t *out) {
  st__arena_desc_t d;
  char err[256];
  if (st__parse_arena(&arenas->via.array.ptr[i], &d, err, sizeof err) != ST_OK) {
    fprintf(stderr, "bad arena: %s\n", err);
    return -1;
  }
  if (strcmp(d.backend, "memfd") != 0 || d.cuda) return -1;
  if ((int)d.fd + fd_base >= c->nfds) return -1;
  int fd = c->fds[fd_base + (int)d.fd];
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < d.bytes) return -1;
  /* A client cannot resize the allocation under the server. */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK) || !(seals & F_SEAL_GROW)) return -1;
  out->bytes = d.bytes ? d.bytes : 1;
  out->base = mmap(NULL, out->bytes, PROT_READ, MAP_SHARED, fd, 0);
  return out->base == MAP_FAILED ? -1 : 0;
}

static void take_fds(rc_t *c) {
  for (int i = 0; i < c->nfds; i++) close(c->fds[i]);
  c->nfds = 0;
}

TEST(tensor_result_maps) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_call(&r, 5, "arange", 1, "n", 'i', (int64_t)10);
  msg_t m;
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(m.id, 5);
  if (m.error) fprintf(stderr, "error: %s\n", msg_errmsg(&m));
  CHECK(m.error == NULL);
  const msgpack_object *value = obj_get(m.result, "value");
  const msgpack_object *arenas = obj_get(m.result, "arenas");
  CHECK(value && value->type == MSGPACK_OBJECT_EXT && value->via.ext.type == ST_EXT_TENSOR);
  CHECK(arenas && arenas->type == MSGPACK_OBJECT_ARRAY && arenas->via.array.size == 1);
  CHECK_EQ_INT(c.nfds, 1);
  st__tensor_desc_t t;
  char err[256];
  CHECK(st__parse_tensor(value, &t, err, sizeof err) == ST_OK);
  CHECK_EQ_INT(t.dtype, ST_DTYPE_FLOAT32);
  CHECK_EQ_INT(t.ndim, 1);
  CHECK_EQ_INT(t.shape[0], 10);
  CHECK_EQ_INT(t.arena, 0);
  mapped_t mp;
  CHECK(map_arena(&c, arenas, 0, 0, &mp) == 0);
  const float *f = (const float *)((const char *)mp.base + t.offset);
  for (int i = 0; i < 10; i++) CHECK(f[(int64_t)i * t.strides[0]] == (float)i);
  msg_free(&m);
  take_fds(&c);
  /* Plain results belong to the client: the server keeps no arena, and
   * the mapping stays valid. */
  CHECK(rc_wait_info(&c, "arenas.count", 0, 5000) == 0);
  CHECK(f[9 * t.strides[0]] == 9.0f);
  munmap(mp.base, mp.bytes);
  rc_close(&c);
}

TEST(module_and_several_arenas) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_call(&r, 6, "pair", 0);
  msg_t m;
  CHECK(rc_rpc(&c, &r, &m) == 1);
  if (m.error) fprintf(stderr, "error: %s\n", msg_errmsg(&m));
  CHECK(m.error == NULL);
  const msgpack_object *value = obj_get(m.result, "value");
  const msgpack_object *arenas = obj_get(m.result, "arenas");
  CHECK(arenas && arenas->via.array.size == 2);
  CHECK_EQ_INT(c.nfds, 2);
  CHECK_EQ_INT(obj_int(obj_get(value, "n")), 7);
  /* "ones": a plain tensor of ones. */
  st__tensor_desc_t t;
  char err[256];
  CHECK(st__parse_tensor(obj_get(value, "ones"), &t, err, sizeof err) == ST_OK);
  mapped_t mp;
  CHECK(map_arena(&c, arenas, t.arena, 0, &mp) == 0);
  const float *f = (const float *)((const char *)mp.base + t.offset);
  CHECK_EQ_INT(t.shape[0], 2);
  CHECK_EQ_INT(t.shape[1], 3);
  for (int i = 0; i < 6; i++) CHECK(f[i] == 1.0f);
  munmap(mp.base, mp.bytes);
  /* "model": a module whose tensors share one arena. */
  const msgpack_object *model = obj_get(value, "model");
  CHECK(model && model->type == MSGPACK_OBJECT_EXT && model->via.ext.type == ST_EXT_MODULE);
  msgpack_unpacked payload;
  const msgpack_object *tensors = NULL, *meta = NULL;
  msgpack_unpacked_init(&payload);
  CHECK(st__parse_module(model, &payload, &tensors, &meta, err, sizeof err) == ST_OK);
  CHECK(tensors && tensors->type == MSGPACK_OBJECT_ARRAY && tensors->via.array.size == 2);
  int checked = 0;
  for (uint32_t i = 0; i < tensors->via.array.size; i++) {
    const msgpack_object *pair = &tensors->via.array.ptr[i];
    const char *name = obj_str(&pair->via.array.ptr[0]);
    CHECK(st__parse_tensor(&pair->via.array.ptr[1], &t, err, sizeof err) == ST_OK);
    CHECK(map_arena(&c, arenas, t.arena, 0, &mp) == 0);
    f = (const float *)((const char *)mp.base + t.offset);
    if (strcmp(name, "bias") == 0) {
      for (int k = 0; k < 3; k++) CHECK(f[k] == (float)k);
      checked++;
    } else if (strcmp(name, "weight") == 0) {
      for (int k = 0; k < 6; k++) CHECK(f[k] == 1.5f);
      checked++;
    }
    munmap(mp.base, mp.bytes);
  }
  CHECK_EQ_INT(checked, 2);
  msgpack_unpacked_destroy(&payload);
  msg_free(&m);
  take_fds(&c);
  CHECK(rc_wait_info(&c, "arenas.count", 0, 5000) == 0);
  CHECK(rc_info_int(&c, "counters.fds_sent") >= 3);
  rc_close(&c);
}

TEST(endpoint_error_names_file_line) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_call(&r, 9, "fail", 0);
  msg_t m;
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(m.id, 9);
  CHECK_EQ_INT(msg_code(&m), 7);
  CHECK_STR_EQ(msg_errname(&m), "ENDPOINT");
  CHECK_CONTAINS(msg_errmsg(&m), "fail.lua:3");
  CHECK_CONTAINS(msg_errmsg(&m), "boom");
  CHECK_EQ_INT(c.nfds, 0);
  msg_free(&m);
  /* The server keeps serving, this client included. */
  CHECK(stt_ping(c.fd, 10) == 0);
  rq_init(&r);
  rq_call(&r, 11, "arange", 1, "n", 'i', (int64_t)3);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK(m.error == NULL);
  msg_free(&m);
  take_fds(&c);
  rc_close(&c);
}

TEST(unknown_endpoint_and_bad_args) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  msg_t m;
  rq_init(&r);
  rq_call(&r, 1, "no_such_thing", 0);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 2);
  CHECK_STR_EQ(msg_errname(&m), "UNKNOWN_ENDPOINT");
  CHECK_CONTAINS(msg_errmsg(&m), "no_such_thing");
  msg_free(&m);

  rq_init(&r);
  rq_call(&r, 2, "arange", 1, "zz", 'i', (int64_t)1);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 14);
  CHECK_CONTAINS(msg_errmsg(&m), "unknown argument 'zz' (endpoint arange takes: n)");
  msg_free(&m);

  rq_init(&r);
  rq_call(&r, 3, "arange", 1, "n", 's', "ten");
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 14);
  CHECK_CONTAINS(msg_errmsg(&m), "argument 'n' must be integer, got string");
  msg_free(&m);

  rq_init(&r);
  rq_call(&r, 4, "needs", 0);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 14);
  CHECK_CONTAINS(msg_errmsg(&m), "missing required argument 'k'");
  msg_free(&m);

  /* args that are not a map */
  rq_init(&r);
  rq_head(&r, 5, "call");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 2);
  pk_str(&r.pk, "endpoint");
  pk_str(&r.pk, "arange");
  pk_str(&r.pk, "args");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_int(&r.pk, 1);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 14);
  msg_free(&m);

  CHECK(stt_ping(c.fd, 6) == 0);
  CHECK_EQ_INT(c.nfds, 0);
  rc_close(&c);
}

/* Sends a slow call on a fresh connection and closes it at once. */
static int call_and_leave(double seconds) {
  rc_t c;
  if (rc_open(&c, S.socket) != 0) return -1;
  rq_t r;
  rq_init(&r);
  rq_call(&r, 1, "slow", 1, "s", 'd', seconds);
  int rc = rc_send_rq(&c, &r);
  rc_close(&c);
  return rc;
}

TEST(disconnect_mid_build) {
  rc_t watcher;
  CHECK(rc_open(&watcher, S.socket) == 0);
  int64_t dropped = rc_info_int(&watcher, "counters.calls_dropped");
  /* Short builds: they complete, find no connection, drop their arenas. */
  for (int i = 0; i < 3; i++) CHECK(call_and_leave(0.1) == 0);
  CHECK(rc_wait_info(&watcher, "counters.calls_dropped", dropped + 3, 10000) == 0);
  CHECK(rc_wait_info(&watcher, "arenas.count", 0, 5000) == 0);
  /* Long builds: the disconnect cancels them, so they end long before
   * their 60 s; the arena each had made is freed too. */
  double t0 = stt_now_ms();
  for (int i = 0; i < 2; i++) CHECK(call_and_leave(60.0) == 0);
  CHECK(rc_wait_info(&watcher, "counters.calls_dropped", dropped + 5, 10000) == 0);
  CHECK(stt_now_ms() - t0 < 10000);
  CHECK(rc_wait_info(&watcher, "arenas.count", 0, 5000) == 0);
  CHECK_EQ_INT(rc_info_int(&watcher, "inflight"), 0);
  CHECK(stt_ping(watcher.fd, 2) == 0);
  rc_close(&watcher);
}

TEST(endpoints_method) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_simple(&r, 1, "endpoints");
  msg_t m;
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK(m.error == NULL);
  CHECK(m.result->type == MSGPACK_OBJECT_ARRAY);
  CHECK_EQ_INT(m.result->via.array.size, 5);
  char prev[128] = "";
  for (uint32_t i = 0; i < m.result->via.array.size; i++) {
    const msgpack_object *e = &m.result->via.array.ptr[i];
    const char *name = obj_str(obj_get(e, "name"));
    CHECK(strcmp(prev, name) < 0);   /* sorted */
    snprintf(prev, sizeof prev, "%s", name);
    CHECK(obj_get(e, "file") && obj_int(obj_get(e, "line")) >= 1);
    CHECK_STR_EQ(obj_str(obj_get(e, "execution")), "direct");
    if (strcmp(name, "needs") == 0) {
      const msgpack_object *req = obj_get(e, "required");
      CHECK(req && req->via.array.size == 1 && st__str_eq(&req->via.array.ptr[0], "k"));
      CHECK_EQ_INT(obj_int(obj_path(e, "params.j")), 2);
      CHECK_STR_EQ(obj_str(obj_get(e, "doc")), "needs k");
    }
  }
  msg_free(&m);
  rc_close(&c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_init(&S);
  stt_write_endpoint(&S, "arange.lua",
                     "return st.endpoint{\n"
                     "  name = \"arange\", params = { n = 8 },\n"
                     "  build = function(a) return st.arange{a.n, dtype = \"float32\"} end,\n"
                     "}\n");
  stt_write_endpoint(&S, "fail.lua",
                     "return st.endpoint{\n"
                     "  name = \"fail\", build = function()\n"
                     "    error(\"boom\")\n"
                     "  end,\n"
                     "}\n");
  stt_write_endpoint(&S, "pair.lua",
                     "return st.endpoint{\n"
                     "  name = \"pair\",\n"
                     "  build = function()\n"
                     "    return { n = 7, ones = st.ones{2, 3},\n"
                     "             model = st.module{ weight = st.full{2, 3, value = 1.5},\n"
                     "                                bias = st.arange{3, dtype = \"float32\"} } }\n"
                     "  end,\n"
                     "}\n");
  stt_write_endpoint(&S, "slow.lua",
                     "return st.endpoint{\n"
                     "  name = \"slow\", params = { s = 0.2 },\n"
                     "  build = function(a)\n"
                     "    local t = st.zeros{1024}\n"
                     "    st.sleep(a.s)\n"
                     "    return t\n"
                     "  end,\n"
                     "}\n");
  stt_write_endpoint(&S, "needs.lua",
                     "return st.endpoint{\n"
                     "  name = \"needs\", doc = \"needs k\", params = { k = st.required, j = 2 },\n"
                     "  build = function(a) return a.k end,\n"
                     "}\n");
  if (stt_server_start(&S) != 0) {
    stt_server_cleanup(&S);
    return 1;
  }
  RUN(tensor_result_maps);
  RUN(module_and_several_arenas);
  RUN(endpoint_error_names_file_line);
  RUN(unknown_endpoint_and_bad_args);
  RUN(disconnect_mid_build);
  RUN(endpoints_method);
  int status = stt_server_stop(&S);
  if (status != 0) {
    fprintf(stderr, "server exit status %d\n", status);
    stt_failed++;
  }
  stt_server_cleanup(&S);
  return stt_summary();
}

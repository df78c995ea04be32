/* Calls over the raw socket against a real stserver: tensor and module
 * results arrive as descriptors that map to the right values; endpoint
 * errors name file:line and leave the server serving; unknown endpoints
 * and bad arguments; a client that leaves mid-build leaks nothing. */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "check.h"
#include "wire.h"

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

TEST(tensor_result_maps) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 5, 'call', [{endpoint: 'arange', args: {n: 10}}]]") == 1);
  CHECK_EQ_INT(m.id, 5);
  CHECK_REPLY(&m, ST_OK, NULL);
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
  rc_drop_fds(&c);
  /* Plain results belong to the client: the server keeps no arena, and
   * the mapping stays valid. */
  CHECK(rc_wait_info(&c, "arenas.count", 0, 5000) == 0);
  CHECK(f[9 * t.strides[0]] == 9.0f);
  munmap(mp.base, mp.bytes);
  rc_close(&c);
}

TEST(module_and_several_arenas) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 6, 'call', [{endpoint: 'pair', args: {}}]]") == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
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
  rc_drop_fds(&c);
  CHECK(rc_wait_info(&c, "arenas.count", 0, 5000) == 0);
  CHECK(rc_info_int(&c, "counters.fds_sent") >= 3);
  rc_close(&c);
}

TEST(endpoint_error_names_file_line) {
  OPEN_RC(c, S.socket);
  CHECK_RPC(&c, ST_ERR_ENDPOINT, "fail.lua:3: boom",
            "[0, 9, 'call', [{endpoint: 'fail', args: {}}]]");
  CHECK_EQ_INT(c.nfds, 0);
  /* The server keeps serving, this client included. */
  CHECK(stt_ping(c.fd, 10) == 0);
  CHECK_RPC(&c, ST_OK, NULL, "[0, 11, 'call', [{endpoint: 'arange', args: {n: 3}}]]");
  rc_drop_fds(&c);
  rc_close(&c);
}

/* Calls the server refuses; none costs the connection. */
static const frame_case_t refused[] = {
    {"[0, 1, 'call', [{endpoint: 'no_such_thing', args: {}}]]", ST_ERR_UNKNOWN_ENDPOINT,
     "no_such_thing"},
    {"[0, 2, 'call', [{endpoint: 'arange', args: {zz: 1}}]]", ST_ERR_INVALID_ARGUMENT,
     "unknown argument 'zz' (endpoint arange takes: n)"},
    {"[0, 3, 'call', [{endpoint: 'arange', args: {n: 'ten'}}]]", ST_ERR_INVALID_ARGUMENT,
     "argument 'n' must be integer, got string"},
    {"[0, 4, 'call', [{endpoint: 'needs', args: {}}]]", ST_ERR_INVALID_ARGUMENT,
     "missing required argument 'k'"},
    /* args that are not a map */
    {"[0, 5, 'call', [{endpoint: 'arange', args: [1]}]]", ST_ERR_INVALID_ARGUMENT, NULL},
};

TEST(unknown_endpoint_and_bad_args) {
  OPEN_RC(c, S.socket);
  CHECK_RPC_TABLE(&c, refused, sizeof refused / sizeof refused[0]);
  CHECK(stt_ping(c.fd, 6) == 0);
  CHECK_EQ_INT(c.nfds, 0);
  rc_close(&c);
}

/* Sends a slow call on a fresh connection and closes it at once. */
static int call_and_leave(double seconds) {
  rc_t c;
  if (rc_open(&c, S.socket) != 0) return -1;
  int rc = rc_sendf(&c, "[0, 1, 'call', [{endpoint: 'slow', args: {s: %#.17g}}]]", seconds);
  rc_close(&c);
  return rc;
}

TEST(disconnect_mid_build) {
  OPEN_RC(watcher, S.socket);
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
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 1, 'endpoints', []]") == 1);
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

static const stt_endpoint_t endpoints[] = {
    {"arange.lua",
     "return st.endpoint{\n"
     "  name = \"arange\", params = { n = 8 },\n"
     "  build = function(a) return st.arange{a.n, dtype = \"float32\"} end,\n"
     "}\n"},
    {"fail.lua",
     "return st.endpoint{\n"
     "  name = \"fail\", build = function()\n"
     "    error(\"boom\")\n"
     "  end,\n"
     "}\n"},
    {"pair.lua",
     "return st.endpoint{\n"
     "  name = \"pair\",\n"
     "  build = function()\n"
     "    return { n = 7, ones = st.ones{2, 3},\n"
     "             model = st.module{ weight = st.full{2, 3, value = 1.5},\n"
     "                                bias = st.arange{3, dtype = \"float32\"} } }\n"
     "  end,\n"
     "}\n"},
    {"slow.lua",
     "return st.endpoint{\n"
     "  name = \"slow\", params = { s = 0.2 },\n"
     "  build = function(a)\n"
     "    local t = st.zeros{1024}\n"
     "    st.sleep(a.s)\n"
     "    return t\n"
     "  end,\n"
     "}\n"},
    {"needs.lua",
     "return st.endpoint{\n"
     "  name = \"needs\", doc = \"needs k\", params = { k = st.required, j = 2 },\n"
     "  build = function(a) return a.k end,\n"
     "}\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, NULL, endpoints);
  RUN(tensor_result_maps);
  RUN(module_and_several_arenas);
  RUN(endpoint_error_names_file_line);
  RUN(unknown_endpoint_and_bad_args);
  RUN(disconnect_mid_build);
  RUN(endpoints_method);
  return stt_server_finish(&S);
}

/* Devices over the real socket, on any host (docs/endpoints.md,
 * "Devices"): a call that needs a CUDA device the server does not have
 * gets CAPABILITY "no CUDA device: cuda:N is unavailable: <reason>" and the
 * server carries on; constructors default to the call's device and
 * `device =` overrides it; info lists a budget per CUDA device. On a host
 * without CUDA, endpoints declared device = "cuda" fail the same way; on a
 * host with one they build there. A second server with default_device =
 * "socket" logs where its socket builds. */
#include <signal.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;
static int have_cuda;         /* info: cuda.devices > 0 */

/* call ep (no arguments): the reply in *m (caller frees), fds dropped. */
static int call0(rc_t *c, const char *ep, msg_t *m) {
  return rk_call(c, ep, NULL, 0, m);
}

/* The string value of a call without arguments ("" on error). */
static const char *call_str(rc_t *c, const char *ep) {
  msg_t m;
  if (call0(c, ep, &m) != 1) return "";
  if (m.error) fprintf(stderr, "   %s: %s: %s\n", ep, msg_errname(&m), msg_errmsg(&m));
  const char *s = m.error ? "" : obj_str(obj_get(m.result, "value"));
  msg_free(&m);
  return s;
}

TEST(missing_cuda_device_is_capability) {
  OPEN_RC(c, S.socket);
  msg_t m;
  /* An endpoint on a device no host has. */
  CHECK(call0(&c, "far", &m) == 1);
  CHECK_REPLY(&m, ST_ERR_CAPABILITY, "far: no CUDA device: cuda:63 is unavailable: ");
  msg_free(&m);
  /* A constructor naming one, in a CPU endpoint: the body's file:line. */
  CHECK(call0(&c, "ctor_far", &m) == 1);
  CHECK_REPLY(&m, ST_ERR_CAPABILITY, "ctor_far.lua:3: no CUDA device: cuda:63 is unavailable");
  msg_free(&m);
  /* :to() a device no host has. */
  CHECK(call0(&c, "to_far", &m) == 1);
  CHECK_REPLY(&m, ST_ERR_CAPABILITY, "no CUDA device: cuda:63 is unavailable");
  msg_free(&m);
  if (!have_cuda) {
    /* device = "cuda": the socket's device, which this host lacks; the
     * reason is the runtime's. */
    CHECK(call0(&c, "gpu", &m) == 1);
    CHECK_REPLY(&m, ST_ERR_CAPABILITY, "gpu: no CUDA device: cuda:0 is unavailable: ");
    CHECK_CONTAINS(msg_errmsg(&m), "names the CUDA device of the socket");
    msg_free(&m);
    /* Tasks report it the same way, through the task. */
    uint64_t t = rk_submit(&c, "gpu", NULL, 0);
    CHECK(t == 0);
    CHECK(call0(&c, "ctor_cuda", &m) == 1);
    CHECK_REPLY(&m, ST_ERR_CAPABILITY, "no CUDA device: cuda:0 is unavailable");
    msg_free(&m);
  } else {
    CHECK_STR_EQ(call_str(&c, "gpu"), "cuda:0");
    CHECK_STR_EQ(call_str(&c, "ctor_cuda"), "cuda:0");
  }
  /* The server carries on, on every worker. */
  CHECK(stt_ping(c.fd, 3) == 0);
  for (int i = 0; i < 4; i++) CHECK_STR_EQ(call_str(&c, "cpu_default"), "cpu");
  rc_close(&c);
}

TEST(constructors_follow_the_call_device) {
  OPEN_RC(c, S.socket);
  /* default_device = "cpu" (the fixture): CPU, also for :to("cpu"). */
  CHECK_STR_EQ(call_str(&c, "cpu_default"), "cpu");
  CHECK_STR_EQ(call_str(&c, "explicit_cpu"), "cpu");
  msg_t m;
  CHECK(call0(&c, "bad_name", &m) == 1);
  CHECK_REPLY(&m, ST_ERR_ENDPOINT, "zeros: unknown device 'gpu0'");
  msg_free(&m);
  CHECK(call0(&c, "mixed_cpu_module", &m) == 1);
  CHECK(m.error == NULL);
  msg_free(&m);
  rc_close(&c);
}

TEST(info_lists_cuda_budgets) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_info(&c, 4, &m) == 1);
  const msgpack_object *mem = obj_get(m.result, "memory");
  CHECK(mem && mem->type == MSGPACK_OBJECT_MAP);
  CHECK(obj_get(mem, "cpu") != NULL);
  int cuda_entries = 0;
  for (uint32_t i = 0; mem && i < mem->via.map.size; i++) {
    const msgpack_object *k = &mem->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size > 5 &&
        memcmp(k->via.str.ptr, "cuda:", 5) == 0) {
      cuda_entries++;
      const msgpack_object *v = &mem->via.map.ptr[i].val;
      CHECK(obj_int(obj_get(v, "budget")) > 0);
      CHECK(obj_int(obj_get(v, "total_bytes")) > 0);
      CHECK(obj_get(v, "free_bytes") != NULL);
    }
  }
  CHECK_EQ_INT(cuda_entries, (int)obj_int(obj_path(m.result, "cuda.devices")));
  msg_free(&m);
  rc_close(&c);
}

/* default_device = "socket": socket 0 builds on cuda:0 when the server has
 * it, else on the CPU; either way the start log says so. */
TEST(socket_default_is_logged) {
  stt_server_t s2;
  stt_server_init(&s2);
  stt_server_config(&s2, "default_device = 'socket',");
  stt_write_endpoint(&s2, "where.lua",
                     "return st.endpoint{ name = 'where',\n"
                     "  build = function() return st.zeros{1}:device() end }\n");
  CHECK(stt_server_start(&s2) == 0);
  OPEN_RC(c, s2.socket);
  CHECK_STR_EQ(call_str(&c, "where"), have_cuda ? "cuda:0" : "cpu");
  rc_close(&c);
  CHECK_EQ_INT(stt_server_stop(&s2), 0);
  char *log = stt_server_log(&s2);
  CHECK_CONTAINS(log, have_cuda ? "socket 0 builds on cuda:0 by default"
                                : "socket 0 builds on cpu by default");
  free(log);
  stt_server_cleanup(&s2);
}

/* The start log of a host without a GPU says so plainly at info ("no GPU:
 * serving CPU endpoints only"); the CUDA runtime's reason ("CUDA driver
 * version is insufficient ...", which reads like a broken install) is
 * written at debug only, and info keeps it. */
TEST(start_log_names_no_gpu_plainly) {
  if (have_cuda) {
    char *log = stt_server_log(&S);
    CHECK_CONTAINS(log, "devices: cpu and ");
    CHECK(strstr(log, "no GPU") == NULL);
    free(log);
    return;
  }
  /* S logs at debug: both lines, each at its level. */
  char *log = stt_server_log(&S);
  CHECK_CONTAINS(log, "info  server: no GPU: serving CPU endpoints only\n");
  CHECK_CONTAINS(log, "debug server: no CUDA device: ");
  CHECK(strstr(log, "info  server: devices: cpu; no CUDA device") == NULL);
  free(log);
  /* At info, the default: the plain line only. */
  stt_server_t s3;
  stt_server_init(&s3);
  stt_server_config(&s3, "log_level = 'info',");
  CHECK(stt_server_start(&s3) == 0);
  OPEN_RC(c, s3.socket);
  msg_t m;
  CHECK(rc_info(&c, 5, &m) == 1);
  const char *reason = obj_str(obj_path(m.result, "cuda.reason"));
  CHECK(reason && reason[0]);
  msg_free(&m);
  rc_close(&c);
  CHECK_EQ_INT(stt_server_stop(&s3), 0);
  log = stt_server_log(&s3);
  CHECK_CONTAINS(log, "info  server: no GPU: serving CPU endpoints only\n");
  CHECK(strstr(log, "no CUDA device") == NULL);
  free(log);
  stt_server_cleanup(&s3);
}

static const stt_endpoint_t endpoints[] = {
    {"far.lua",
     "return st.endpoint{ name = 'far', device = 'cuda:63',\n"
     "  build = function() return 1 end }\n"},
    {"gpu.lua",
     "return st.endpoint{ name = 'gpu', device = 'cuda',\n"
     "  build = function() return st.zeros{2}:device() end }\n"},
    {"ctor_far.lua",
     "return st.endpoint{ name = 'ctor_far',\n"
     "  build = function()\n"
     "    local t = st.zeros{2, device = 'cuda:63'}\n"
     "    return t end }\n"},
    {"ctor_cuda.lua",
     "return st.endpoint{ name = 'ctor_cuda',\n"
     "  build = function()\n"
     "    local t = st.ones{2, device = 'cuda'}\n"
     "    return t:device() end }\n"},
    {"to_far.lua",
     "return st.endpoint{ name = 'to_far',\n"
     "  build = function() local t = st.zeros{2}:to('cuda:63') return t end }\n"},
    {"cpu_default.lua",
     "return st.endpoint{ name = 'cpu_default',\n"
     "  build = function() return st.arange{3}:device() end }\n"},
    {"explicit_cpu.lua",
     "return st.endpoint{ name = 'explicit_cpu', device = 'cpu',\n"
     "  build = function()\n"
     "    local t = st.randn{4, device = 'cpu'}:to('cpu', 'float16')\n"
     "    assert(tostring(t) == 'tensor(float16, {4}, cpu)')\n"
     "    return t:device() end }\n"},
    {"bad_name.lua",
     "return st.endpoint{ name = 'bad_name',\n"
     "  build = function() local t = st.zeros{2, device = 'gpu0'} return t end }\n"},
    {"mixed_cpu_module.lua",
     "return st.endpoint{ name = 'mixed_cpu_module',\n"
     "  build = function()\n"
     "    return st.module{ a = st.zeros{2}, b = st.ones{3, device = 'cpu'} } end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, NULL, endpoints);
  {
    rc_t c;
    if (rc_open(&c, S.socket) == 0) {
      have_cuda = rc_info_int(&c, "cuda.devices") > 0;
      rc_close(&c);
    }
    fprintf(stderr, "   CUDA devices: %s\n", have_cuda ? "yes" : "none");
  }
  RUN(missing_cuda_device_is_capability);
  RUN(constructors_follow_the_call_device);
  RUN(info_lists_cuda_budgets);
  RUN(socket_default_is_logged);
  RUN(start_log_names_no_gpu_plainly);
  return stt_server_finish(&S);
}

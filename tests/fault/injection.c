/* Injected failures of the system calls behind a CPU arena and a new
 * connection (memfd_create, ftruncate, fallocate, mmap, accept), through
 * the LD_PRELOAD shim of tests/fault/shim.c. For each: the request that
 * hits the failure gets a clean error (its code, and a message that names
 * the failing call), the fault fired (the shim says so in the log), and
 * the server then still serves: ping and the same request succeed, and
 * its descriptors, arenas and objects return to what they were before.
 * The server is started afresh for every case and must exit cleanly.
 *
 *   fault_injection          the CPU cases (CTest fault_injection)
 *   fault_injection gpu      the CUDA driver cases: cuMemCreate,
 *                            cuMemExportToShareableHandle for a result,
 *                            cuMemImportFromShareableHandle for a tensor
 *                            argument (CTest fault_gpu_injection, label gpu;
 *                            skipped without a CUDA device) */
#include <st/client.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fault_kit.h"
#include "fixture.h"

/* Every endpoint takes k, so that each call of a cached one is a fresh
 * build (a new key). */
static const stt_endpoint_t endpoints[] = {
    {"fresh.lua",
     "return st.endpoint{ name = 'fresh', params = { k = 0 },\n"
     "  build = function(a) return st.arange{16, dtype = 'float32'} end }\n"},
    {"cached.lua",
     "return st.endpoint{ name = 'cached', cache = true, params = { k = 0 },\n"
     "  build = function(a) return st.arange{16, dtype = 'float32'} end }\n"},
    {"managed.lua",
     "return st.endpoint{ name = 'managed', managed = true, params = { k = 0 },\n"
     "  build = function(a) return st.zeros{16} end }\n"},
    {"task.lua",
     "return st.endpoint{ name = 'task', execution = 'task', params = { k = 0 },\n"
     "  build = function(a) return st.ones{16} end }\n"},
    {"fresh_cuda.lua",
     "return st.endpoint{ name = 'fresh_cuda', device = 'cuda', params = { k = 0 },\n"
     "  build = function(a) return st.arange{16, dtype = 'float32'} end }\n"},
    {"scale.lua",
     "return st.endpoint{ name = 'scale', params = { x = st.tensor_param{}, k = 2 },\n"
     "  build = function(a) return a.x:mul_(a.k) end }\n"},
    {NULL, NULL}};

/* call; submit, wait, result; call with a tensor argument on the CPU or
 * on cuda:0; connect (then call). */
typedef enum { OP_CALL, OP_SUBMIT, OP_TARG, OP_TARG_CUDA, OP_CONNECT } op_t;

typedef struct fault_case {
  const char *rule;       /* ST_FAULT */
  const char *call;       /* the shim's name of the faulted call */
  op_t op;
  const char *endpoint;
  int want;               /* the error the request must get */
  const char *msg;        /* ... with this in its message */
} fault_case_t;

static fk_t K;
static int key;           /* a fresh cache key per request */

/* One request of case fc on client c: ST_OK or the error; *msg receives
 * its message (static buffer). */
static int do_request(st_client_t *c, const fault_case_t *fc, const char **msg) {
  static char text[512];
  text[0] = '\0';
  *msg = text;
  st_args_t *a = st_args_new();
  st_result_t *r = NULL, *t = NULL;
  int rc;
  if (fc->op == OP_TARG || fc->op == OP_TARG_CUDA) {
    int64_t n = 16;
    char err[256];
    rc = st_tensor_alloc(fc->op == OP_TARG ? "cpu" : "cuda:0", ST_DTYPE_FLOAT32, 1, &n, &t, err, sizeof err);
    if (rc == ST_OK) rc = st_args_tensor(a, "x", st_result_tensor(t, 0), err, sizeof err);
    if (rc != ST_OK) {
      snprintf(text, sizeof text, "client side: %s", err);
      goto out;
    }
  } else {
    st_args_int(a, "k", ++key);
  }
  if (fc->op == OP_SUBMIT) {
    uint64_t id = 0;
    rc = st_client_submit(c, fc->endpoint, a, &id);
    if (rc == ST_OK) rc = st_client_task_wait(c, id, 10, &r);
    st_result_free(r);
    r = NULL;
    if (rc == ST_OK) rc = st_client_task_result(c, id, &r);
  } else {
    rc = st_client_call(c, fc->endpoint, a, &r);
  }
  if (rc != ST_OK) snprintf(text, sizeof text, "%s: %s", st_client_error_name(c), st_client_error(c));
out:
  st_result_free(r);
  st_result_free(t);
  st_args_free(a);
  return rc;
}

/* The body of one case, between the server's start and its stop. */
static void case_body(const fault_case_t *fc) {
  const char *msg;
  /* Warm up (worker states, lazy tables) so the baseline is steady. */
  {
    OPEN_CLIENT(w, K.srv.socket);
    CHECK_ERR_MSG(do_request(w, fc, &msg), ST_OK, msg);
    st_client_close(w);
  }
  if (fc->endpoint) CHECK_ERR(st_client_invalidate_endpoint(K.mon, fc->endpoint, NULL), ST_OK);
  CHECK(fk_baseline(&K) == 0);

  st_client_t *c = NULL;
  if (fc->op == OP_CONNECT) {
    /* accept fails: the server gives up its spare descriptor to take the
     * connection and answers LIMIT (or, when that accept fails too, pauses
     * accepting for 100 ms); the client then gets in on its next try.
     * Other clients are not disturbed. */
    fk_arm(&K);
    char err[256];
    int rc = st_client_connect(K.srv.socket, &c, err, sizeof err);
    fk_disarm(&K);
    CHECK_ERR_MSG(rc, ST_ERR_LIMIT, err);
    CHECK_CONTAINS(err, "no descriptor left for a connection");
    CHECK_ERR(st_client_ping(K.mon, NULL), ST_OK);
    rc = st_client_connect(K.srv.socket, &c, err, sizeof err);
    CHECK_ERR_MSG(rc, ST_OK, err);
    char *log = stt_server_log(&K.srv);
    int warned = log && strstr(log, "the server is out of file descriptors") != NULL;
    free(log);
    CHECK(warned);
  } else {
    c = stt_client_open(K.srv.socket);
    CHECK(c);
    fk_arm(&K);
    int rc = do_request(c, fc, &msg);
    fk_disarm(&K);
    if (rc != fc->want) st_client_close(c);
    fprintf(stderr, "   got %s\n", msg);
    CHECK_ERR_MSG(rc, fc->want, msg);
    if (!strstr(msg, fc->msg)) st_client_close(c);
    CHECK_CONTAINS(msg, fc->msg);
  }
  CHECK(fk_fired(&K, fc->call));
  /* Still serving, on the same connection and on a new one. */
  int rc = st_client_ping(c, NULL);
  if (rc == ST_OK) rc = do_request(c, fc, &msg);
  st_client_close(c);
  CHECK_ERR_MSG(rc, ST_OK, msg);
  {
    OPEN_CLIENT(d, K.srv.socket);
    rc = do_request(d, fc, &msg);
    st_client_close(d);
    CHECK_ERR_MSG(rc, ST_OK, msg);
  }
  CHECK(fk_back_to_baseline(&K, fc->endpoint) == 0);
}

static const char gpu_config[] =
    "memory_budget = { cpu = 16 * 1024 * 1024, ['cuda:0'] = 256 * 1024 * 1024 },";

static void run_case(const fault_case_t *fc, int gpu) {
  fprintf(stderr, "   ST_FAULT=%s\n", fc->rule);
  if (fk_start(&K, fc->rule, endpoints, gpu ? gpu_config : NULL) != 0) STT_FAIL("server did not start under the shim");
  K.check_device = gpu;   /* CPU cases run beside other tests' servers */
  case_body(fc);
  if (fk_stop(&K) != 0) STT_FAIL("the server did not exit cleanly");
}

#define CASE(name, ...)                                    \
  TEST(name) {                                             \
    static const fault_case_t fc = __VA_ARGS__;            \
    run_case(&fc, 0);                                      \
  }
#define GPU_CASE(name, ...)                                \
  TEST(name) {                                             \
    static const fault_case_t fc = __VA_ARGS__;            \
    run_case(&fc, 1);                                      \
  }

CASE(memfd_create_emfile, {"memfd_create:0:1:EMFILE", "memfd_create", OP_CALL, "fresh",
                           ST_ERR_LIMIT, "memfd_create: out of file descriptors"})
CASE(memfd_create_enomem, {"memfd_create:0:1:ENOMEM", "memfd_create", OP_CALL, "fresh",
                           ST_ERR_OUT_OF_MEMORY, "memfd_create"})
CASE(ftruncate_enospc, {"ftruncate:0:1:ENOSPC", "ftruncate", OP_CALL, "fresh",
                        ST_ERR_OUT_OF_MEMORY, "ftruncate"})
CASE(fallocate_enospc, {"fallocate:0:1:ENOSPC", "fallocate", OP_CALL, "fresh",
                        ST_ERR_OUT_OF_MEMORY, "fallocate"})
CASE(mmap_enomem, {"mmap:0:1:ENOMEM", "mmap", OP_CALL, "fresh", ST_ERR_OUT_OF_MEMORY, "mmap"})
CASE(cached_memfd_not_cached, {"memfd_create:0:1:EMFILE", "memfd_create", OP_CALL, "cached",
                               ST_ERR_LIMIT, "memfd_create"})
CASE(managed_fallocate, {"fallocate:0:1:ENOSPC", "fallocate", OP_CALL, "managed",
                         ST_ERR_OUT_OF_MEMORY, "fallocate"})
CASE(task_memfd_create, {"memfd_create:0:1:EMFILE", "memfd_create", OP_SUBMIT, "task",
                         ST_ERR_LIMIT, "memfd_create"})
CASE(tensor_argument_mmap, {"mmap:0:1:ENOMEM", "mmap", OP_TARG, "scale", ST_ERR_OUT_OF_MEMORY,
                            "mmap"})
CASE(accept_emfile, {"accept:0:3:EMFILE", "accept", OP_CONNECT, "fresh", ST_ERR_LIMIT, ""})

/* CUresult 2 is CUDA_ERROR_OUT_OF_MEMORY, 999 CUDA_ERROR_UNKNOWN. */
GPU_CASE(cu_mem_create_oom, {"cuMemCreate:0:1:2", "cuMemCreate", OP_CALL, "fresh_cuda",
                             ST_ERR_OUT_OF_MEMORY, "out of device memory on cuda:0"})
GPU_CASE(cu_mem_create_unknown, {"cuMemCreate:0:1:999", "cuMemCreate", OP_CALL, "fresh_cuda",
                                 ST_ERR_INTERNAL, "cuMemCreate"})
GPU_CASE(cu_mem_export, {"cuMemExportToShareableHandle:0:1:999", "cuMemExportToShareableHandle",
                         OP_CALL, "fresh_cuda", ST_ERR_INTERNAL, "cuMemExportToShareableHandle"})
GPU_CASE(cu_mem_import, {"cuMemImportFromShareableHandle:0:1:999",
                         "cuMemImportFromShareableHandle", OP_TARG_CUDA, "scale",
                         ST_ERR_INVALID_ARGUMENT, "cuMemImportFromShareableHandle"})

int main(int argc, char **argv) {
  /* Each case fails the first allocation of a fresh arena; a client with
   * a result pool would get its fresh results from a slab instead, and a
   * slab that cannot be made falls back to an arena of its own. */
  setenv("ST_CLIENT_POOL", "0", 1);
  if (argc > 1 && !strcmp(argv[1], "gpu")) {
    int64_t n = 1;
    st_result_t *t = NULL;
    char err[256];
    if (st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 1, &n, &t, err, sizeof err) != ST_OK)
      stt_skip(err);
    st_result_free(t);
    RUN(cu_mem_create_oom);
    RUN(cu_mem_create_unknown);
    RUN(cu_mem_export);
    RUN(cu_mem_import);
    return stt_summary();
  }
  RUN(memfd_create_emfile);
  RUN(memfd_create_enomem);
  RUN(ftruncate_enospc);
  RUN(fallocate_enospc);
  RUN(mmap_enomem);
  RUN(cached_memfd_not_cached);
  RUN(managed_fallocate);
  RUN(task_memfd_create);
  RUN(tensor_argument_mmap);
  RUN(accept_emfile);
  return stt_summary();
}

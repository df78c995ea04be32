/* CUDA tensor arguments through libstclient against a real stserver:
 *   - st_tensor_alloc("cuda:0") gives zeroed device memory that this
 *     process fills; an endpoint scales it in place with x:mul_(k) on the
 *     GPU (the whole tensor, then a strided view) and the client reads the
 *     new values back from its own allocation; submit carries it too;
 *   - echo returns the argument: the reply maps the same device memory
 *     (writes through either pointer show through the other);
 *   - a CPU tensor to a device = "cuda" parameter, and a CUDA tensor to a
 *     dtype = "float64", device = "cpu" one, are refused before the body;
 *   - once the client frees its allocation (the server learns it with the
 *     next request: params.forget), device memory returns to its
 *     baseline: the server keeps no import of it.
 * (The CPU path and the other refusals: tests/client/test_targs.c and
 * tests/server/test_targs_wire.c.) Exit 77 without a CUDA device. */
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_kit.h"
#include "endpoints.h"
#include "fixture.h"
#include "mem/cuda.h"

#include "../server/gpu_kit.h"

#ifdef ST_HAVE_CUDA

#define MiB (1024ull * 1024ull)

static const char ep_scale[] =
    "return st.endpoint{ name = \"scale\",\n"
    "  params = { x = st.tensor_param{ dtype = \"float32\", device = \"cuda\" }, k = 2.5 },\n"
    "  build = function(a) a.x:mul_(a.k); return a.x:numel() end }\n";
static const char ep_sum[] =
    "return st.endpoint{ name = \"sum64\",\n"
    "  params = { x = st.tensor_param{ dtype = \"float64\", device = \"cpu\" } },\n"
    "  build = function(a) return 0 end }\n";
static const char ep_gpu_only[] =
    "return st.endpoint{ name = \"gpu_only\",\n"
    "  params = { x = st.tensor_param{ device = \"cuda\" } },\n"
    "  build = function(a) return 1 end }\n";

static stt_server_t srv;
static st_client_t *cli;

/* A CUDA float32 tensor of n elements holding 0, 1, 2, ... (NULL on
 * failure, reason printed). */
static st_result_t *counting_cuda(int64_t n) {
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 1, &n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
    return NULL;
  }
  const st_tensor_t *t = st_result_tensor(r, 0);
  float *h = malloc((size_t)n * sizeof *h);
  int rc = h ? ST_OK : ST_ERR_OUT_OF_MEMORY;
  for (int64_t i = 0; h && i < n; i++) h[i] = (float)i;
  if (rc == ST_OK)
    rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, h, t->nbytes, t->device_index,
                                 err, sizeof err);
  free(h);
  if (rc != ST_OK) {
    fprintf(stderr, "   fill: %s\n", err);
    st_result_free(r);
    return NULL;
  }
  return r;
}

/* The tensor's elements on the host (malloc'ed), or NULL. */
static float *host_of(const st_tensor_t *t) {
  float *h = malloc(t->nbytes ? t->nbytes : 1);
  if (h && st_tensor_copy_to_host(t, h, t->nbytes) != ST_OK) {
    free(h);
    h = NULL;
  }
  return h;
}

/* call ep with x = t (and k when k != 0); the status, *out the result. */
static int call_x(const char *ep, const char *key, const st_tensor_t *t, double k,
                  st_result_t **out) {
  st_args_t *a = st_args_new();
  char err[256];
  int rc = st_args_tensor(a, key, t, err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "   st_args_tensor: %s\n", err);
    st_args_free(a);
    return rc;
  }
  if (k != 0) st_args_float(a, "k", k);
  *out = NULL;
  rc = st_client_call(cli, ep, a, out);
  st_args_free(a);
  return rc;
}

static int64_t int_of(const st_result_t *r) {
  const st_value_t *v = r ? st_result_value(r) : NULL;
  if (v && v->kind == ST_VALUE_INT) return v->as.integer;
  if (v && v->kind == ST_VALUE_FLOAT) return (int64_t)v->as.number;
  return -1;
}

TEST(alloc_gives_zeroed_device_memory) {
  st_result_t *r = NULL;
  char err[256];
  int64_t shape[2] = {3, 257};
  CHECK_ERR_MSG(st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 2, shape, &r, err, sizeof err),
                ST_OK, err);
  const st_tensor_t *t = st_result_tensor(r, 0);
  CHECK(t && t->device == ST_DEVICE_CUDA && t->device_index == 0 && t->numel == 771);
  CHECK(strncmp(t->device_uuid, "GPU-", 4) == 0);
  float *h = host_of(t);
  CHECK(h);
  int zero = 1;
  for (int64_t i = 0; i < t->numel; i++) zero &= h[i] == 0.0f;
  free(h);
  CHECK(zero);
  st_result_free(r);
}

TEST(scale_multiplies_the_callers_device_memory_in_place) {
  const int64_t n = 1 << 20;
  st_result_t *x = counting_cuda(n);
  CHECK(x);
  const st_tensor_t *t = st_result_tensor(x, 0);
  st_result_t *r = NULL;
  int rc = call_x("scale", "x", t, 3.0, &r);
  if (rc != ST_OK) fprintf(stderr, "   scale: %s\n", st_client_error(cli));
  CHECK_RC(rc, ST_OK, cli);
  CHECK_EQ_INT(int_of(r), n);
  st_result_free(r);
  float *h = host_of(t);
  CHECK(h);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += h[i] != 3.0f * (float)i;
  free(h);
  CHECK_EQ_INT(bad, 0);

  /* a strided view: every other element from element 1, scaled by -1 */
  int64_t vshape[1] = {n / 2}, vstride[1] = {2};
  st_tensor_t view = *t;
  view.data = (float *)t->data + 1;
  view.shape = vshape;
  view.strides = vstride;
  view.numel = n / 2;
  view.nbytes = (size_t)(n / 2) * sizeof(float);
  CHECK_ERR(call_x("scale", "x", &view, -1.0, &r), ST_OK);
  CHECK_EQ_INT(int_of(r), n / 2);
  st_result_free(r);
  h = host_of(t);
  CHECK(h);
  for (int64_t i = 0; i < n; i++) bad += h[i] != (i % 2 ? -3.0f : 3.0f) * (float)i;
  free(h);
  CHECK_EQ_INT(bad, 0);

  /* submit carries it as well */
  st_args_t *a = st_args_new();
  char err[256];
  CHECK_ERR_MSG(st_args_tensor(a, "x", t, err, sizeof err), ST_OK, err);
  st_args_float(a, "k", 0.5);
  uint64_t id = 0;
  CHECK_RC(st_client_submit(cli, "scale", a, &id), ST_OK, cli);
  st_args_free(a);
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(cli, id, 30, &info), ST_OK, cli);
  st_result_free(info);
  CHECK_RC(st_client_task_result(cli, id, &r), ST_OK, cli);
  st_result_free(r);
  CHECK(st_tensor_get(t, 2) == 3.0);   /* 2 * 3 * 0.5 */
  CHECK(st_tensor_get(t, 3) == -4.5);  /* 3 * -3 * 0.5 */
  st_result_free(x);
}

TEST(echo_returns_the_same_device_memory) {
  st_result_t *x = counting_cuda(4096);
  CHECK(x);
  const st_tensor_t *t = st_result_tensor(x, 0);
  st_result_t *r = NULL;
  CHECK_ERR(call_x("echo", "value", t, 0, &r), ST_OK);
  const st_tensor_t *e = st_result_tensor(r, 0);
  CHECK(e && e->device == ST_DEVICE_CUDA && e->numel == 4096 && e->dtype == ST_DTYPE_FLOAT32);
  CHECK_STR_EQ(e->device_uuid, t->device_uuid);
  /* Named by the argument's index: the caller's own mapping, not a second
   * import (docs/protocol.md, "Tensor arguments", {arg: i}). */
  CHECK(e->data == t->data);
  CHECK(st_tensor_get(e, 4095) == 4095.0);
  char err[256];
  float v = 777.0f;
  /* through the reply's mapping, seen through the allocation, and back */
  CHECK_ERR_MSG(st__cuda_copy_to_device((uint64_t)(uintptr_t)e->data, &v, sizeof v,
                                        e->device_index, err, sizeof err),
                ST_OK, err);
  CHECK(st_tensor_get(t, 0) == 777.0);
  v = -5.0f;
  CHECK_ERR_MSG(st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data + 4, &v, sizeof v,
                                        t->device_index, err, sizeof err),
                ST_OK, err);
  CHECK(st_tensor_get(e, 1) == -5.0);
  st_result_free(r);
  /* the allocation outlives the reply's mapping */
  CHECK(st_tensor_get(t, 2) == 2.0);
  st_result_free(x);
}

TEST(declared_devices_are_enforced) {
  int64_t n = 8;
  char err[256];
  st_result_t *cpu = NULL, *f64 = NULL, *r = NULL;
  CHECK_ERR_MSG(st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &cpu, err, sizeof err), ST_OK, err);
  CHECK_ERR(call_x("gpu_only", "x", st_result_tensor(cpu, 0), 0, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(cli), "argument 'x' is on cpu; the endpoint wants cuda");
  CHECK_ERR(call_x("scale", "x", st_result_tensor(cpu, 0), 2, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(cli), "argument 'x' is on cpu; the endpoint wants cuda");
  st_result_free(cpu);

  CHECK_ERR_MSG(st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT64, 1, &n, &f64, err, sizeof err),
                ST_OK, err);
  CHECK_ERR(call_x("sum64", "x", st_result_tensor(f64, 0), 0, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(cli), "argument 'x' is on cuda; the endpoint wants cpu");
  CHECK_ERR(call_x("scale", "x", st_result_tensor(f64, 0), 2, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(cli),
                 "argument 'x' has dtype float64; the endpoint wants float32");
  /* the device parameter takes it */
  CHECK_ERR(call_x("gpu_only", "x", st_result_tensor(f64, 0), 0, &r), ST_OK);
  st_result_free(r);
  st_result_free(f64);
  CHECK_RC(st_client_ping(cli, NULL), ST_OK, cli);
}

TEST(device_memory_returns_once_the_client_frees_it) {
  CHECK(stt_client_settle(cli));
  uint64_t base = gk_free();
  CHECK(base > 0);
  const int64_t n = (int64_t)(64 * MiB / sizeof(float));
  st_result_t *x = counting_cuda(n);
  CHECK(x);
  const st_tensor_t *t = st_result_tensor(x, 0);
  CHECK(gk_free() + 64 * MiB <= base);
  st_result_t *r = NULL;
  CHECK_ERR(call_x("scale", "x", t, 2.0, &r), ST_OK);
  st_result_free(r);
  CHECK_ERR(call_x("echo", "value", t, 0, &r), ST_OK);
  CHECK(st_tensor_get(st_result_tensor(r, 0), n - 1) == 2.0 * (double)(n - 1));
  st_result_free(r);
  CHECK(st_tensor_get(t, n - 1) == 2.0 * (double)(n - 1));
  st_result_free(x);
  /* echo's reply mapped the memory once more, kept for reuse (kept
   * arenas) until the bound drops it */
  st_open_cache_keep(0, 0);
  st_open_cache_keep(16, (uint64_t)256 * MiB);
  /* the server keeps its import until the next request says forget */
  double rtt;
  CHECK_RC(st_client_ping(cli, &rtt), ST_OK, cli);
  /* the server imported it once (its argument cache) and returned it once:
   * if it kept any of those the physical memory would stay allocated */
  CHECK(gk_wait_back_to(base, 10000) == 0);
  fprintf(stderr, "   free: %llu MiB before, %llu MiB after\n",
          (unsigned long long)(base / MiB), (unsigned long long)(gk_free() / MiB));
}

static const stt_endpoint_t endpoints[] = {
    {"scale.lua", ep_scale},
    {"echo.lua", STT_EP_ECHO},
    {"sum64.lua", ep_sum},
    {"gpu_only.lua", ep_gpu_only},
    {NULL, NULL},
};

#endif

int main(void) {
  gk_require_device();
#ifdef ST_HAVE_CUDA
  cli = stt_one_worker_client(&srv, endpoints);
  if (!cli) return 1;
  /* A first call creates the worker's context and stream and this
   * client's, before any baseline. */
  st_result_t *warm = counting_cuda(16), *r = NULL;
  if (!warm || call_x("scale", "x", st_result_tensor(warm, 0), 1.0, &r) != ST_OK) {
    fprintf(stderr, "warm-up call failed: %s\n", st_client_error(cli));
    stt_failed++;
  }
  st_result_free(r);
  st_result_free(warm);
  RUN(alloc_gives_zeroed_device_memory);
  RUN(scale_multiplies_the_callers_device_memory_in_place);
  RUN(echo_returns_the_same_device_memory);
  RUN(declared_devices_are_enforced);
  RUN(device_memory_returns_once_the_client_frees_it);
  return stt_client_finish(cli, &srv);
#endif
  return stt_summary();
}

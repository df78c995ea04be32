/* Tensor arguments through libstclient against a real stserver: memory
 * from st_tensor_alloc passes to endpoints without a copy, the endpoint's
 * in-place writes land in the caller's allocation, a returned argument maps
 * the same pages, views (offset, transposed strides) pass as they are,
 * submit carries them too, and every misuse has a clear error: a declared
 * dtype or device that differs, memory that is not shareable, an endpoint
 * that caches, a method that takes no tensors. (CPU memory; the CUDA path
 * is tests/client/test_gpu_targs.c.) */
#include <st/client.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;

static const char ep_scale[] =
    "return st.endpoint{ name = \"scale\", params = { x = st.tensor_param{}, k = 2.5 },\n"
    "  build = function(a) return a.x:mul_(a.k) end }\n";
static const char ep_sum[] =
    "return st.endpoint{ name = \"sum64\",\n"
    "  params = { x = st.tensor_param{ dtype = \"float64\", device = \"cpu\" } },\n"
    "  build = function(a)\n"
    "    local s = 0\n"
    "    for _, v in ipairs(a.x:tolist()) do s = s + v end\n"
    "    return s\n"
    "  end }\n";
static const char ep_gpu_only[] =
    "return st.endpoint{ name = \"gpu_only\", params = { x = st.tensor_param{ device = \"cuda\" } },\n"
    "  build = function(a) return 1 end }\n";
static const char ep_cached[] =
    "return st.endpoint{ name = \"cached\", cache = true, params = { x = st.required },\n"
    "  build = function(a) return 1 end }\n";
static const char ep_shape[] =
    "return st.endpoint{ name = \"shape\", params = { x = st.tensor_param{} },\n"
    "  build = function(a) return { shape = a.x:shape(), stride = a.x:stride(),\n"
    "    first = a.x:get(0, 0), dtype = a.x:dtype(), device = a.x:device() } end }\n";

static const char ep_copy[] =
    "return st.endpoint{ name = \"copy\", params = { x = st.tensor_param{} },\n"
    "  build = function(a) return a.x:clone() end }\n";

static st_client_t *cli;

static void report(const char *what, int rc) {
  if (rc != ST_OK)
    fprintf(stderr, "%s: %s: %s\n", what, st_client_error_name(cli), st_client_error(cli));
}

/* A float32 tensor of `n` elements 0, 1, 2, ... from st_tensor_alloc. */
static st_result_t *counting(int ndim, const int64_t *shape, st_dtype_t dt) {
  st_result_t *r = NULL;
  char err[256];
  int rc = st_tensor_alloc("cpu", dt, ndim, shape, &r, err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "st_tensor_alloc: %s\n", err);
    return NULL;
  }
  const st_tensor_t *t = st_result_tensor(r, 0);
  for (int64_t i = 0; i < t->numel; i++) {
    if (dt == ST_DTYPE_FLOAT64) ((double *)t->data)[i] = (double)i;
    else ((float *)t->data)[i] = (float)i;
  }
  return r;
}

static double num_of(const st_value_t *v) {
  if (v && v->kind == ST_VALUE_INT) return (double)v->as.integer;
  if (v && v->kind == ST_VALUE_FLOAT) return v->as.number;
  return -1;
}

TEST(alloc_gives_a_zeroed_shareable_tensor) {
  st_result_t *r = NULL;
  char err[256];
  int64_t shape[2] = {3, 5};
  CHECK_ERR_MSG(st_tensor_alloc("cpu", ST_DTYPE_INT32, 2, shape, &r, err, sizeof err), ST_OK, err);
  const st_tensor_t *t = st_result_tensor(r, 0);
  CHECK(t && t->numel == 15 && t->nbytes == 60 && t->strides[0] == 5 && t->strides[1] == 1);
  CHECK(t->device == ST_DEVICE_CPU && t->device_index == -1);
  int zero = 1;
  for (int i = 0; i < 15; i++) zero &= ((int32_t *)t->data)[i] == 0;
  CHECK(zero);
  CHECK(st_result_value(r)->kind == ST_VALUE_TENSOR);
  st_result_free(r);
  CHECK_ERR_MSG(st_tensor_alloc("gpu", ST_DTYPE_INT32, 2, shape, &r, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "cuda:N");
  int64_t bad[1] = {-1};
  CHECK_ERR_MSG(st_tensor_alloc("cpu", ST_DTYPE_INT32, 1, bad, &r, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
}

TEST(scale_writes_into_the_callers_memory) {
  int64_t shape[2] = {2, 3};
  st_result_t *x = counting(2, shape, ST_DTYPE_FLOAT32);
  const st_tensor_t *t = st_result_tensor(x, 0);
  st_args_t *a = st_args_new();
  char err[256];
  CHECK_ERR_MSG(st_args_tensor(a, "x", t, err, sizeof err), ST_OK, err);
  st_args_float(a, "k", 3.0);
  st_result_t *r = NULL;
  int rc = st_client_call(cli, "scale", a, &r);
  report("scale", rc);
  CHECK_RC(rc, ST_OK, cli);
  /* in place: the caller's own pointer sees the endpoint's writes */
  float *p = t->data;
  CHECK(p[0] == 0.0f && p[1] == 3.0f && p[5] == 15.0f);
  /* the returned tensor is the same memory, mapped again */
  const st_tensor_t *back = r ? st_result_tensor(r, 0) : NULL;
  CHECK(back && back->numel == 6 && ((float *)back->data)[5] == 15.0f);
  if (back) {
    ((float *)back->data)[0] = 42.0f;
    CHECK(p[0] == 42.0f);
  }
  /* a second call with the same argument map scales again */
  st_result_free(r);
  r = NULL;
  CHECK_RC(st_client_call(cli, "scale", a, &r), ST_OK, cli);
  CHECK(p[5] == 45.0f);
  st_result_free(r);
  st_args_free(a);
  st_result_free(x);
}

TEST(views_pass_with_their_offset_and_strides) {
  int64_t shape[2] = {4, 6};
  st_result_t *x = counting(2, shape, ST_DTYPE_FLOAT32);
  const st_tensor_t *t = st_result_tensor(x, 0);
  /* rows 1..2, transposed: shape {6, 2}, strides {1, 6}, first element 6 */
  int64_t vs[2] = {6, 2}, vst[2] = {1, 6};
  st_tensor_t view = *t;
  view.data = (float *)t->data + 6;
  view.ndim = 2;
  view.shape = vs;
  view.strides = vst;
  st_args_t *a = st_args_new();
  char err[256];
  CHECK_ERR_MSG(st_args_tensor(a, "x", &view, err, sizeof err), ST_OK, err);
  st_result_t *r = NULL;
  int rc = st_client_call(cli, "shape", a, &r);
  report("shape", rc);
  CHECK_RC(rc, ST_OK, cli);
  const st_value_t *v = r ? st_result_value(r) : NULL;
  const st_value_t *sh = st_value_get(v, "shape"), *sd = st_value_get(v, "stride");
  CHECK(sh && sh->kind == ST_VALUE_ARRAY && sh->as.array.len == 2 &&
        num_of(&sh->as.array.items[0]) == 6 && num_of(&sh->as.array.items[1]) == 2);
  CHECK(sd && sd->kind == ST_VALUE_ARRAY && num_of(&sd->as.array.items[0]) == 1 &&
        num_of(&sd->as.array.items[1]) == 6);
  CHECK(num_of(st_value_get(v, "first")) == 6.0);
  const st_value_t *dev = st_value_get(v, "device");
  CHECK(dev && dev->kind == ST_VALUE_STRING && strcmp(dev->as.str.ptr, "cpu") == 0);
  st_result_free(r);
  st_args_free(a);

  /* echo returns the view itself: same geometry, same memory */
  a = st_args_new();
  CHECK_ERR_MSG(st_args_tensor(a, "value", &view, err, sizeof err), ST_OK, err);
  r = NULL;
  CHECK_RC(st_client_call(cli, "echo", a, &r), ST_OK, cli);
  const st_tensor_t *e = r ? st_result_tensor(r, 0) : NULL;
  CHECK(e && e->ndim == 2 && e->shape[0] == 6 && e->strides[1] == 6);
  CHECK(e && st_tensor_get(e, 1) == 12.0);   /* element [0][1] = row 2, col 0 */
  st_result_free(r);
  st_args_free(a);
  st_result_free(x);
}

TEST(declared_dtype_and_device_are_enforced) {
  int64_t n[1] = {4};
  st_result_t *f32 = counting(1, n, ST_DTYPE_FLOAT32);
  st_result_t *f64 = counting(1, n, ST_DTYPE_FLOAT64);
  char err[256];
  st_args_t *a = st_args_new();
  st_args_tensor(a, "x", st_result_tensor(f32, 0), err, sizeof err);
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(cli, "sum64", a, &r), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli),
                 "argument 'x' has dtype float32; the endpoint wants float64");
  CHECK_RC(st_client_call(cli, "gpu_only", a, &r), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "argument 'x' is on cpu; the endpoint wants cuda");
  st_args_free(a);

  a = st_args_new();
  st_args_tensor(a, "x", st_result_tensor(f64, 0), err, sizeof err);
  CHECK_RC(st_client_call(cli, "sum64", a, &r), ST_OK, cli);
  CHECK(r && num_of(st_result_value(r)) == 6.0);
  st_result_free(r);
  r = NULL;
  st_args_free(a);

  /* a plain value where a tensor is declared, and no tensor at all */
  a = st_args_new();
  st_args_int(a, "x", 3);
  CHECK_RC(st_client_call(cli, "sum64", a, &r), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "argument 'x' must be tensor, got integer");
  st_args_free(a);
  CHECK_RC(st_client_call(cli, "sum64", NULL, &r), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "missing required argument 'x'");
  st_result_free(f32);
  st_result_free(f64);
}

TEST(only_shareable_memory_passes) {
  float local[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4}, strides[1] = {1};
  st_tensor_t t = {.name = "", .data = local, .dtype = ST_DTYPE_FLOAT32, .ndim = 1,
                   .shape = shape, .strides = strides, .numel = 4, .nbytes = 16,
                   .device = ST_DEVICE_CPU, .device_index = -1, .device_uuid = ""};
  st_args_t *a = st_args_new();
  char err[256] = "";
  CHECK_ERR_MSG(st_args_tensor(a, "x", &t, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "was not allocated with st_tensor_alloc");
  /* a tensor running past the end of its allocation */
  st_result_t *x = counting(1, shape, ST_DTYPE_FLOAT32);
  st_tensor_t over = *st_result_tensor(x, 0);
  int64_t big[1] = {1 << 20};
  over.shape = big;
  CHECK_ERR_MSG(st_args_tensor(a, "x", &over, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  /* a server's result is not an own allocation either (a copy: an
   * argument returned as it is would be the caller's own memory) */
  st_result_t *r = NULL;
  st_args_t *e = st_args_new();
  st_args_tensor(e, "x", st_result_tensor(x, 0), err, sizeof err);
  CHECK_RC(st_client_call(cli, "copy", e, &r), ST_OK, cli);
  CHECK_ERR_MSG(st_args_tensor(a, "x", st_result_tensor(r, 0), err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  st_result_free(r);
  st_args_free(e);
  st_args_free(a);
  st_result_free(x);
}

TEST(caching_endpoints_and_other_methods_refuse_tensors) {
  int64_t n[1] = {2};
  st_result_t *x = counting(1, n, ST_DTYPE_FLOAT32);
  char err[256];
  st_args_t *a = st_args_new();
  st_args_tensor(a, "x", st_result_tensor(x, 0), err, sizeof err);
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(cli, "cached", a, &r), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "cannot be part of a key");
  int dropped = 0;
  CHECK_RC(st_client_invalidate_call(cli, "cached", a, &dropped), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "tensor arguments go only to call, submit and put");
  CHECK_RC(st_client_rpc(cli, "ping", a, &r), ST_ERR_INVALID_ARGUMENT, cli);
  /* the connection is fine afterwards */
  CHECK_RC(st_client_ping(cli, NULL), ST_OK, cli);
  st_args_free(a);
  st_result_free(x);
}

TEST(submit_carries_tensor_arguments) {
  int64_t n[1] = {3};
  st_result_t *x = counting(1, n, ST_DTYPE_FLOAT32);
  const st_tensor_t *t = st_result_tensor(x, 0);
  char err[256];
  st_args_t *a = st_args_new();
  st_args_tensor(a, "x", t, err, sizeof err);
  st_args_float(a, "k", -1.0);
  uint64_t id = 0;
  int rc = st_client_submit(cli, "scale", a, &id);
  report("submit", rc);
  CHECK_RC(rc, ST_OK, cli);
  st_args_free(a);   /* the task keeps the server's mapping alive */
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(cli, id, 5, &info), ST_OK, cli);
  st_result_free(info);
  st_result_t *r = NULL;
  CHECK_RC(st_client_task_result(cli, id, &r), ST_OK, cli);
  CHECK(((float *)t->data)[2] == -2.0f);
  st_result_free(r);
  st_result_free(x);
}

TEST(the_server_counts_the_descriptors) {
  st_result_t *info = NULL;
  CHECK_RC(st_client_info(cli, &info), ST_OK, cli);
  const st_value_t *c = st_value_get(st_result_value(info), "counters");
  /* each allocation goes once per connection: the server keeps it
   * (test_argcache.c counts exactly) */
  CHECK(num_of(st_value_get(c, "fds_received")) >= 4);
  st_result_free(info);
}

static const stt_endpoint_t endpoints[] = {
    {"scale.lua", ep_scale},
    {"echo.lua", STT_EP_ECHO},
    {"sum64.lua", ep_sum},
    {"gpu_only.lua", ep_gpu_only},
    {"cached.lua", ep_cached},
    {"shape.lua", ep_shape},
    {"copy.lua", ep_copy},
    {NULL, NULL},
};

int main(void) {
  cli = stt_serve_client(&srv, NULL, endpoints);
  RUN(alloc_gives_a_zeroed_shareable_tensor);
  RUN(scale_writes_into_the_callers_memory);
  RUN(views_pass_with_their_offset_and_strides);
  RUN(declared_dtype_and_device_are_enforced);
  RUN(only_shareable_memory_passes);
  RUN(caching_endpoints_and_other_methods_refuse_tensors);
  RUN(submit_carries_tensor_arguments);
  RUN(the_server_counts_the_descriptors);
  return stt_client_finish(cli, &srv);
}

/* A call's result that is its own tensor argument (docs/protocol.md,
 * "Tensor arguments", `{arg: i}`; docs/client.md, "Tensor arguments"):
 *   against a real stserver:
 *   - an endpoint that returns its argument, or a window of it, gives a
 *     result whose tensor is the caller's own memory at the caller's own
 *     address (no new mapping: the address of the argument itself), whose
 *     writes the caller sees, and that keeps the allocation alive after
 *     the caller frees it;
 *   - a result that is not the argument (a copy) comes back as memory of
 *     its own; a result with the argument and a new tensor has both;
 *   - st_result_tensor_is says which results are the caller's own
 *     tensor (the same address and geometry): the returned argument is,
 *     a window, a copy, another index, a view of another shape, NULLs
 *     are not;
 *   - a submitted task's result that is its argument still comes back (a
 *     descriptor of its own);
 *   - a tensor argument a body keeps past its call (an upvalue) is empty
 *     after it: a later call that uses it fails with a clear error, and
 *     the server does not keep the caller's memory for it;
 *   against a scripted server:
 *   - {arg: i} naming an argument the call did not send, an index that is
 *     not an integer, a window past the argument's allocation, or an
 *     {arg} in the reply to a call without tensor arguments: PROTOCOL.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"
#include "fixture.h"

static stt_server_t S;
static fake_server_t fs;

static const stt_endpoint_t endpoints[] = {
    {"same.lua",
     "return st.endpoint{ name = 'same', params = { x = st.tensor_param{}, k = 1 },\n"
     "  build = function(a) return a.x:mul_(a.k) end }\n"},
    {"window.lua",
     "return st.endpoint{ name = 'window', params = { x = st.tensor_param{} },\n"
     "  build = function(a) return a.x:narrow(0, 2, 3) end }\n"},
    {"copy.lua",
     "return st.endpoint{ name = 'copy', params = { x = st.tensor_param{} },\n"
     "  build = function(a) return a.x:clone() end }\n"},
    {"both.lua",
     "return st.endpoint{ name = 'both', params = { x = st.tensor_param{} },\n"
     "  build = function(a) return { arg = a.x, new = st.full{2, value = 9} } end }\n"},
    {"stash.lua",
     "local kept\n"
     "return { st.endpoint{ name = 'stash', params = { x = st.tensor_param{} },\n"
     "           build = function(a) kept = a.x:narrow(0, 1, 2); return 1 end },\n"
     "         st.endpoint{ name = 'use_stashed',\n"
     "           build = function() return kept:get(0) end } }\n"},
    {NULL, NULL},
};

/* A float32 tensor 0, 1, ..., n-1 from st_tensor_alloc. */
static st_result_t *counting(int64_t n) {
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "st_tensor_alloc: %s\n", err);
    return NULL;
  }
  float *p = st_result_tensor(r, 0)->data;
  for (int64_t i = 0; i < n; i++) p[i] = (float)i;
  return r;
}

/* Calls `ep` with x = tensor 0 of `x` (and k when k != 0); the result. */
static st_result_t *call_with(st_client_t *c, const char *ep, st_result_t *x, int k) {
  st_args_t *a = st_args_new();
  char err[256];
  if (st_args_tensor(a, "x", st_result_tensor(x, 0), err, sizeof err) != ST_OK) {
    fprintf(stderr, "st_args_tensor: %s\n", err);
    st_args_free(a);
    return NULL;
  }
  if (k) st_args_int(a, "k", k);
  st_result_t *r = NULL;
  stt_client_report(c, ep, st_client_call(c, ep, a, &r));
  st_args_free(a);
  return r;
}

TEST(a_returned_argument_is_the_callers_own_memory) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *x = counting(8);
  CHECK(x);
  const st_tensor_t *xt = st_result_tensor(x, 0);
  st_result_t *r = call_with(c, "same", x, 3);
  CHECK(r && st_result_tensor_count(r) == 1);
  const st_tensor_t *t = st_result_tensor(r, 0);
  /* The argument's own address: not a second mapping of its pages. */
  CHECK(t->data == xt->data);
  CHECK(t->numel == 8 && ((const float *)t->data)[7] == 21.0f);
  CHECK(st_tensor_is_shareable(t));
  /* One memory: the caller's writes are the result's. */
  ((float *)xt->data)[1] = 100.0f;
  CHECK(((const float *)t->data)[1] == 100.0f);
  /* The result keeps the allocation after the caller frees it. */
  st_result_free(x);
  CHECK(((const float *)t->data)[7] == 21.0f);
  st_result_free(r);
  st_client_close(c);
}

TEST(a_window_of_the_argument_is_at_its_offset) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *x = counting(8);
  CHECK(x);
  st_result_t *r = call_with(c, "window", x, 0);
  CHECK(r);
  const st_tensor_t *t = st_result_tensor(r, 0);
  CHECK(t->data == (char *)st_result_tensor(x, 0)->data + 2 * sizeof(float));
  CHECK(t->numel == 3 && ((const float *)t->data)[0] == 2.0f &&
        ((const float *)t->data)[2] == 4.0f);
  st_result_free(r);
  st_result_free(x);
  st_client_close(c);
}

TEST(a_result_that_is_not_the_argument_is_memory_of_its_own) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *x = counting(4);
  CHECK(x);
  const st_tensor_t *xt = st_result_tensor(x, 0);
  st_result_t *r = call_with(c, "copy", x, 0);
  CHECK(r);
  const st_tensor_t *t = st_result_tensor(r, 0);
  CHECK(t->data != xt->data && ((const float *)t->data)[3] == 3.0f);
  CHECK(!st_tensor_is_shareable(t));
  ((float *)xt->data)[3] = 50.0f;
  CHECK(((const float *)t->data)[3] == 3.0f);
  st_result_free(r);
  /* Both in one result. */
  r = call_with(c, "both", x, 0);
  CHECK(r && st_result_tensor_count(r) == 2);
  const st_tensor_t *arg = st_result_find(r, "arg"), *fresh = st_result_find(r, "new");
  CHECK(arg && fresh && arg->data == xt->data && fresh->data != xt->data);
  CHECK(((const float *)fresh->data)[1] == 9.0f && ((const float *)arg->data)[3] == 50.0f);
  st_result_free(r);
  st_result_free(x);
  st_client_close(c);
}

TEST(tensor_is_names_the_callers_own_tensor) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *x = counting(8);
  CHECK(x);
  const st_tensor_t *xt = st_result_tensor(x, 0);
  st_result_t *r = call_with(c, "same", x, 1);
  CHECK(r);
  CHECK(st_result_tensor_is(r, 0, xt) == 1);
  CHECK(st_result_tensor_is(r, 1, xt) == 0);          /* no such tensor */
  CHECK(st_result_tensor_is(NULL, 0, xt) == 0);
  CHECK(st_result_tensor_is(r, 0, NULL) == 0);
  /* The same address with another shape, stride, dtype or device. */
  st_tensor_t v = *xt;
  int64_t dims[2] = {4, 1};
  v.shape = &dims[0];
  v.strides = &dims[1];
  CHECK(st_result_tensor_is(r, 0, &v) == 0);
  dims[0] = 8;
  dims[1] = 2;
  CHECK(st_result_tensor_is(r, 0, &v) == 0);
  dims[1] = 1;
  CHECK(st_result_tensor_is(r, 0, &v) == 1);
  v.dtype = ST_DTYPE_INT32;
  CHECK(st_result_tensor_is(r, 0, &v) == 0);
  v.dtype = xt->dtype;
  v.device = ST_DEVICE_CUDA;
  v.device_index = 0;
  CHECK(st_result_tensor_is(r, 0, &v) == 0);
  st_result_free(r);
  /* A window of it, a copy of it: not the caller's tensor. */
  r = call_with(c, "window", x, 0);
  CHECK(r && st_result_tensor_is(r, 0, xt) == 0);
  st_result_free(r);
  r = call_with(c, "copy", x, 0);
  CHECK(r && st_result_tensor_is(r, 0, xt) == 0);
  st_result_free(r);
  r = call_with(c, "both", x, 0);
  CHECK(r && st_result_tensor_count(r) == 2);
  size_t arg = st_result_find(r, "arg") == st_result_tensor(r, 0) ? 0 : 1;
  CHECK(st_result_tensor_is(r, arg, xt) == 1 && st_result_tensor_is(r, 1 - arg, xt) == 0);
  st_result_free(r);
  st_result_free(x);
  st_client_close(c);
}

TEST(a_task_result_that_is_the_argument_still_comes_back) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *x = counting(4);
  CHECK(x);
  st_args_t *a = st_args_new();
  char err[256];
  CHECK_ERR_MSG(st_args_tensor(a, "x", st_result_tensor(x, 0), err, sizeof err), ST_OK, err);
  st_args_int(a, "k", 2);
  uint64_t id = 0;
  CHECK_RC(st_client_submit(c, "same", a, &id), ST_OK, c);
  st_args_free(a);
  st_result_t *info = NULL, *r = NULL;
  CHECK_RC(st_client_task_wait(c, id, 10, &info), ST_OK, c);
  st_result_free(info);
  CHECK_RC(st_client_task_result(c, id, &r), ST_OK, c);
  CHECK(r && st_result_tensor_count(r) == 1);
  CHECK(((const float *)st_result_tensor(r, 0)->data)[3] == 6.0f);
  st_result_free(r);
  st_result_free(x);
  st_client_close(c);
}

TEST(an_argument_kept_past_its_call_is_empty) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *x = counting(4);
  CHECK(x);
  st_result_t *r = call_with(c, "stash", x, 0);
  CHECK(r);
  st_result_free(r);
  r = NULL;
  CHECK_RC(st_client_call(c, "use_stashed", NULL, &r), ST_ERR_ENDPOINT, c);
  CHECK_CONTAINS(st_client_error(c), "on its tensor argument");
  st_result_free(x);
  st_client_close(c);
}

/* ---------------------------------------------------------- scripted */

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  char ep[64];
  fake_param_str(params, "endpoint", ep, sizeof ep);
  /* The call's one argument: 4 float32 (16 bytes) in a page. */
  if (strcmp(ep, "ok") == 0)
    return fake_replyf(conn, id, NULL, 0,
                       "{value: tensor(0, 4, 'float32', [3], [1]), arenas: [{arg: 0}]}");
  if (strcmp(ep, "other_index") == 0)
    return fake_replyf(conn, id, NULL, 0,
                       "{value: tensor(0, 0, 'float32', [1], [1]), arenas: [{arg: 1}]}");
  if (strcmp(ep, "not_an_index") == 0)
    return fake_replyf(conn, id, NULL, 0,
                       "{value: tensor(0, 0, 'float32', [1], [1]), arenas: [{arg: 'x'}]}");
  if (strcmp(ep, "past_the_end") == 0)
    return fake_replyf(conn, id, NULL, 0,
                       "{value: tensor(0, 4096, 'float32', [4], [1]), arenas: [{arg: 0}]}");
  if (strcmp(ep, "huge_window") == 0)
    return fake_replyf(conn, id, NULL, 0,
                       "{value: tensor(0, 0, 'float32', [100000000], [1]), arenas: [{arg: 0}]}");
  return fake_replyf(conn, id, NULL, 0,
                     "{value: tensor(0, 0, 'float32', [1], [1]), arenas: [{arg: 0}]}");
}

TEST(a_hostile_arg_reference_is_protocol) {
  st_result_t *x = counting(4);
  CHECK(x);
  /* A well-formed one maps the caller's memory at the window's offset. */
  OPEN_CLIENT(ok, fs.path);
  st_result_t *r = call_with(ok, "ok", x, 0);
  CHECK(r && st_result_tensor(r, 0)->data == (char *)st_result_tensor(x, 0)->data + 4);
  st_result_free(r);
  st_client_close(ok);
  static const struct {
    const char *ep, *msg;
  } bad[] = {
      {"other_index", "names tensor argument 1, but the call sent 1"},
      {"not_an_index", "names tensor argument (not an index)"},
      {"past_the_end", "reaches beyond its arena"},
      {"huge_window", "reaches beyond its arena"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    OPEN_CLIENT(c, fs.path);
    st_args_t *a = st_args_new();
    char err[256];
    CHECK_ERR_MSG(st_args_tensor(a, "x", st_result_tensor(x, 0), err, sizeof err), ST_OK, err);
    r = NULL;
    CHECK_RC(st_client_call(c, bad[i].ep, a, &r), ST_ERR_PROTOCOL, c);
    CHECK(r == NULL);
    CHECK_CONTAINS(st_client_error(c), bad[i].msg);
    st_args_free(a);
    st_client_close(c);
  }
  /* A call that sent no tensor argument. */
  OPEN_CLIENT(c, fs.path);
  r = NULL;
  CHECK_RC(st_client_call(c, "no_args", NULL, &r), ST_ERR_PROTOCOL, c);
  CHECK_CONTAINS(st_client_error(c), "names tensor argument 0, but the call sent 0");
  st_client_close(c);
  /* The caller's memory is untouched and still its own. */
  CHECK(((const float *)st_result_tensor(x, 0)->data)[3] == 3.0f);
  st_result_free(x);
}

int main(void) {
  stt_server_setup(&S, "workers = 1,", endpoints);
  fs.on_request = on_request;
  fake_start(&fs);
  RUN(a_returned_argument_is_the_callers_own_memory);
  RUN(a_window_of_the_argument_is_at_its_offset);
  RUN(a_result_that_is_not_the_argument_is_memory_of_its_own);
  RUN(tensor_is_names_the_callers_own_tensor);
  RUN(a_task_result_that_is_the_argument_still_comes_back);
  RUN(an_argument_kept_past_its_call_is_empty);
  RUN(a_hostile_arg_reference_is_protocol);
  fake_finish(&fs);
  return stt_server_finish(&S);
}

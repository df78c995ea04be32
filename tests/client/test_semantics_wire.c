/* The task, object, invalidation and reload wrappers of libstclient
 * against a scripted server: the exact request each one sends (method and
 * named parameters), how each reply is read (task ids, task info maps,
 * the `object` of a call-like reply, release counts, booleans and counts),
 * server errors passed through, replies of the wrong shape, the wait
 * timeout extending the client's own, and ensure_live with a broken
 * connection and a server that is gone. */
#include <math.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"

static fake_server_t fs;

/* The last request other than hello/ping, as msgpack_object_print text. */
static char last_method[64];
static char last_params[1024];
static int malformed; /* answer with replies of the wrong shape */
static int wait_delay_ms;

/* A task info map (stt_pack text, then the id and the status). */
#define TASK_INFO                                                                      \
  "{id: %llu, endpoint: 'slow', status: '%s', created_at: 1700000000.5, "              \
  "started_at: 1700000001.0, completed_at: nil, error: nil, progress: 0.25, "          \
  "note: 'loading', object_id: nil}"

/* A call-like reply: a 4-float tensor, and an object unless `plain`. */
static int reply_result(int conn, uint32_t id, int plain) {
  static const float data[4] = {1, 2, 3, 4};
  int fd = fake_memfd(4096, data, sizeof data, 1);
  char object[300] = "";
  if (!plain)
    snprintf(object, sizeof object,
             ", object: {id: 42, server_id: 'fake-%d', cache_key: 'k:3', cached: true, "
             "managed: true, lease: true, refcount: 2, bytes: 4096, device: 'cpu'}",
             (int)getpid());
  int rc = fake_replyf(conn, id, &fd, 1,
                       "{value: tensor(0, 0, 'float32', [4], [1]), arenas: [{fd: 0, bytes: 4096, "
                       "device: 'cpu', backend: 'memfd', id: 900}]%s}",
                       object);
  close(fd);
  return rc;
}

static uint64_t param_u64(const msgpack_object *params, const char *key) {
  if (!params || params->type != MSGPACK_OBJECT_MAP) return 0;
  for (uint32_t i = 0; i < params->via.map.size; i++) {
    const msgpack_object_kv *kv = &params->via.map.ptr[i];
    if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
        memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size) == 0 &&
        kv->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER)
      return kv->val.via.u64;
  }
  return 0;
}

/* The methods whose reply is always the same (stt_pack text), and the one
 * of the wrong shape sent when `malformed` is set (NULL: the same). */
static const struct {
  const char *method, *reply, *malformed;
} fixed[] = {
    {"submit", "{task_id: 7}", "{id: 7}"},
    {"release", "{released: true, destroyed: false, refcount: 1}", "true"},
    {"objects", "[]", NULL},
    {"invalidate_call", "true", "1"},
    {"invalidate_endpoint", "3", NULL},
    {"reload", "{ok: false, generation: 1, error: 'x.lua:2: unexpected symbol', changed: [], "
               "added: [], removed: []}", NULL},
};

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  snprintf(last_method, sizeof last_method, "%s", method);
  if (params)
    msgpack_object_print_buffer(last_params, sizeof last_params, *params);
  else
    snprintf(last_params, sizeof last_params, "none");
  uint64_t task = param_u64(params, "task_id"), object = param_u64(params, "object_id");
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    if (strcmp(method, fixed[i].method) == 0)
      return fake_replyf(conn, id, NULL, 0, "%s",
                         malformed && fixed[i].malformed ? fixed[i].malformed : fixed[i].reply);
  if (strcmp(method, "tasks") == 0)
    return fake_replyf(conn, id, NULL, 0, "[" TASK_INFO ", " TASK_INFO "]", 8ull, "running", 7ull,
                       "completed");
  if (strcmp(method, "status") == 0 || strcmp(method, "cancel") == 0) {
    if (task != 7) return fake_error(conn, id, 17, "NOT_FOUND", "no task 8");
    return fake_replyf(conn, id, NULL, 0, TASK_INFO, (unsigned long long)task,
                       strcmp(method, "cancel") == 0 ? "cancelled" : "running");
  }
  if (strcmp(method, "wait") == 0) {
    if (wait_delay_ms) {
      struct timespec ts = {0, (long)wait_delay_ms * 1000000};
      nanosleep(&ts, NULL);
    }
    return fake_replyf(conn, id, NULL, 0, TASK_INFO, (unsigned long long)task, "completed");
  }
  if (strcmp(method, "result") == 0) {
    if (task == 9) return fake_error(conn, id, 7, "ENDPOINT", "slow.lua:3: boom");
    /* an object without a usable id */
    if (task == 10) return fake_replyf(conn, id, NULL, 0, "{value: 1, object: {id: 'x'}}");
    return reply_result(conn, id, task == 8);
  }
  if (strcmp(method, "object_info") == 0)
    return fake_replyf(conn, id, NULL, 0, "{id: %llu, endpoint: 'lin'}",
                       (unsigned long long)object);
  if (strcmp(method, "ensure_live") == 0) {
    if (object == 1) return fake_replyf(conn, id, NULL, 0, "true");
    return fake_error(conn, id, 8, "STALE_HANDLE", "object 2 is gone");
  }
  if (strcmp(method, "call") == 0) return reply_result(conn, id, 1);
  return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
}

static const char *str_of(const st_value_t *v) {
  return v && v->kind == ST_VALUE_STRING ? v->as.str.ptr : "(not a string)";
}

TEST(submit_sends_endpoint_and_args) {
  OPEN_CLIENT(c, fs.path);
  st_args_t *a = st_args_new();
  st_args_int(a, "n", 3);
  uint64_t task = 99;
  CHECK_RC(st_client_submit(c, "slow", a, &task), ST_OK, c);
  CHECK_EQ_INT(task, 7);
  CHECK_STR_EQ(last_method, "submit");
  CHECK_STR_EQ(last_params, "{\"endpoint\"=>\"slow\", \"args\"=>{\"n\"=>3}}");
  CHECK_RC(st_client_submit(c, "slow", NULL, &task), ST_OK, c);
  CHECK_STR_EQ(last_params, "{\"endpoint\"=>\"slow\", \"args\"=>{}}");
  malformed = 1;
  CHECK_RC(st_client_submit(c, "slow", NULL, &task), ST_ERR_PROTOCOL, c);
  malformed = 0;
  CHECK_EQ_INT(task, 0);
  CHECK_CONTAINS(st_client_error(c), "no task_id");
  CHECK_RC(st_client_submit(c, "", NULL, &task), ST_ERR_INVALID_ARGUMENT, c);
  CHECK_RC(st_client_submit(c, "slow", NULL, NULL), ST_ERR_INVALID_ARGUMENT, c);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_args_free(a);
  st_client_close(c);
}

TEST(status_and_cancel_give_task_info) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_status(c, 7, &info), ST_OK, c);
  CHECK_STR_EQ(last_method, "status");
  CHECK_STR_EQ(last_params, "{\"task_id\"=>7}");
  const st_value_t *v = st_result_value(info);
  CHECK_EQ_INT(v->kind, ST_VALUE_MAP);
  CHECK_STR_EQ(str_of(st_value_get(v, "status")), "running");
  CHECK_STR_EQ(str_of(st_value_get(v, "note")), "loading");
  CHECK(st_value_get(v, "progress")->as.number == 0.25);
  CHECK_EQ_INT(st_value_get(v, "completed_at")->kind, ST_VALUE_NIL);
  st_object_info_t o;
  CHECK_ERR(st_result_object(info, &o), ST_ERR_NOT_FOUND);
  st_result_free(info);
  CHECK_RC(st_client_task_status(c, 8, &info), ST_ERR_NOT_FOUND, c);
  CHECK(info == NULL);
  CHECK_STR_EQ(st_client_error_name(c), "NOT_FOUND");
  CHECK_STR_EQ(st_client_error(c), "no task 8");
  CHECK_RC(st_client_task_cancel(c, 7, &info), ST_OK, c);
  CHECK_STR_EQ(last_method, "cancel");
  CHECK_STR_EQ(last_params, "{\"task_id\"=>7}");
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(info), "status")), "cancelled");
  st_result_free(info);
  CHECK_RC(st_client_task_cancel(c, 7, NULL), ST_OK, c); /* info not wanted */
  st_client_close(c);
}

TEST(wait_sends_its_timeout_and_outlasts_the_client_limit) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(c, 7, 0.25, &info), ST_OK, c);
  CHECK_STR_EQ(last_method, "wait");
  CHECK_STR_EQ(last_params, "{\"task_id\"=>7, \"timeout\"=>0.250000}");
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(info), "status")), "completed");
  st_result_free(info);
  CHECK_RC(st_client_task_wait(c, 7, -1, &info), ST_OK, c);
  CHECK_STR_EQ(last_params, "{\"task_id\"=>7}"); /* the server's default */
  st_result_free(info);
  CHECK_RC(st_client_task_wait(c, 7, NAN, &info), ST_ERR_INVALID_ARGUMENT, c);
  /* The server answers after 400 ms, within the wait's 1 s: a client
   * limit of 200 ms must not cut the wait short. */
  st_client_set_timeout(c, 200);
  wait_delay_ms = 400;
  CHECK_RC(st_client_task_wait(c, 7, 1.0, &info), ST_OK, c);
  wait_delay_ms = 0;
  st_result_free(info);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

TEST(task_result_maps_like_call_and_names_the_object) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_RC(st_client_task_result(c, 7, &r), ST_OK, c);
  CHECK_STR_EQ(last_method, "result");
  CHECK_STR_EQ(last_params, "{\"task_id\"=>7}");
  const st_tensor_t *t = st_result_find(r, "");
  CHECK(t && t->numel == 4);
  CHECK(st_tensor_get(t, 3) == 4);
  CHECK_EQ_INT(st_result_value(r)->kind, ST_VALUE_TENSOR); /* the value, unwrapped */
  st_object_info_t o;
  memset(&o, 0, sizeof o);
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  CHECK_EQ_INT(o.id, 42);
  CHECK_STR_EQ(o.server_id, st_client_server_id(c));
  CHECK_STR_EQ(o.cache_key, "k:3");
  CHECK_STR_EQ(o.device, "cpu");
  CHECK_EQ_INT(o.cached, 1);
  CHECK_EQ_INT(o.managed, 1);
  CHECK_EQ_INT(o.lease, 1);
  CHECK_EQ_INT(o.refcount, 2);
  CHECK_EQ_INT(o.bytes, 4096);
  st_client_close(c);
  CHECK_ERR(st_result_object(r, &o), ST_OK); /* borrowed from r, not c */
  CHECK_STR_EQ(o.cache_key, "k:3");
  st_result_free(r);

  c = stt_client_open(fs.path);
  CHECK(c);
  CHECK_RC(st_client_task_result(c, 8, &r), ST_OK, c); /* plain: no object */
  CHECK_ERR(st_result_object(r, &o), ST_ERR_NOT_FOUND);
  CHECK_ERR(st_result_object(r, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_result_object(NULL, &o), ST_ERR_INVALID_ARGUMENT);
  st_result_free(r);
  CHECK_RC(st_client_call(c, "x", NULL, &r), ST_OK, c);
  CHECK_ERR(st_result_object(r, &o), ST_ERR_NOT_FOUND);
  st_result_free(r);
  CHECK_RC(st_client_task_result(c, 9, &r), ST_ERR_ENDPOINT, c);
  CHECK(r == NULL);
  CHECK_STR_EQ(st_client_error(c), "slow.lua:3: boom");
  CHECK_RC(st_client_task_result(c, 10, &r), ST_ERR_PROTOCOL, c);
  CHECK(r == NULL);
  CHECK_CONTAINS(st_client_error(c), "'object' has no id");
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c); /* the stream stayed in step */
  st_client_close(c);
}

TEST(tasks_with_and_without_a_filter) {
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_RC(st_client_tasks(c, NULL, 0, 0, &r), ST_OK, c);
  CHECK_STR_EQ(last_method, "tasks");
  CHECK_STR_EQ(last_params, "none");
  CHECK_EQ_INT(st_result_value(r)->kind, ST_VALUE_ARRAY);
  CHECK_EQ_INT(st_result_value(r)->as.array.len, 2);
  st_result_free(r);
  CHECK_RC(st_client_tasks(c, "running", 0, 0, &r), ST_OK, c);
  CHECK_STR_EQ(last_params, "{\"status\"=>\"running\"}");
  st_result_free(r);
  CHECK_RC(st_client_tasks(c, NULL, 42, 10, &r), ST_OK, c);
  CHECK_STR_EQ(last_params, "{\"before\"=>42, \"limit\"=>10}");
  st_result_free(r);
  st_client_close(c);
}

TEST(release_reads_its_three_fields) {
  OPEN_CLIENT(c, fs.path);
  int released = -1, destroyed = -1;
  int64_t refcount = -1;
  CHECK_RC(st_client_release(c, 42, &released, &destroyed, &refcount), ST_OK, c);
  CHECK_STR_EQ(last_method, "release");
  CHECK_STR_EQ(last_params, "{\"object_id\"=>42}");
  CHECK_EQ_INT(released, 1);
  CHECK_EQ_INT(destroyed, 0);
  CHECK_EQ_INT(refcount, 1);
  CHECK_RC(st_client_release(c, 42, NULL, NULL, NULL), ST_OK, c);
  malformed = 1;
  CHECK_RC(st_client_release(c, 42, &released, &destroyed, &refcount), ST_ERR_PROTOCOL, c);
  malformed = 0;
  CHECK_EQ_INT(released, 0);
  st_result_t *r = NULL;
  CHECK_RC(st_client_object_info(c, 42, &r), ST_OK, c);
  CHECK_STR_EQ(last_method, "object_info");
  CHECK_STR_EQ(last_params, "{\"object_id\"=>42}");
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(r), "endpoint")), "lin");
  st_result_free(r);
  CHECK_RC(st_client_objects(c, &r), ST_OK, c);
  CHECK_STR_EQ(last_method, "objects");
  CHECK_EQ_INT(st_result_value(r)->kind, ST_VALUE_ARRAY);
  st_result_free(r);
  st_client_close(c);
}

TEST(invalidation_and_reload) {
  OPEN_CLIENT(c, fs.path);
  st_args_t *a = st_args_new();
  st_args_int(a, "n", 1);
  int dropped = -1;
  CHECK_RC(st_client_invalidate_call(c, "lin", a, &dropped), ST_OK, c);
  CHECK_STR_EQ(last_method, "invalidate_call");
  CHECK_STR_EQ(last_params, "{\"endpoint\"=>\"lin\", \"args\"=>{\"n\"=>1}}");
  CHECK_EQ_INT(dropped, 1);
  malformed = 1;
  CHECK_RC(st_client_invalidate_call(c, "lin", a, &dropped), ST_ERR_PROTOCOL, c);
  malformed = 0;
  st_args_free(a);
  int64_t count = -1;
  CHECK_RC(st_client_invalidate_endpoint(c, "lin", &count), ST_OK, c);
  CHECK_STR_EQ(last_method, "invalidate_endpoint");
  CHECK_STR_EQ(last_params, "{\"endpoint\"=>\"lin\"}");
  CHECK_EQ_INT(count, 3);
  CHECK_RC(st_client_invalidate_endpoint(c, NULL, &count), ST_ERR_INVALID_ARGUMENT, c);
  st_result_t *r = NULL;
  CHECK_RC(st_client_reload(c, &r), ST_OK, c);
  CHECK_STR_EQ(last_method, "reload");
  const st_value_t *ok = st_value_get(st_result_value(r), "ok");
  CHECK(ok && ok->kind == ST_VALUE_BOOL && !ok->as.boolean);
  CHECK_CONTAINS(str_of(st_value_get(st_result_value(r), "error")), "x.lua:2");
  st_result_free(r);
  st_client_close(c);
}

TEST(ensure_live_asks_with_the_server_id) {
  OPEN_CLIENT(c, fs.path);
  char want[160];
  snprintf(want, sizeof want, "{\"object_id\"=>1, \"server_id\"=>\"%s\"}", st_client_server_id(c));
  CHECK_RC(st_client_ensure_live(c, 1, NULL), ST_OK, c);
  CHECK_STR_EQ(last_method, "ensure_live");
  CHECK_STR_EQ(last_params, want);
  CHECK_RC(st_client_ensure_live(c, 1, st_client_server_id(c)), ST_OK, c);
  CHECK_RC(st_client_ensure_live(c, 2, NULL), ST_ERR_STALE_HANDLE, c);
  CHECK_STR_EQ(st_client_error_name(c), "STALE_HANDLE");
  CHECK_STR_EQ(st_client_error(c), "object 2 is gone");
  /* A handle of another server process is stale without asking. */
  int before = fs.requests;
  CHECK_RC(st_client_ensure_live(c, 1, "another-server"), ST_ERR_STALE_HANDLE, c);
  CHECK_EQ_INT(fs.requests, before);
  CHECK_CONTAINS(st_client_error(c), "belongs to server another-server");
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

TEST(ensure_live_reconnects_a_broken_connection) {
  OPEN_CLIENT(c, fs.path);
  /* A timed-out wait closes the connection (its reply would come late). */
  st_client_set_timeout(c, 50);
  wait_delay_ms = 300;
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(c, 7, 0.0, &info), ST_ERR_TIMEOUT, c);
  wait_delay_ms = 0;
  CHECK_RC(st_client_ping(c, NULL), ST_ERR_IO, c);
  CHECK_RC(st_client_ensure_live(c, 1, NULL), ST_OK, c);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c); /* usable again */
  st_client_close(c);
}

TEST(ensure_live_with_the_server_gone_fails_fast) {
  fake_server_t f2 = {.on_request = on_request};
  fake_start(&f2);
  OPEN_CLIENT(c, f2.path);
  CHECK_RC(st_client_ensure_live(c, 1, NULL), ST_OK, c);
  fake_stop(&f2); /* closes our connection and removes the socket */
  double t0 = stt_now_ms();
  CHECK_RC(st_client_ensure_live(c, 1, NULL), ST_ERR_IO, c);
  CHECK(stt_now_ms() - t0 < 1000);
  char want[200];
  snprintf(want, sizeof want, "server at %s is not running", f2.path);
  CHECK_CONTAINS(st_client_error(c), want);
  /* And again, on the already broken connection. */
  t0 = stt_now_ms();
  CHECK_RC(st_client_ensure_live(c, 1, NULL), ST_ERR_IO, c);
  CHECK(stt_now_ms() - t0 < 1000);
  CHECK_CONTAINS(st_client_error(c), "is not running");
  st_client_close(c);
}

TEST(null_arguments) {
  st_result_t *r = (st_result_t *)1;
  uint64_t id = 5;
  CHECK_ERR(st_client_submit(NULL, "x", NULL, &id), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_task_status(NULL, 1, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK(r == NULL);
  CHECK_ERR(st_client_task_wait(NULL, 1, 1, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_task_result(NULL, 1, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_task_cancel(NULL, 1, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_tasks(NULL, NULL, 0, 0, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_release(NULL, 1, NULL, NULL, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_object_info(NULL, 1, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_ensure_live(NULL, 1, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_objects(NULL, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_invalidate_call(NULL, "x", NULL, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_invalidate_endpoint(NULL, "x", NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_client_reload(NULL, &r), ST_ERR_INVALID_ARGUMENT);
}

int main(void) {
  fs.on_request = on_request;
  fake_start(&fs);
  int fds0 = fake_count_fds();
  RUN(submit_sends_endpoint_and_args);
  RUN(status_and_cancel_give_task_info);
  RUN(wait_sends_its_timeout_and_outlasts_the_client_limit);
  RUN(task_result_maps_like_call_and_names_the_object);
  RUN(tasks_with_and_without_a_filter);
  RUN(release_reads_its_three_fields);
  RUN(invalidation_and_reload);
  RUN(ensure_live_asks_with_the_server_id);
  RUN(ensure_live_reconnects_a_broken_connection);
  RUN(ensure_live_with_the_server_gone_fails_fast);
  RUN(null_arguments);
  fake_finish(&fs);
  int fds1 = fake_count_fds();
  if (fds1 != fds0 - 3) { /* fake_stop closed the listener and its pipe */
    fprintf(stderr, "descriptor leak: %d open before, %d after\n", fds0, fds1);
    stt_failed++;
  }
  return stt_summary();
}

/* libstclient's task, object, invalidation and reload calls against a real
 * stserver (tests/kit/fixture.h): managed calls give an object with a
 * lease, leases are counted per connection and given back by release
 * (idempotent) and by closing, ensure_live turns stale after release and
 * fails fast when the server is killed, cache invalidation, submit / wait
 * / result with progress, cancel (pending and running), failed tasks,
 * task-execution endpoints, and reload. */
#include <signal.h>
#include <st/client.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;

static const stt_endpoint_t endpoints[] = {
    {"lin.lua", STT_EP_LIN},
    {"owned.lua",
     "return st.endpoint{ name = \"owned\", managed = true, params = { n = 3 },\n"
     "  build = function(a) return st.arange{a.n, dtype = \"float32\"} end }\n"},
    {"cached.lua",
     "return st.endpoint{ name = \"cached\", cache = true, params = { n = 2 },\n"
     "  build = function(a) return st.arange{a.n, dtype = \"float32\"} end }\n"},
    {"plain.lua", STT_EP_PLAIN_ARANGE},
    {"steps.lua", STT_EP_STEPS},
    {"sleeper.lua", STT_EP_SLEEPER},
    {"bad.lua", STT_EP_BAD},
    {"as_task.lua",
     "return st.endpoint{ name = \"as_task\", execution = \"task\",\n"
     "  build = function(a) return { ok = true } end }\n"},
    {NULL, NULL},
};

/* Calls `name` with one integer argument (key NULL: none). */
static st_result_t *call_n(st_client_t *c, const char *name, const char *key, int64_t v) {
  st_args_t *a = st_args_new();
  if (key) st_args_int(a, key, v);
  st_result_t *r = NULL;
  stt_client_report(c, name, st_client_call(c, name, a, &r));
  st_args_free(a);
  return r;
}

static uint64_t submit_n(st_client_t *c, const char *name, const char *key, int64_t v) {
  st_args_t *a = st_args_new();
  if (key) st_args_int(a, key, v);
  uint64_t id = 0;
  stt_client_report(c, name, st_client_submit(c, name, a, &id));
  st_args_free(a);
  return id;
}

static const char *str_of(const st_value_t *v) {
  return v && v->kind == ST_VALUE_STRING ? v->as.str.ptr : "(not a string)";
}

static double num_of(const st_value_t *v) {
  if (v && v->kind == ST_VALUE_INT) return (double)v->as.integer;
  if (v && v->kind == ST_VALUE_FLOAT) return v->as.number;
  return -1;
}

/* The status of task `id` now ("" on failure). */
static const char *task_status(st_client_t *c, uint64_t id, char *buf, size_t len) {
  st_result_t *info = NULL;
  buf[0] = '\0';
  if (st_client_task_status(c, id, &info) == ST_OK)
    snprintf(buf, len, "%s", str_of(st_value_get(st_result_value(info), "status")));
  st_result_free(info);
  return buf;
}

/* Polls until task `id` has status `want` (5 s limit). 1 when it did. */
static int wait_status(st_client_t *c, uint64_t id, const char *want) {
  char buf[32];
  double end = stt_now_ms() + 5000;
  while (stt_now_ms() < end) {
    if (strcmp(task_status(c, id, buf, sizeof buf), want) == 0) return 1;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "task %llu: status %s, wanted %s\n", (unsigned long long)id, buf, want);
  return 0;
}

/* Refcount of object `id` by object_info (-1 when it fails). */
static int64_t refcount_of(st_client_t *c, uint64_t id) {
  st_result_t *r = NULL;
  if (st_client_object_info(c, id, &r) != ST_OK) return -1;
  int64_t n = (int64_t)num_of(st_value_get(st_result_value(r), "refcount"));
  st_result_free(r);
  return n;
}

TEST(managed_call_gives_an_object_with_a_lease) {
  st_client_t *c = stt_client_open(srv.socket), *c2 = stt_client_open(srv.socket);
  CHECK(c && c2);
  st_result_t *r = call_n(c, "lin", "n", 5);
  CHECK(r);
  st_object_info_t o;
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  CHECK(o.id > 0);
  CHECK_STR_EQ(o.server_id, st_client_server_id(c));
  CHECK_STR_EQ(o.cache_key, "lin:5");
  CHECK_STR_EQ(o.device, "cpu");
  CHECK_EQ_INT(o.lease, 1);
  CHECK_EQ_INT(o.managed, 1);
  CHECK_EQ_INT(o.cached, 1);
  CHECK_EQ_INT(o.refcount, 1);
  CHECK(o.bytes >= 20);
  CHECK(st_tensor_get(st_result_tensor(r, 0), 4) == 4);
  /* The cache gives the same object again: one more lease each time. */
  st_result_t *r2 = call_n(c, "lin", "n", 5), *r3 = call_n(c2, "lin", "n", 5);
  CHECK(r2 && r3);
  st_object_info_t o2, o3;
  CHECK_ERR(st_result_object(r2, &o2), ST_OK);
  CHECK_ERR(st_result_object(r3, &o3), ST_OK);
  CHECK_EQ_INT(o2.id, o.id);
  CHECK_EQ_INT(o3.id, o.id);
  CHECK_EQ_INT(o2.refcount, 2);
  CHECK_EQ_INT(o3.refcount, 3);
  CHECK(st_result_tensor(r3, 0)->data == st_result_tensor(r, 0)->data); /* one mapping */
  st_result_t *info = NULL;
  CHECK_RC(st_client_object_info(c, o.id, &info), ST_OK, c);
  const st_value_t *v = st_result_value(info);
  CHECK_STR_EQ(str_of(st_value_get(v, "endpoint")), "lin");
  CHECK_STR_EQ(str_of(st_value_get(v, "cache_key")), "lin:5");
  CHECK(num_of(st_value_get(v, "refcount")) == 3);
  CHECK(num_of(st_value_get(v, "created_at")) > 1e9);
  st_result_free(info);
  st_result_t *list = NULL;
  CHECK_RC(st_client_objects(c, &list), ST_OK, c);
  const st_value_t *l = st_result_value(list);
  CHECK_EQ_INT(l->kind, ST_VALUE_ARRAY);
  int found = 0;
  for (size_t i = 0; i < l->as.array.len; i++)
    found += num_of(st_value_get(&l->as.array.items[i], "id")) == (double)o.id;
  CHECK_EQ_INT(found, 1);
  st_result_free(list);
  /* Releases: c holds two leases, then none (idempotent). */
  int released, destroyed;
  int64_t left;
  CHECK_RC(st_client_release(c, o.id, &released, &destroyed, &left), ST_OK, c);
  CHECK_EQ_INT(released, 1);
  CHECK_EQ_INT(destroyed, 0);
  CHECK_EQ_INT(left, 2);
  CHECK_RC(st_client_release(c, o.id, &released, &destroyed, &left), ST_OK, c);
  CHECK_EQ_INT(left, 1);
  CHECK_RC(st_client_release(c, o.id, &released, &destroyed, &left), ST_OK, c);
  CHECK_EQ_INT(released, 0);
  CHECK_EQ_INT(left, 1);
  /* Closing c2 gives its lease back; the cache keeps the object. */
  st_client_close(c2);
  double end = stt_now_ms() + 5000;
  while (refcount_of(c, o.id) != 0 && stt_now_ms() < end) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  CHECK_EQ_INT(refcount_of(c, o.id), 0);
  CHECK_RC(st_client_ensure_live(c, o.id, o.server_id), ST_OK, c);
  st_result_free(r);
  st_result_free(r2);
  st_result_free(r3);
  st_client_close(c);
}

TEST(release_is_idempotent_and_ensure_live_turns_stale) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = call_n(c, "owned", NULL, 0);
  CHECK(r);
  st_object_info_t o;
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  CHECK_EQ_INT(o.lease, 1);
  CHECK_EQ_INT(o.cached, 0);
  CHECK_STR_EQ(o.cache_key, "");
  CHECK_RC(st_client_ensure_live(c, o.id, NULL), ST_OK, c);
  int released = -1, destroyed = -1;
  int64_t left = -1;
  CHECK_RC(st_client_release(c, o.id, &released, &destroyed, &left), ST_OK, c);
  CHECK_EQ_INT(released, 1);
  CHECK_EQ_INT(destroyed, 1);
  CHECK_EQ_INT(left, 0);
  CHECK_RC(st_client_release(c, o.id, &released, &destroyed, &left), ST_OK, c);
  CHECK_EQ_INT(released, 0);
  CHECK_RC(st_client_ensure_live(c, o.id, NULL), ST_ERR_STALE_HANDLE, c);
  CHECK_STR_EQ(st_client_error_name(c), "STALE_HANDLE");
  st_result_t *info = NULL;
  CHECK_RC(st_client_object_info(c, o.id, &info), ST_ERR_STALE_HANDLE, c);
  /* The mapping outlives the object. */
  CHECK(st_tensor_get(st_result_tensor(r, 0), 2) == 2);
  st_result_free(r);
  /* A plain endpoint produces no object. */
  r = call_n(c, "plain", NULL, 0);
  CHECK(r);
  CHECK_ERR(st_result_object(r, &o), ST_ERR_NOT_FOUND);
  st_result_free(r);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

/* A release that asks nothing back is one message without a reply
 * ("release_notify"): the next request already sees the lease gone, and
 * a release of an object without a lease changes nothing. */
TEST(release_without_outputs_is_not_waited_for) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = call_n(c, "owned", NULL, 0);
  CHECK(r);
  st_object_info_t o;
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  st_result_t *before = NULL;
  CHECK_RC(st_client_info(c, &before), ST_OK, c);
  int64_t releases = st_value_get(st_value_get(st_result_value(before), "counters"),
                                  "releases")->as.integer;
  int64_t notes = st_value_get(st_value_get(st_result_value(before), "counters"),
                               "notifications")->as.integer;
  st_result_free(before);
  CHECK_RC(st_client_release(c, o.id, NULL, NULL, NULL), ST_OK, c);
  /* The next request: the object is gone, nothing was answered in between. */
  CHECK_RC(st_client_ensure_live(c, o.id, NULL), ST_ERR_STALE_HANDLE, c);
  CHECK_RC(st_client_release(c, o.id, NULL, NULL, NULL), ST_OK, c);
  CHECK_RC(st_client_release(c, 987654321, NULL, NULL, NULL), ST_OK, c);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_result_t *after = NULL;
  CHECK_RC(st_client_info(c, &after), ST_OK, c);
  const st_value_t *k = st_value_get(st_result_value(after), "counters");
  CHECK_EQ_INT(st_value_get(k, "releases")->as.integer, releases + 1);
  CHECK_EQ_INT(st_value_get(k, "notifications")->as.integer, notes + 3);
  st_result_free(after);
  /* Another connection's lease is not this connection's to give back. */
  st_result_t *h = call_n(c, "owned", NULL, 0);
  CHECK(h);
  st_object_info_t ho;
  CHECK_ERR(st_result_object(h, &ho), ST_OK);
  OPEN_CLIENT(other, srv.socket);
  CHECK_RC(st_client_release(other, ho.id, NULL, NULL, NULL), ST_OK, other);
  CHECK_RC(st_client_ping(other, NULL), ST_OK, other);
  CHECK_RC(st_client_ensure_live(c, ho.id, NULL), ST_OK, c);
  st_client_close(other);
  CHECK(st_tensor_get(st_result_tensor(r, 0), 2) == 2);   /* the mapping outlives it */
  st_result_free(h);
  st_result_free(r);
  st_client_close(c);
}

TEST(invalidation_drops_cache_entries) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = call_n(c, "cached", "n", 2);
  CHECK(r);
  st_object_info_t o;
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  CHECK_EQ_INT(o.cached, 1);
  CHECK_EQ_INT(o.lease, 0);
  st_args_t *a = st_args_new();
  st_args_int(a, "n", 2);
  int dropped = -1;
  CHECK_RC(st_client_invalidate_call(c, "cached", a, &dropped), ST_OK, c);
  CHECK_EQ_INT(dropped, 1);
  CHECK_RC(st_client_invalidate_call(c, "cached", a, &dropped), ST_OK, c);
  CHECK_EQ_INT(dropped, 0);
  st_args_free(a);
  CHECK_RC(st_client_ensure_live(c, o.id, NULL), ST_ERR_STALE_HANDLE, c);
  CHECK(st_tensor_get(st_result_tensor(r, 0), 1) == 1); /* still mapped */
  st_result_free(r);
  /* Defaults are bound as in a call: n=2 given or not is one entry. */
  r = call_n(c, "cached", NULL, 0);
  st_result_free(r);
  a = st_args_new();
  st_args_int(a, "n", 2);
  CHECK_RC(st_client_invalidate_call(c, "cached", a, &dropped), ST_OK, c);
  CHECK_EQ_INT(dropped, 1);
  st_args_free(a);
  st_result_free(call_n(c, "cached", "n", 1));
  st_result_free(call_n(c, "cached", "n", 3));
  int64_t count = -1;
  CHECK_RC(st_client_invalidate_endpoint(c, "cached", &count), ST_OK, c);
  CHECK_EQ_INT(count, 2);
  CHECK_RC(st_client_invalidate_endpoint(c, "cached", &count), ST_OK, c);
  CHECK_EQ_INT(count, 0);
  CHECK_RC(st_client_invalidate_endpoint(c, "nosuch", &count), ST_ERR_UNKNOWN_ENDPOINT, c);
  st_client_close(c);
}

TEST(submit_wait_result) {
  OPEN_CLIENT(c, srv.socket);
  uint64_t id = submit_n(c, "steps", "n", 4);
  CHECK(id > 0);
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(c, id, 10, &info), ST_OK, c);
  const st_value_t *v = st_result_value(info);
  CHECK_STR_EQ(str_of(st_value_get(v, "status")), "completed");
  CHECK(num_of(st_value_get(v, "id")) == (double)id);
  CHECK_STR_EQ(str_of(st_value_get(v, "endpoint")), "steps");
  CHECK(num_of(st_value_get(v, "progress")) == 1);
  CHECK_STR_EQ(str_of(st_value_get(v, "note")), "step 4");
  double created = num_of(st_value_get(v, "created_at")),
         started = num_of(st_value_get(v, "started_at")),
         completed = num_of(st_value_get(v, "completed_at"));
  CHECK(created > 1e9 && started >= created && completed >= started + 0.15);
  CHECK_EQ_INT(st_value_get(v, "error")->kind, ST_VALUE_NIL);
  st_result_free(info);
  st_result_t *r = NULL;
  CHECK_RC(st_client_task_result(c, id, &r), ST_OK, c);
  CHECK_EQ_INT(st_result_tensor_count(r), 1);
  CHECK(st_tensor_get(st_result_tensor(r, 0), 2) == 2);
  st_object_info_t o;
  CHECK_ERR(st_result_object(r, &o), ST_ERR_NOT_FOUND);
  st_result_free(r);
  /* A plain result is handed over once. */
  CHECK_RC(st_client_task_result(c, id, &r), ST_ERR_TASK, c);
  CHECK_CONTAINS(st_client_error(c), "already taken");
  /* The list has it, and a filter applies. */
  st_result_t *list = NULL;
  CHECK_RC(st_client_tasks(c, "completed", 0, 0, &list), ST_OK, c);
  const st_value_t *l = st_result_value(list);
  CHECK_EQ_INT(l->kind, ST_VALUE_ARRAY);
  int found = 0;
  for (size_t i = 0; i < l->as.array.len; i++) {
    found += num_of(st_value_get(&l->as.array.items[i], "id")) == (double)id;
    CHECK_STR_EQ(str_of(st_value_get(&l->as.array.items[i], "status")), "completed");
  }
  CHECK_EQ_INT(found, 1);
  st_result_free(list);
  CHECK_RC(st_client_tasks(c, "running", 0, 0, &list), ST_OK, c);
  for (size_t i = 0; i < st_result_value(list)->as.array.len; i++)
    CHECK(num_of(st_value_get(&st_result_value(list)->as.array.items[i], "id")) != (double)id);
  st_result_free(list);
  /* One page of one, below a cursor. */
  CHECK_RC(st_client_tasks(c, NULL, id + 1, 1, &list), ST_OK, c);
  CHECK_EQ_INT(st_result_value(list)->as.array.len, 1);
  CHECK(num_of(st_value_get(&st_result_value(list)->as.array.items[0], "id")) == (double)id);
  st_result_free(list);
  CHECK_RC(st_client_tasks(c, NULL, 0, 1001, &list), ST_ERR_INVALID_ARGUMENT, c);
  CHECK_CONTAINS(st_client_error(c), "'limit' must be in 1..1000");
  CHECK_ERR(st_client_tasks(c, NULL, 0, -1, &list), ST_ERR_INVALID_ARGUMENT);
  st_client_close(c);
}

TEST(progress_shows_while_running) {
  OPEN_CLIENT(c, srv.socket);
  st_args_t *a = st_args_new();
  st_args_int(a, "n", 20);
  st_args_float(a, "dt", 0.05);
  uint64_t id = 0;
  CHECK_RC(st_client_submit(c, "steps", a, &id), ST_OK, c);
  st_args_free(a);
  int seen = 0;
  double end = stt_now_ms() + 5000;
  while (!seen && stt_now_ms() < end) {
    st_result_t *info = NULL;
    CHECK_RC(st_client_task_wait(c, id, 0.1, &info), ST_OK, c);
    const st_value_t *v = st_result_value(info);
    double p = num_of(st_value_get(v, "progress"));
    if (strcmp(str_of(st_value_get(v, "status")), "running") == 0 && p > 0 && p < 1) {
      CHECK_CONTAINS(str_of(st_value_get(v, "note")), "step ");
      seen = 1;
    }
    st_result_free(info);
  }
  CHECK(seen);
  /* A result not finished yet is TASK. */
  st_result_t *r = NULL;
  CHECK_RC(st_client_task_result(c, id, &r), ST_ERR_TASK, c);
  CHECK_CONTAINS(st_client_error(c), "running");
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(c, id, 10, &info), ST_OK, c);
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(info), "status")), "completed");
  st_result_free(info);
  st_client_close(c);
}

TEST(managed_task_result_gives_a_lease) {
  OPEN_CLIENT(c, srv.socket);
  uint64_t id = submit_n(c, "owned", "n", 6);
  CHECK(id > 0);
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(c, id, 10, &info), ST_OK, c);
  const st_value_t *oid = st_value_get(st_result_value(info), "object_id");
  CHECK(num_of(oid) > 0);
  st_result_t *r = NULL;
  CHECK_RC(st_client_task_result(c, id, &r), ST_OK, c);
  st_object_info_t o;
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  CHECK(num_of(oid) == (double)o.id);
  CHECK_EQ_INT(o.lease, 1);
  CHECK_EQ_INT(o.refcount, 1);
  st_result_free(info);
  CHECK(st_tensor_get(st_result_tensor(r, 0), 5) == 5);
  int released, destroyed;
  CHECK_RC(st_client_release(c, o.id, &released, &destroyed, NULL), ST_OK, c);
  CHECK_EQ_INT(released, 1);
  CHECK_EQ_INT(destroyed, 1);
  st_result_free(r);
  st_client_close(c);
}

TEST(cancel_pending_and_running) {
  OPEN_CLIENT(c, srv.socket);
  /* Two workers: two sleepers run, the third waits. */
  uint64_t a = submit_n(c, "sleeper", NULL, 0), b = submit_n(c, "sleeper", NULL, 0),
           p = submit_n(c, "sleeper", NULL, 0);
  CHECK(a && b && p);
  CHECK(wait_status(c, a, "running"));
  CHECK(wait_status(c, b, "running"));
  char buf[32];
  CHECK_STR_EQ(task_status(c, p, buf, sizeof buf), "pending");
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_cancel(c, p, &info), ST_OK, c);
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(info), "status")), "cancelled");
  st_result_free(info);
  double t0 = stt_now_ms();
  CHECK_RC(st_client_task_cancel(c, a, NULL), ST_OK, c);
  CHECK_RC(st_client_task_cancel(c, b, NULL), ST_OK, c);
  CHECK_RC(st_client_task_wait(c, a, 5, &info), ST_OK, c);
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(info), "status")), "cancelled");
  st_result_free(info);
  CHECK(wait_status(c, b, "cancelled"));
  CHECK(stt_now_ms() - t0 < 3000);
  st_result_t *r = NULL;
  CHECK_RC(st_client_task_result(c, a, &r), ST_ERR_CANCELLED, c);
  CHECK_STR_EQ(st_client_error_name(c), "CANCELLED");
  /* Cancelling a finished task changes nothing. */
  CHECK_RC(st_client_task_cancel(c, a, &info), ST_OK, c);
  CHECK_STR_EQ(str_of(st_value_get(st_result_value(info), "status")), "cancelled");
  st_result_free(info);
  st_client_close(c);
}

TEST(failed_tasks_and_unknown_ids) {
  OPEN_CLIENT(c, srv.socket);
  uint64_t id = submit_n(c, "bad", NULL, 0);
  CHECK(id > 0);
  st_result_t *info = NULL;
  CHECK_RC(st_client_task_wait(c, id, 10, &info), ST_OK, c);
  const st_value_t *v = st_result_value(info);
  CHECK_STR_EQ(str_of(st_value_get(v, "status")), "failed");
  const st_value_t *e = st_value_get(v, "error");
  CHECK(e && e->kind == ST_VALUE_MAP);
  CHECK_STR_EQ(str_of(st_value_get(e, "name")), "ENDPOINT");
  CHECK_CONTAINS(str_of(st_value_get(e, "message")), "bad.lua:3");
  st_result_free(info);
  st_result_t *r = NULL;
  CHECK_RC(st_client_task_result(c, id, &r), ST_ERR_ENDPOINT, c);
  CHECK_CONTAINS(st_client_error(c), "boom");
  CHECK_RC(st_client_task_status(c, 999999, &info), ST_ERR_NOT_FOUND, c);
  CHECK_RC(st_client_task_wait(c, 999999, 0.1, &info), ST_ERR_NOT_FOUND, c);
  CHECK_RC(st_client_task_result(c, 999999, &r), ST_ERR_NOT_FOUND, c);
  uint64_t none;
  CHECK_RC(st_client_submit(c, "nosuch", NULL, &none), ST_ERR_UNKNOWN_ENDPOINT, c);
  st_args_t *a = st_args_new();
  st_args_int(a, "zzz", 1);
  CHECK_RC(st_client_submit(c, "plain", a, &none), ST_ERR_INVALID_ARGUMENT, c);
  st_args_free(a);
  /* An endpoint declared execution = "task": call submits and waits. */
  r = call_n(c, "as_task", NULL, 0);
  CHECK(r);
  const st_value_t *ok = st_value_get(st_result_value(r), "ok");
  CHECK(ok && ok->kind == ST_VALUE_BOOL && ok->as.boolean);
  st_result_free(r);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

TEST(reload_reports_changes_and_errors) {
  OPEN_CLIENT(c, srv.socket);
  stt_write_endpoint(&srv, "extra.lua",
                     "return st.endpoint{ name = \"extra\", build = function() return 7 end }\n");
  st_result_t *r = NULL;
  CHECK_RC(st_client_reload(c, &r), ST_OK, c);
  const st_value_t *v = st_result_value(r);
  const st_value_t *ok = st_value_get(v, "ok");
  CHECK(ok && ok->kind == ST_VALUE_BOOL && ok->as.boolean);
  CHECK(num_of(st_value_get(v, "generation")) >= 2);
  const st_value_t *added = st_value_get(v, "added");
  CHECK(added && added->kind == ST_VALUE_ARRAY && added->as.array.len == 1);
  CHECK_STR_EQ(str_of(&added->as.array.items[0]), "extra");
  st_result_free(r);
  r = call_n(c, "extra", NULL, 0);
  CHECK(r);
  CHECK(num_of(st_result_value(r)) == 7);
  st_result_free(r);
  stt_write_endpoint(&srv, "broken.lua", "return st.endpoint{ name = \"broken\",\n  = }\n");
  CHECK_RC(st_client_reload(c, &r), ST_OK, c);
  v = st_result_value(r);
  ok = st_value_get(v, "ok");
  CHECK(ok && ok->kind == ST_VALUE_BOOL && !ok->as.boolean);
  CHECK_CONTAINS(str_of(st_value_get(v, "error")), "broken.lua:2");
  st_result_free(r);
  char path[400];
  snprintf(path, sizeof path, "%s/broken.lua", srv.endpoints);
  unlink(path);
  snprintf(path, sizeof path, "%s/extra.lua", srv.endpoints);
  unlink(path);
  CHECK_RC(st_client_reload(c, &r), ST_OK, c);
  const st_value_t *removed = st_value_get(st_result_value(r), "removed");
  CHECK(removed && removed->kind == ST_VALUE_ARRAY && removed->as.array.len == 1);
  CHECK_STR_EQ(str_of(&removed->as.array.items[0]), "extra");
  st_result_free(r);
  st_client_close(c);
}

TEST(ensure_live_with_the_server_killed_fails_fast) {
  stt_server_t s2;
  stt_server_prepare(&s2, NULL, endpoints);
  CHECK(stt_server_start(&s2) == 0);
  OPEN_CLIENT(c, s2.socket);
  st_result_t *r = call_n(c, "lin", NULL, 0);
  CHECK(r);
  st_object_info_t o;
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  CHECK_RC(st_client_ensure_live(c, o.id, o.server_id), ST_OK, c);
  kill(s2.pid, SIGKILL);
  int status;
  waitpid(s2.pid, &status, 0);
  s2.pid = -1;
  double t0 = stt_now_ms();
  CHECK_RC(st_client_ensure_live(c, o.id, o.server_id), ST_ERR_IO, c);
  CHECK(stt_now_ms() - t0 < 1000);
  CHECK_CONTAINS(st_client_error(c), "is not running");
  CHECK_CONTAINS(st_client_error(c), s2.socket);
  t0 = stt_now_ms();
  CHECK_RC(st_client_ensure_live(c, o.id, o.server_id), ST_ERR_IO, c);
  CHECK(stt_now_ms() - t0 < 1000);
  /* A new server on the same socket: the old handle is stale there. */
  CHECK(stt_server_start(&s2) == 0);
  CHECK_RC(st_client_ensure_live(c, o.id, o.server_id), ST_ERR_STALE_HANDLE, c);
  CHECK_CONTAINS(st_client_error(c), "belongs to server");
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c); /* reconnected */
  CHECK(st_tensor_get(st_result_tensor(r, 0), 3) == 3);
  st_result_free(r);
  st_client_close(c);
  CHECK_EQ_INT(stt_server_stop(&s2), 0);
  stt_server_cleanup(&s2);
}

int main(void) {
  signal(SIGPIPE, SIG_DFL); /* the library must not need SIGPIPE ignored */
  stt_server_setup(&srv, "workers = 2,", endpoints);
  RUN(managed_call_gives_an_object_with_a_lease);
  RUN(release_is_idempotent_and_ensure_live_turns_stale);
  RUN(release_without_outputs_is_not_waited_for);
  RUN(invalidation_drops_cache_entries);
  RUN(submit_wait_result);
  RUN(progress_shows_while_running);
  RUN(managed_task_result_gives_a_lease);
  RUN(cancel_pending_and_running);
  RUN(failed_tasks_and_unknown_ids);
  RUN(reload_reports_changes_and_errors);
  RUN(ensure_live_with_the_server_killed_fails_fast);
  return stt_server_finish(&srv);
}

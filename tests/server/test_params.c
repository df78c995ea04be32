/* The parameters of every wire method (docs/protocol.md, "Methods"), one
 * table of requests and the exact error each one gets: unknown names,
 * wrong types, missing required parameters, nil where a value is needed,
 * out-of-range values, and the order in which the checks run when several
 * parameters are wrong. Also: `endpoints` (describe) carries every
 * declared endpoint option, and `stserver --check` lists each of them. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/options.h"
#include "wire.h"
#include "st/errors.h"

static stt_server_t S;

/* One named parameter of a request: type 'i' int, 'd' double, 's' string,
 * 'b' bool, 'n' nil. */
typedef struct kv {
  const char *key;
  char type;
  int64_t i;
  double d;
  const char *s;
} kv_t;

typedef struct pcase {
  const char *method;
  kv_t kv[3];                 /* up to 3, key NULL ends */
  const char *name;           /* expected error name; NULL: success */
  const char *message;        /* exact message; a trailing '*' matches a prefix */
} pcase_t;

#define I(k, v) {k, 'i', v, 0, NULL}
#define D(k, v) {k, 'd', 0, v, NULL}
#define S_(k, v) {k, 's', 0, 0, v}
#define B(k, v) {k, 'b', v, 0, NULL}
#define N(k) {k, 'n', 0, 0, NULL}

static const pcase_t cases[] = {
    {"ping", {I("x", 1)}, "INVALID_ARGUMENT", "ping: unknown parameter 'x'"},
    {"info", {N("x")}, "INVALID_ARGUMENT", "info: unknown parameter 'x'"},
    {"endpoints", {I("args", 1)}, "INVALID_ARGUMENT", "endpoints: unknown parameter 'args'"},
    {"objects", {S_("status", "x")}, "INVALID_ARGUMENT", "objects: unknown parameter 'status'"},
    {"reload", {I("endpoint", 1)}, "INVALID_ARGUMENT", "reload: unknown parameter 'endpoint'"},
    {"status", {I("task_id", 1), I("timeout", 1)}, "INVALID_ARGUMENT",
     "status: unknown parameter 'timeout'"},
    {"nosuch", {I("x", 1)}, "UNKNOWN_METHOD", "unknown method 'nosuch'"},
    /* hello: nil is a wrong type here, not an absent parameter */
    {"hello", {S_("protocol", "1")}, "INVALID_ARGUMENT", "hello: 'protocol' must be an integer >= 0"},
    {"hello", {N("protocol")}, "INVALID_ARGUMENT", "hello: 'protocol' must be an integer >= 0"},
    {"hello", {I("protocol", -1), I("client", 5)}, "INVALID_ARGUMENT",
     "hello: 'protocol' must be an integer >= 0"},
    {"hello", {I("client", 5)}, "INVALID_ARGUMENT", "hello: 'client' must be a string"},
    {"hello", {N("client")}, "INVALID_ARGUMENT", "hello: 'client' must be a string"},
    {"hello", {I("protocol", 99)}, "PROTOCOL", "client speaks protocol 99; *"},
    {"hello", {I("protocol", 1), S_("client", "params-test")}, NULL, NULL},
    /* call, submit */
    {"call", {{NULL}}, "INVALID_ARGUMENT", "call: 'endpoint' (a string) is required"},
    {"call", {I("endpoint", 5)}, "INVALID_ARGUMENT", "call: 'endpoint' (a string) is required"},
    {"call", {N("endpoint")}, "INVALID_ARGUMENT", "call: 'endpoint' (a string) is required"},
    {"call", {S_("endpoint", "nope")}, "UNKNOWN_ENDPOINT", "unknown endpoint 'nope'"},
    {"call", {S_("endpoint", "e"), I("args", 5)}, "INVALID_ARGUMENT", "e: *"},
    {"call", {S_("endpoint", "e"), I("x", 5)}, "INVALID_ARGUMENT", "call: unknown parameter 'x'"},
    {"submit", {B("endpoint", 1)}, "INVALID_ARGUMENT", "submit: 'endpoint' (a string) is required"},
    {"submit", {S_("endpoint", "nope")}, "UNKNOWN_ENDPOINT", "unknown endpoint 'nope'"},
    /* task ids: nil counts as absent */
    {"status", {{NULL}}, "INVALID_ARGUMENT", "status: 'task_id' is required"},
    {"status", {N("task_id")}, "INVALID_ARGUMENT", "status: 'task_id' is required"},
    {"status", {S_("task_id", "1")}, "INVALID_ARGUMENT", "status: 'task_id' must be an integer >= 0"},
    {"status", {I("task_id", -1)}, "INVALID_ARGUMENT", "status: 'task_id' must be an integer >= 0"},
    {"status", {D("task_id", 1.5)}, "INVALID_ARGUMENT", "status: 'task_id' must be an integer >= 0"},
    {"status", {I("task_id", 999999)}, "NOT_FOUND",
     "status: task 999999 not found (unknown, or dropped after tasks.ttl_s)"},
    {"result", {B("task_id", 1)}, "INVALID_ARGUMENT", "result: 'task_id' must be an integer >= 0"},
    {"result", {I("task_id", 7)}, "NOT_FOUND",
     "result: task 7 not found (unknown, or dropped after tasks.ttl_s)"},
    {"cancel", {{NULL}}, "INVALID_ARGUMENT", "cancel: 'task_id' is required"},
    /* wait: the timeout is checked before the task id */
    {"wait", {S_("task_id", "x"), I("timeout", -1)}, "INVALID_ARGUMENT",
     "wait: 'timeout' must be a number of seconds in 0..3600"},
    {"wait", {S_("timeout", "5")}, "INVALID_ARGUMENT",
     "wait: 'timeout' must be a number of seconds in 0..3600"},
    {"wait", {I("timeout", 3601)}, "INVALID_ARGUMENT",
     "wait: 'timeout' must be a number of seconds in 0..3600"},
    {"wait", {D("timeout", -0.5)}, "INVALID_ARGUMENT",
     "wait: 'timeout' must be a number of seconds in 0..3600"},
    {"wait", {N("timeout")}, "INVALID_ARGUMENT", "wait: 'task_id' is required"},
    {"wait", {D("timeout", 0.5), S_("task_id", "1")}, "INVALID_ARGUMENT",
     "wait: 'task_id' must be an integer >= 0"},
    {"wait", {I("task_id", 5), D("timeout", 0.25)}, "NOT_FOUND",
     "wait: task 5 not found (unknown, or dropped after tasks.ttl_s)"},
    /* tasks */
    {"tasks", {S_("status", "done")}, "INVALID_ARGUMENT",
     "tasks: 'status' must be one of pending, running, completed, failed, cancelled"},
    {"tasks", {I("status", 3)}, "INVALID_ARGUMENT",
     "tasks: 'status' must be one of pending, running, completed, failed, cancelled"},
    {"tasks", {N("status")}, NULL, NULL},
    {"tasks", {S_("status", "cancelled")}, NULL, NULL},
    /* objects */
    {"release", {{NULL}}, "INVALID_ARGUMENT", "release: 'object_id' is required"},
    {"release", {S_("object_id", "1")}, "INVALID_ARGUMENT",
     "release: 'object_id' must be an integer >= 0"},
    {"release", {I("object_id", 4242)}, NULL, NULL},
    {"object_info", {I("object_id", -5)}, "INVALID_ARGUMENT",
     "object_info: 'object_id' must be an integer >= 0"},
    {"object_info", {I("object_id", 12345)}, "STALE_HANDLE",
     "object_info: object 12345 is gone (released, invalidated or evicted)"},
    {"ensure_live", {I("server_id", 5)}, "INVALID_ARGUMENT",
     "ensure_live: 'server_id' must be a string"},
    {"ensure_live", {N("server_id")}, "INVALID_ARGUMENT", "ensure_live: 'object_id' is required"},
    {"ensure_live", {I("object_id", 1), S_("server_id", "other")}, "STALE_HANDLE",
     "ensure_live: object 1 belongs to server other; this is server *"},
    {"ensure_live", {I("object_id", 1)}, "STALE_HANDLE",
     "ensure_live: object 1 is gone (released, invalidated or evicted)"},
    /* invalidation */
    {"invalidate_call", {I("endpoint", 1)}, "INVALID_ARGUMENT",
     "invalidate_call: 'endpoint' (a string) is required"},
    {"invalidate_call", {S_("endpoint", "nope")}, "UNKNOWN_ENDPOINT", "unknown endpoint 'nope'"},
    {"invalidate_call", {S_("endpoint", "e"), S_("args", "x")}, "INVALID_ARGUMENT",
     "invalidate_call: e: *"},
    {"invalidate_endpoint", {{NULL}}, "INVALID_ARGUMENT",
     "invalidate_endpoint: 'endpoint' (a string) is required"},
    {"invalidate_endpoint", {S_("endpoint", "nope")}, "UNKNOWN_ENDPOINT",
     "unknown endpoint 'nope'"},
    {"invalidate_endpoint", {S_("endpoint", "e"), I("args", 1)}, "INVALID_ARGUMENT",
     "invalidate_endpoint: unknown parameter 'args'"},
    {"invalidate_endpoint", {S_("endpoint", "e")}, NULL, NULL},
    /* names are length-delimited: a NUL byte inside one is refused, never
     * read as the shorter name before it */
    {"call", {S_("endpoint", "e\\0")}, "INVALID_ARGUMENT", "call: 'endpoint' holds a NUL byte"},
    {"submit", {S_("endpoint", "e\\0x")}, "INVALID_ARGUMENT",
     "submit: 'endpoint' holds a NUL byte"},
    {"invalidate_call", {S_("endpoint", "e\\0")}, "INVALID_ARGUMENT",
     "invalidate_call: 'endpoint' holds a NUL byte"},
    {"invalidate_endpoint", {S_("endpoint", "e\\0")}, "INVALID_ARGUMENT",
     "invalidate_endpoint: 'endpoint' holds a NUL byte"},
    {"tasks", {S_("status", "cancelled\\0x")}, "INVALID_ARGUMENT",
     "tasks: 'status' holds a NUL byte"},
    {"hello", {I("protocol", 1), S_("client", "a\\0b")}, "INVALID_ARGUMENT",
     "hello: 'client' holds a NUL byte"},
    {"ensure_live", {I("object_id", 1), S_("server_id", "x\\0")}, "INVALID_ARGUMENT",
     "ensure_live: 'server_id' holds a NUL byte"},
};

/* The parameters of a case as msgpack text (mpbuf.h): "k: v, ...". */
static const char *kv_text(const kv_t *kv, size_t n, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n && used < len; i++) {
    const kv_t *e = &kv[i];
    char v[128];
    switch (e->type) {
    case 'i': snprintf(v, sizeof v, "%lld", (long long)e->i); break;
    case 'd': snprintf(v, sizeof v, "%#.17g", e->d); break;
    case 's': snprintf(v, sizeof v, "'%s'", e->s); break;
    case 'b': snprintf(v, sizeof v, "%s", e->i ? "true" : "false"); break;
    default: snprintf(v, sizeof v, "nil"); break;
    }
    used += (size_t)snprintf(buf + used, len - used, "%s%s: %s", i ? ", " : "", e->key, v);
  }
  return buf;
}

static int matches(const char *got, const char *want) {
  size_t n = strlen(want);
  if (n && want[n - 1] == '*') return strncmp(got, want, n - 1) == 0;
  return strcmp(got, want) == 0;
}

TEST(every_method_checks_its_parameters) {
  OPEN_RC(c, S.socket);
  int bad = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const pcase_t *t = &cases[k];
    size_t n = 0;
    while (n < 3 && t->kv[n].key) n++;
    char params[512];
    msg_t m;
    CHECK(rc_rpcf(&c, &m, "[0, %u, '%s', [{%s}]]", (unsigned)(100 + k), t->method,
                  kv_text(t->kv, n, params, sizeof params)) == 1);
    const char *name = m.error ? msg_errname(&m) : NULL;
    const char *msg = m.error ? msg_errmsg(&m) : "";
    int ok = t->name ? (name && strcmp(name, t->name) == 0 && matches(msg, t->message))
                     : !name;
    if (!ok) {
      fprintf(stderr, "   case %zu (%s): got %s \"%s\"; want %s \"%s\"\n", k, t->method,
              name ? name : "success", msg, t->name ? t->name : "success",
              t->message ? t->message : "");
      bad++;
    }
    msg_free(&m);
  }
  rc_close(&c);
  CHECK_EQ_INT(bad, 0);
}

/* params itself: an array of zero or one map with string keys (a params
 * value that is no array is a PROTOCOL error of the frame, test_protocol.c);
 * the method is looked up first. */
TEST(params_must_be_one_named_map) {
  static const struct {
    const char *method;
    int shape;                /* 1 [1], 2 [{}, {}], 3 [{1: 2}] */
    const char *name, *message;
  } shapes[] = {
      {"status", 1, "INVALID_ARGUMENT", "status: params must be [] or [{named parameters}]"},
      {"info", 2, "INVALID_ARGUMENT", "info: params must be [] or [{named parameters}]"},
      {"call", 3, "INVALID_ARGUMENT", "call: parameter names must be strings"},
      {"nosuch", 1, "UNKNOWN_METHOD", "unknown method 'nosuch'"},
  };
  OPEN_RC(c, S.socket);
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    static const char *const params[] = {"", "[1]", "[{}, {}]", "[{1: 2}]"};
    msg_t m;
    CHECK(rc_rpcf(&c, &m, "[0, %u, '%s', %s]", (unsigned)(500 + k), shapes[k].method,
                  params[shapes[k].shape]) == 1);
    CHECK_STR_EQ(msg_errname(&m), shapes[k].name);
    CHECK_STR_EQ(msg_errmsg(&m), shapes[k].message);
    msg_free(&m);
  }
  rc_close(&c);
}

/* `endpoints` carries every declared option of every endpoint, and
 * non_default names those whose value is not the default. */
TEST(describe_carries_every_option) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 9, 'endpoints', []]") == 1 && !m.error);
  CHECK(m.result->type == MSGPACK_OBJECT_ARRAY && m.result->via.array.size == 3);
  const msgpack_object *e = &m.result->via.array.ptr[0], *k = &m.result->via.array.ptr[1];
  CHECK_STR_EQ(obj_str(obj_get(e, "name")), "e");
  CHECK_STR_EQ(obj_str(obj_get(k, "name")), "k");
  for (size_t i = 0; i < ST__ENDPOINT_NOPTIONS; i++) {
    const char *opt = st__endpoint_options[i].name;
    if (!obj_get(e, opt) || !obj_get(k, opt)) {
      fprintf(stderr, "   option '%s' is missing from the endpoints reply\n", opt);
      CHECK(0);
    }
  }
  CHECK_STR_EQ(obj_str(obj_get(e, "execution")), "direct");
  CHECK_STR_EQ(obj_str(obj_get(k, "execution")), "task");
  CHECK_STR_EQ(obj_str(obj_get(k, "concurrency")), "serialized");
  CHECK_STR_EQ(obj_str(obj_get(k, "cache_format_key")), "k:{n}");
  CHECK(obj_get(k, "timeout")->via.f64 == 2.5);
  CHECK(obj_get(e, "timeout")->type == MSGPACK_OBJECT_NIL);
  CHECK_STR_EQ(obj_str(obj_get(k, "device")), "cpu");
  CHECK_STR_EQ(obj_str(obj_get(k, "ipc")), "vmm");
  /* non_default: in declaration order; cache is implied by the key */
  const msgpack_object *nd = obj_get(k, "non_default");
  CHECK(nd && nd->type == MSGPACK_OBJECT_ARRAY);
  static const char *const want[] = {"execution", "concurrency", "managed", "cache",
                                     "cache_format_key", "timeout", "device"};
  CHECK_EQ_INT(nd->via.array.size, sizeof want / sizeof want[0]);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    CHECK_STR_EQ(obj_str(&nd->via.array.ptr[i]), want[i]);
  nd = obj_get(e, "non_default");
  CHECK(nd && nd->type == MSGPACK_OBJECT_ARRAY && nd->via.array.size == 0);
  msg_free(&m);
  rc_close(&c);
}

/* A dtype or device name that reaches an endpoint with a NUL byte inside
 * is no name: "float32\0junk" is not float32, "cpu\0x" is not the CPU. */
TEST(names_with_a_nul_byte_are_refused_in_bodies) {
  OPEN_RC(c, S.socket);
  CHECK_RPC(&c, ST_ERR_ENDPOINT, "unknown dtype 'a string with a NUL byte'",
            "[0, 600, 'call', [{endpoint: 'z', args: {dtype: 'float32\\0junk'}}]]");
  CHECK_RPC(&c, ST_ERR_ENDPOINT, "unknown device 'a string with a NUL byte'",
            "[0, 601, 'call', [{endpoint: 'z', args: {device: 'cpu\\0x'}}]]");
  CHECK_RPC(&c, ST_OK, NULL, "[0, 602, 'call', [{endpoint: 'z', args: {dtype: 'int8'}}]]");
  rc_close(&c);
}

/* stserver --check prints every declared option of each endpoint. */
TEST(check_lists_every_option) {
  char cmd[2048], out[8192];
  snprintf(cmd, sizeof cmd, "'%s' --check --config '%s' 2>&1", getenv("ST_SERVER_BIN"),
           S.config);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  size_t len = fread(out, 1, sizeof out - 1, p);
  out[len] = '\0';
  CHECK_EQ_INT(pclose(p), 0);
  const char *line = strstr(out, "  k(");
  CHECK(line != NULL);
  char row[1024];
  snprintf(row, sizeof row, "%.*s", (int)strcspn(line, "\n"), line);
  for (size_t i = 0; i < ST__ENDPOINT_NOPTIONS; i++) {
    char want[64];
    snprintf(want, sizeof want, " %s=", st__endpoint_options[i].name);
    if (!strstr(row, want)) {
      fprintf(stderr, "   --check does not list '%s': %s\n", st__endpoint_options[i].name, row);
      CHECK(0);
    }
  }
  CHECK(strstr(row, " execution=task concurrency=serialized managed=yes cache=yes "
                    "cache_format_key=k:{n} singleflight=no timeout=2.5 device=cpu ipc=vmm") != NULL);
}

static const stt_endpoint_t endpoints[] = {
    {"e.lua",
     "return st.endpoint{ name = 'e', params = { n = 1 },\n"
     "  build = function(a) return a.n end }\n"},
    {"k.lua",
     "return st.endpoint{ name = 'k', execution = 'task',\n"
     "  concurrency = 'serialized', managed = true, cache_format_key = 'k:{n}',\n"
     "  timeout = 2.5, device = 'cpu', params = { n = 1 },\n"
     "  build = function(a) return a.n end }\n"},
    {"z.lua",
     "return st.endpoint{ name = 'z', params = { dtype = 'float32', device = 'cpu' },\n"
     "  build = function(a) return st.zeros{2, dtype = a.dtype, device = a.device} end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 1,", endpoints);
  RUN(every_method_checks_its_parameters);
  RUN(params_must_be_one_named_map);
  RUN(describe_carries_every_option);
  RUN(names_with_a_nul_byte_are_refused_in_bodies);
  RUN(check_lists_every_option);
  return stt_server_finish(&S);
}

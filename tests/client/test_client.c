/* libstclient against a real stserver (tests/kit/fixture.h): hello, ping,
 * calls of tensor, module and plain endpoints with typed arguments, mapped
 * values, the open-cache, results that outlive the client and the server
 * (SIGKILL), a second process, errors (missing socket, endpoint errors with
 * file:line, bad arguments), timeouts and a server dying mid-call. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <st/client.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;

static const stt_endpoint_t endpoints[] = {
    {"t.lua", STT_EP_T},
    {"mod.lua", STT_EP_MOD},
    {"twice.lua",
     "return st.endpoint{ name = \"twice\",\n"
     "  build = function(a)\n"
     "    local t = st.arange{6, dtype = \"int32\"}\n"
     "    return { a = t, b = t }\n"
     "  end }\n"},
    {"bad.lua", STT_EP_BAD},
    {"slow.lua", STT_EP_SLOW},
    {"plain.lua",
     "return st.endpoint{ name = \"plain\", params = { n = 1, x = 0.5, s = \"a\", b = false },\n"
     "  build = function(a) return { n = a.n, x = a.x, s = a.s, b = a.b, list = { 1, 2, 3 } } "
     "end }\n"},
    {"echo.lua", STT_EP_ECHO},
    {"fmt.lua",
     "return st.endpoint{ name = \"fmt\", cache_format_key = \"k:{v}\",\n"
     "  params = { v = st.required },\n"
     "  build = function(a) return { v = a.v } end }\n"},
    {NULL, NULL},
};

/* Calls `name` with words "k=v" (NULL-terminated); result or NULL. */
static st_result_t *call_words(st_client_t *c, const char *name, const char *const *words) {
  st_args_t *a = st_args_new();
  char err[200];
  for (size_t i = 0; words && words[i]; i++)
    if (st_args_parse_kv(a, words[i], err, sizeof err) != ST_OK) {
      fprintf(stderr, "bad word %s: %s\n", words[i], err);
      st_args_free(a);
      return NULL;
    }
  st_result_t *r = NULL;
  int rc = st_client_call(c, name, a, &r);
  st_args_free(a);
  if (rc != ST_OK)
    fprintf(stderr, "call %s: %s: %s\n", name, st_client_error_name(c), st_client_error(c));
  return r;
}

static double num(const st_value_t *v) {
  if (!v) return NAN;
  if (v->kind == ST_VALUE_INT) return (double)v->as.integer;
  if (v->kind == ST_VALUE_FLOAT) return v->as.number;
  return NAN;
}

TEST(hello_and_ping) {
  OPEN_CLIENT(c, srv.socket);
  CHECK(strlen(st_client_server_id(c)) > 0);
  CHECK_STR_EQ(st_client_server_version(c), ST_VERSION_STRING);
  CHECK_EQ_INT(st_client_server_pid(c), srv.pid);
  double rtt = -1;
  CHECK_RC(st_client_ping(c, &rtt), ST_OK, c);
  CHECK(rtt > 0 && rtt < 1e6);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
  /* By device under a base path, as the socket name says. */
  c = NULL;
  char err[256];
  CHECK_ERR_MSG(st_client_connect_device(srv.base, 0, &c, err, sizeof err), ST_OK, err);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

TEST(call_tensor_endpoint) {
  OPEN_CLIENT(c, srv.socket);
  const char *words[] = {"n=5", NULL};
  st_result_t *r = call_words(c, "t", words);
  CHECK(r);
  CHECK_EQ_INT(st_result_value(r)->kind, ST_VALUE_TENSOR);
  CHECK_EQ_INT(st_result_tensor_count(r), 1);
  const st_tensor_t *t = st_result_tensor(r, 0);
  CHECK(t == st_result_find(r, ""));
  CHECK(t == st_result_value(r)->as.tensor);
  CHECK_STR_EQ(t->name, "");
  CHECK_EQ_INT(t->dtype, ST_DTYPE_FLOAT32);
  CHECK_EQ_INT(t->ndim, 1);
  CHECK_EQ_INT(t->shape[0], 5);
  CHECK_EQ_INT(t->strides[0], 1);
  CHECK_EQ_INT(t->numel, 5);
  CHECK_EQ_INT(t->nbytes, 20);
  CHECK_EQ_INT(t->device, ST_DEVICE_CPU);
  CHECK_EQ_INT(t->device_index, -1);
  CHECK_STR_EQ(t->device_uuid, "");
  const float *f = t->data;
  for (int i = 0; i < 5; i++) {
    CHECK(f[i] == (float)i);
    CHECK(st_tensor_get(t, i) == i);
  }
  st_result_free(r);
  /* Defaults fill missing arguments. */
  r = call_words(c, "t", NULL);
  CHECK(r);
  CHECK_EQ_INT(st_result_tensor(r, 0)->shape[0], 4);
  st_result_free(r);
  st_client_close(c);
}

TEST(call_plain_values_with_typed_args) {
  OPEN_CLIENT(c, srv.socket);
  const char *words[] = {"n=7", "x=2.5", "s=hello", "b=true", NULL};
  st_result_t *r = call_words(c, "plain", words);
  CHECK(r);
  const st_value_t *v = st_result_value(r);
  CHECK_EQ_INT(v->kind, ST_VALUE_MAP);
  CHECK(num(st_value_get(v, "n")) == 7);
  CHECK(num(st_value_get(v, "x")) == 2.5);
  const st_value_t *s = st_value_get(v, "s");
  CHECK(s && s->kind == ST_VALUE_STRING);
  CHECK_STR_EQ(s->as.str.ptr, "hello");
  const st_value_t *b = st_value_get(v, "b");
  CHECK(b && b->kind == ST_VALUE_BOOL && b->as.boolean == 1);
  const st_value_t *l = st_value_get(v, "list");
  CHECK(l && l->kind == ST_VALUE_ARRAY && l->as.array.len == 3);
  CHECK(num(&l->as.array.items[2]) == 3);
  CHECK_EQ_INT(st_result_tensor_count(r), 0);
  st_result_free(r);
  st_client_close(c);
}

TEST(module_tensors_share_one_mapping) {
  OPEN_CLIENT(c, srv.socket);
  size_t mapped0, mapped;
  st_open_cache_stats(&mapped0, NULL);
  st_result_t *r = call_words(c, "mod", NULL);
  CHECK(r);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0 + 1);
  CHECK_EQ_INT(st_result_value(r)->kind, ST_VALUE_MODULE);
  CHECK_EQ_INT(st_result_tensor_count(r), 2);
  const st_tensor_t *w = st_result_find(r, "weight"), *b = st_result_find(r, "bias");
  CHECK(w && b);
  CHECK_EQ_INT(w->ndim, 2);
  CHECK_EQ_INT(w->numel, 4);
  CHECK_EQ_INT(b->numel, 2);
  for (int i = 0; i < 4; i++) CHECK(st_tensor_get(w, i) == 1.0);
  for (int i = 0; i < 2; i++) CHECK(st_tensor_get(b, i) == 0.0);
  /* One allocation: both tensors lie in the same mapping. */
  ptrdiff_t gap = (const char *)b->data - (const char *)w->data;
  CHECK((gap > 0 ? gap : -gap) < 1 << 20);
  st_result_free(r);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0);
  st_client_close(c);
}

TEST(same_arena_twice_is_mapped_once) {
  OPEN_CLIENT(c, srv.socket);
  size_t mapped0, mapped;
  uint64_t reused0, reused;
  st_open_cache_stats(&mapped0, &reused0);
  st_result_t *r = call_words(c, "twice", NULL);
  CHECK(r);
  st_open_cache_stats(&mapped, &reused);
  CHECK_EQ_INT(mapped, mapped0 + 1);
  const st_tensor_t *a = st_result_find(r, "a"), *b = st_result_find(r, "b");
  CHECK(a && b);
  CHECK(a->data == b->data);
  CHECK_EQ_INT(a->dtype, ST_DTYPE_INT32);
  CHECK(st_tensor_get(b, 5) == 5);
  /* A second result: a new allocation (plain results are not shared). */
  st_result_t *r2 = call_words(c, "twice", NULL);
  CHECK(r2);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0 + 2);
  CHECK(st_result_find(r2, "a")->data != a->data);
  st_result_free(r);
  st_result_free(r2);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0);
  st_client_close(c);
}

TEST(info_and_endpoints) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = NULL;
  CHECK_RC(st_client_info(c, &r), ST_OK, c);
  const st_value_t *sid = st_value_get(st_result_value(r), "server_id");
  CHECK(sid && sid->kind == ST_VALUE_STRING);
  CHECK_STR_EQ(sid->as.str.ptr, st_client_server_id(c));
  CHECK(num(st_value_get(st_result_value(r), "pid")) == srv.pid);
  st_result_free(r);
  CHECK_RC(st_client_endpoints(c, &r), ST_OK, c);
  const st_value_t *list = st_result_value(r);
  CHECK_EQ_INT(list->kind, ST_VALUE_ARRAY);
  int found = 0;
  for (size_t i = 0; i < list->as.array.len; i++) {
    const st_value_t *e = &list->as.array.items[i];
    const st_value_t *name = st_value_get(e, "name");
    if (name && name->kind == ST_VALUE_STRING && strcmp(name->as.str.ptr, "t") == 0) {
      found = 1;
      CHECK(num(st_value_get(st_value_get(e, "params"), "n")) == 4);
    }
  }
  CHECK(found);
  st_result_free(r);
  st_client_close(c);
}

TEST(results_outlive_the_client) {
  OPEN_CLIENT(c, srv.socket);
  const char *words[] = {"n=6", NULL};
  st_result_t *r = call_words(c, "t", words);
  CHECK(r);
  st_client_close(c);
  const st_tensor_t *t = st_result_tensor(r, 0);
  CHECK(st_tensor_get(t, 5) == 5);
  ((float *)t->data)[0] = 42; /* the mapping is writable */
  CHECK(st_tensor_get(t, 0) == 42);
  st_result_free(r);
}

TEST(missing_socket_fails_fast) {
  char path[400], err[256];
  snprintf(path, sizeof path, "%s/none-0.sock", srv.dir);
  st_client_t *c = (st_client_t *)1;
  double t0 = stt_now_ms();
  CHECK_ERR_MSG(st_client_connect(path, &c, err, sizeof err), ST_ERR_IO, err);
  CHECK(stt_now_ms() - t0 < 200);
  CHECK(c == NULL);
  CHECK_CONTAINS(err, "no server is listening");
  CHECK_CONTAINS(err, path);
  CHECK_ERR_MSG(st_client_connect_device(srv.base, 5, &c, err, sizeof err), ST_ERR_IO, err);
  CHECK_CONTAINS(err, "-5.sock");
}

TEST(endpoint_errors) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = (st_result_t *)1;
  CHECK_RC(st_client_call(c, "bad", NULL, &r), ST_ERR_ENDPOINT, c);
  CHECK(r == NULL);
  CHECK_STR_EQ(st_client_error_name(c), "ENDPOINT");
  CHECK_CONTAINS(st_client_error(c), "bad.lua:3");
  CHECK_CONTAINS(st_client_error(c), "boom");
  CHECK_RC(st_client_call(c, "no_such_endpoint", NULL, &r), ST_ERR_UNKNOWN_ENDPOINT, c);
  CHECK_STR_EQ(st_client_error_name(c), "UNKNOWN_ENDPOINT");
  const char *wrong_type[] = {"n=abc", NULL};
  CHECK(call_words(c, "t", wrong_type) == NULL);
  CHECK_STR_EQ(st_client_error_name(c), "INVALID_ARGUMENT");
  const char *unknown[] = {"zzz=1", NULL};
  CHECK(call_words(c, "t", unknown) == NULL);
  CHECK_STR_EQ(st_client_error_name(c), "INVALID_ARGUMENT");
  CHECK_CONTAINS(st_client_error(c), "zzz");
  CHECK_RC(st_client_rpc(c, "no_such_method", NULL, &r), ST_ERR_UNKNOWN_METHOD, c);
  /* None of these cost the connection. */
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

TEST(timeout) {
  OPEN_CLIENT(c, srv.socket);
  st_client_set_timeout(c, 200);
  st_result_t *r = NULL;
  double t0 = stt_now_ms();
  CHECK_RC(st_client_call(c, "slow", NULL, &r), ST_ERR_TIMEOUT, c);
  double took = stt_now_ms() - t0;
  CHECK(took >= 190 && took < 1000);
  CHECK_STR_EQ(st_client_error_name(c), "TIMEOUT");
  CHECK_RC(st_client_ping(c, NULL), ST_ERR_IO, c);
  st_client_close(c);
  /* The server serves everyone else meanwhile. */
  c = stt_client_open(srv.socket);
  CHECK(c);
  CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  st_client_close(c);
}

/* A child that inherited a result by fork: both processes see one memory,
 * and each unmaps independently. */
TEST(fork_shares_and_unmaps_independently) {
  OPEN_CLIENT(c, srv.socket);
  const char *words[] = {"n=8", NULL};
  st_result_t *r = call_words(c, "t", words);
  st_client_close(c);
  CHECK(r);
  int to_child[2], to_parent[2];
  CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    const st_tensor_t *t = st_result_tensor(r, 0);
    int ok = st_tensor_get(t, 7) == 7;
    ((float *)t->data)[1] = -1; /* MAP_SHARED: the parent sees it */
    char ch = ok ? 'y' : 'n';
    if (write(to_parent[1], &ch, 1) != 1) _exit(3);
    if (read(to_child[0], &ch, 1) != 1) _exit(4); /* parent freed its copy */
    ok = ok && st_tensor_get(t, 7) == 7 && st_tensor_get(t, 1) == -1;
    st_result_free(r);
    _exit(ok ? 0 : 5);
  }
  char ch = 0;
  CHECK(read(to_parent[0], &ch, 1) == 1 && ch == 'y');
  CHECK(st_tensor_get(st_result_tensor(r, 0), 1) == -1);
  st_result_free(r);
  CHECK(write(to_child[1], "g", 1) == 1);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(to_child[0]);
  close(to_child[1]);
  close(to_parent[0]);
  close(to_parent[1]);
}

/* Run as a separate program (exec): connect, call, check, print a sum. */
static int child_main(const char *socket) {
  st_client_t *c = NULL;
  char err[256];
  if (st_client_connect(socket, &c, err, sizeof err) != ST_OK) return 2;
  const char *words[] = {"n=7", NULL};
  st_result_t *r = call_words(c, "t", words);
  st_client_close(c);
  if (!r) return 3;
  double sum = 0;
  const st_tensor_t *t = st_result_tensor(r, 0);
  for (int64_t i = 0; i < t->numel; i++) sum += st_tensor_get(t, i);
  size_t mapped;
  uint64_t reused;
  st_open_cache_stats(&mapped, &reused);
  printf("sum=%g mapped=%zu reused=%llu\n", sum, mapped, (unsigned long long)reused);
  st_result_free(r);
  return sum == 21 && mapped == 1 ? 0 : 4;
}

TEST(second_process_maps_its_own) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = call_words(c, "t", NULL);
  CHECK(r);
  int out[2];
  CHECK(pipe(out) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    dup2(out[1], 1);
    setenv("STT_CLIENT_CHILD", srv.socket, 1);
    execl("/proc/self/exe", "client_child", (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  char buf[256] = "";
  size_t used = 0;
  ssize_t n;
  while ((n = read(out[0], buf + used, sizeof buf - 1 - used)) > 0) used += (size_t)n;
  buf[used] = '\0';
  close(out[0]);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK_CONTAINS(buf, "sum=21 mapped=1 reused=0");
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(st_tensor_get(st_result_tensor(r, 0), 3) == 3); /* ours is untouched */
  st_result_free(r);
  st_client_close(c);
}

/* --- a server of its own, to kill ----------------------------------- */

typedef struct killer {
  pid_t pid;
  int after_ms;
} killer_t;

static void *kill_later(void *arg) {
  killer_t *k = arg;
  struct timespec ts = {k->after_ms / 1000, (long)(k->after_ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
  kill(k->pid, SIGKILL);
  return NULL;
}

TEST(results_survive_sigkill_and_calls_fail_fast) {
  stt_server_t s2;
  stt_server_prepare(&s2, NULL, endpoints);
  CHECK(stt_server_start(&s2) == 0);
  OPEN_CLIENT(c, s2.socket);
  st_result_t *r = call_words(c, "mod", NULL);
  CHECK(r);
  OPEN_CLIENT(c2, s2.socket);
  /* The server dies while c2 waits on a 2 s call. */
  killer_t k = {s2.pid, 300};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, kill_later, &k) == 0);
  st_result_t *r2 = NULL;
  double t0 = stt_now_ms();
  int rc = st_client_call(c2, "slow", NULL, &r2);
  double took = stt_now_ms() - t0;
  pthread_join(th, NULL);
  int status;
  waitpid(s2.pid, &status, 0);
  s2.pid = -1;
  CHECK_RC(rc, ST_ERR_IO, c2);
  CHECK_STR_EQ(st_client_error(c2), "connection closed by the server");
  CHECK(took < 1500);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  /* The memfd lives on in our mapping. */
  const st_tensor_t *w = st_result_find(r, "weight");
  CHECK(w);
  for (int i = 0; i < 4; i++) CHECK(st_tensor_get(w, i) == 1.0);
  ((float *)w->data)[0] = 3;
  CHECK(st_tensor_get(w, 0) == 3);
  CHECK_RC(st_client_ping(c, NULL), ST_ERR_IO, c);
  st_result_free(r);
  st_client_close(c);
  st_client_close(c2);
  stt_server_cleanup(&s2);
}

/* The echo of one argument built by `put` (bytes, or a string). */
static st_result_t *echo_one(st_client_t *c, const char *name, const char *key, const char *p,
                             size_t n, int binary) {
  st_args_t *a = st_args_new();
  int rc = binary ? st_args_bytes(a, key, p, n) : st_args_str(a, key, p, n);
  st_result_t *r = NULL;
  if (rc == ST_OK) rc = st_client_call(c, name, a, &r);
  if (rc != ST_OK) fprintf(stderr, "   %s: %s\n", name, st_client_error(c));
  st_args_free(a);
  return r;
}

/* Binary stays binary through a Lua endpoint and back; cache keys keep
 * binary apart from strings, readable and whole (docs/protocol.md). */
TEST(binary_round_trips_and_cache_keys_are_exact) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = echo_one(c, "echo", "value", "\xff\x00", 2, 1);
  CHECK(r);
  const st_value_t *v = st_result_value(r);
  CHECK(v && v->kind == ST_VALUE_BINARY && v->as.str.len == 2);
  CHECK(memcmp(v->as.str.ptr, "\xff\x00", 2) == 0);
  st_result_free(r);
  r = echo_one(c, "echo", "value", "a\0b", 3, 0);
  CHECK(r && st_result_value(r)->kind == ST_VALUE_STRING);
  st_result_free(r);
  struct {
    const char *p;
    size_t n;
    int bin;
    const char *key;
  } cases[] = {
      {"ab", 2, 0, "k:ab"},
      {"ab", 2, 1, "k:b\"ab\""},
      {"k:a\0b", 5, 0, "k:k:a\\x00b"},
      {"k:a\0c", 5, 0, "k:k:a\\x00c"},
      {"\xff\x00", 2, 1, "k:b\"\\xff\\x00\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    r = echo_one(c, "fmt", "v", cases[i].p, cases[i].n, cases[i].bin);
    CHECK(r);
    st_object_info_t o;
    CHECK_EQ_INT(st_result_object(r, &o), ST_OK);
    CHECK_STR_EQ(o.cache_key, cases[i].key);
    v = st_value_get(st_result_value(r), "v");
    CHECK(v && v->kind == (cases[i].bin ? ST_VALUE_BINARY : ST_VALUE_STRING));
    CHECK(v->as.str.len == cases[i].n && memcmp(v->as.str.ptr, cases[i].p, cases[i].n) == 0);
    st_result_free(r);
  }
  st_client_close(c);
}

/* Flags and policies the API does not have are refused, naming the
 * allowed ones, before anything is sent. */
TEST(unknown_flags_are_refused) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = NULL;
  CHECK_ERR(st_client_call_flags(c, "plain", NULL, 4, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c),
                 "unknown flags 0x4 (allowed: ST_CALL_LEND_SAME, ST_CALL_READONLY)");
  CHECK_ERR(st_client_call_view(c, "plain", NULL, 8, NULL, &r), ST_ERR_INVALID_ARGUMENT);
  st_args_t *a = st_args_new();
  CHECK_EQ_INT(st_args_int(a, "x", 1), ST_OK);
  CHECK_ERR(st_client_put(c, "k", a, ST_KEY_PINNED, 4, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "unknown flags 0x4 (allowed: ST_PUT_READONLY, ST_PUT_LIVE)");
  CHECK_ERR(st_client_put(c, "k", a, 7, 0, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "allowed: ST_KEY_PINNED, ST_KEY_EVICTABLE");
  CHECK_ERR(st_client_get(c, "k", 0, 2, &r, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "unknown flags 0x2 (allowed: ST_GET_READONLY)");
  st_args_free(a);
  CHECK(st_client_ping(c, NULL) == ST_OK);
  st_client_close(c);
}

int main(void) {
  const char *child = getenv("STT_CLIENT_CHILD");
  if (child) return child_main(child);
  signal(SIGPIPE, SIG_DFL); /* the library must not need SIGPIPE ignored */
  stt_server_setup(&srv, NULL, endpoints);
  RUN(hello_and_ping);
  RUN(call_tensor_endpoint);
  RUN(call_plain_values_with_typed_args);
  RUN(binary_round_trips_and_cache_keys_are_exact);
  RUN(unknown_flags_are_refused);
  RUN(module_tensors_share_one_mapping);
  RUN(same_arena_twice_is_mapped_once);
  RUN(info_and_endpoints);
  RUN(results_outlive_the_client);
  RUN(missing_socket_fails_fast);
  RUN(endpoint_errors);
  RUN(timeout);
  RUN(fork_shares_and_unmaps_independently);
  RUN(second_process_maps_its_own);
  RUN(results_survive_sigkill_and_calls_fail_fast);
  return stt_server_finish(&srv);
}

/* Published keys (docs/keys.md) through libstclient against a real
 * stserver, CPU memory, readers and publishers in processes of their own
 * (the CUDA path is test_gpu_keys.c):
 *   - put, get of the latest and of a given version, keys, delete;
 *   - a put of st_tensor_alloc memory is that memory (a write of the
 *     publisher after the put is seen by a reader in another process),
 *     while a put of plain memory is a copy;
 *   - the publisher SIGKILLed: its state is still readable by another
 *     process;
 *   - evictable keys go under a small memory_budget, pinned ones do not;
 *   - limits and bad inputs give clear errors;
 *   - read-only mappings: the descriptor cannot be mapped writable, and a
 *     reader that writes dies of SIGSEGV (not the server); a key put
 *     read-only is read-only for everyone but its publisher's connection;
 *   - objects map read-only when the call asks (ST_CALL_READONLY) or
 *     their endpoint says readonly = true;
 *   - a Lua endpoint reads a published key (st.key); its cached result
 *     keeps the memory after the key is deleted;
 *   - the server's budget, descriptors and arenas are back at the start
 *     after delete.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "handoff_kit.h"
#include "wire.h"

static stt_server_t srv;
static st_client_t *cli;
static hk_figures_t baseline;

#define MIB (1024 * 1024)

/* A new CPU float32 tensor of n elements from st_tensor_alloc, element i
 * = i * scale. */
static st_result_t *alloc_filled(int64_t n, float scale) {
  st_result_t *r = stt_tensor_alloc_1d("cpu", ST_DTYPE_FLOAT32, n);
  if (!r) return NULL;
  float *p = st_result_tensor(r, 0)->data;
  for (int64_t i = 0; i < n; i++) p[i] = (float)i * scale;
  return r;
}

/* Puts {w: t} (plus an integer `step`) under key with st_client_put's
 * flags; the version or 0. */
static uint64_t put_flags(st_client_t *c, const char *key, const st_tensor_t *t,
                          int policy, int64_t step, int flags) {
  st_args_t *a = st_args_new();
  char err[256];
  uint64_t version = 0;
  if (st_args_tensor(a, "w", t, err, sizeof err) != ST_OK) fprintf(stderr, "args: %s\n", err);
  else if (st_args_int(a, "step", step) == ST_OK &&
           stt_client_report(c, key, st_client_put(c, key, a, policy, flags, &version)) != ST_OK)
    version = 0;
  st_args_free(a);
  return version;
}

static uint64_t put_one(st_client_t *c, const char *key, const st_tensor_t *t,
                        int policy, int64_t step) {
  return put_flags(c, key, t, policy, step, 0);
}

/* The float element i of tensor `name` of key's version (0: latest) read
 * by c; NaN when it cannot be read. */
static float read_elem(st_client_t *c, const char *key, uint64_t version, const char *name,
                       int64_t i, uint64_t *got) {
  st_result_t *r = NULL;
  if (st_client_get(c, key, version, 0, &r, got) != ST_OK) return __builtin_nanf("");
  const st_tensor_t *t = st_result_find(r, name);
  float v = t && i < t->numel ? ((const float *)t->data)[i] : __builtin_nanf("");
  st_result_free(r);
  return v;
}

/* Runs fn(arg) in a child process with a client of its own; its exit
 * status (0: fn returned 0), or -signal when a signal ended it. */
static int in_child(int (*fn)(st_client_t *c, void *arg), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit none = {0, 0};   /* a child expected to fault dumps no core */
    setrlimit(RLIMIT_CORE, &none);
    st_client_t *c = stt_client_open(srv.socket);
    _exit(c ? fn(c, arg) : 99);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1000;
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

/* Version 1 of a new pinned key {w: n floats i, step}: the allocation,
 * or NULL when the put failed. */
static st_result_t *put_counting(const char *key, int64_t n, int64_t step) {
  st_result_t *a = alloc_filled(n, 1.0f);
  if (a && put_one(cli, key, st_result_tensor(a, 0), ST_KEY_PINNED, step) != 1) {
    st_result_free(a);
    a = NULL;
  }
  return a;
}

/* Versions 1 and 2 of key (pinned, step 1 and 2): {w: n floats i} in *a
 * and {w: i * scale_b} in *b. 1 when both were put. */
static int two_versions(const char *key, int64_t n, float scale_b, st_result_t **a,
                        st_result_t **b) {
  *a = alloc_filled(n, 1.0f);
  *b = alloc_filled(n, scale_b);
  return *a && *b && put_one(cli, key, st_result_tensor(*a, 0), ST_KEY_PINNED, 1) == 1 &&
         put_one(cli, key, st_result_tensor(*b, 0), ST_KEY_PINNED, 2) == 2;
}

/* info's keys.versions (kept by the table as versions come and go) is
 * the versions `keys` lists, all keys together. */
static int versions_agree(void) {
  st_result_t *r = NULL;
  if (st_client_keys(cli, NULL, &r) != ST_OK) return 0;
  int64_t listed = 0;
  const st_value_t *list = st_result_value(r);
  for (size_t i = 0; i < list->as.array.len; i++)
    listed += (int64_t)st_value_get(&list->as.array.items[i], "versions")->as.array.len;
  st_result_free(r);
  int64_t info = hk_info(cli, "keys", "versions", NULL);
  if (info != listed)
    fprintf(stderr, "   info keys.versions %lld, listed %lld\n", (long long)info,
            (long long)listed);
  return info == listed;
}

TEST(put_get_versions_keys_delete) {
  st_result_t *a, *b;
  int64_t versions0 = hk_info(cli, "keys", "versions", NULL);
  CHECK(two_versions("model/a", 1024, 2.0f, &a, &b));
  CHECK_EQ_INT(hk_info(cli, "keys", "versions", NULL), versions0 + 2);
  uint64_t got = 0;
  CHECK(read_elem(cli, "model/a", 0, "w", 10, &got) == 20.0f);
  CHECK_EQ_INT(got, 2);
  CHECK(read_elem(cli, "model/a", 1, "w", 10, &got) == 10.0f);
  CHECK_EQ_INT(got, 1);
  /* the value comes back whole: the integer too */
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "model/a", 1, 0, &r, NULL), ST_OK, cli);
  const st_value_t *step = st_value_get(st_result_value(r), "step");
  CHECK(step && step->kind == ST_VALUE_INT && step->as.integer == 1);
  st_result_free(r);
  CHECK_EQ_INT(put_one(cli, "other", st_result_tensor(a, 0), ST_KEY_EVICTABLE, 0), 1);
  CHECK(versions_agree());
  CHECK_RC(st_client_keys(cli, "model/", &r), ST_OK, cli);
  const st_value_t *list = st_result_value(r);
  CHECK(list->kind == ST_VALUE_ARRAY && list->as.array.len == 1);
  const st_value_t *k0 = &list->as.array.items[0];
  CHECK_STR_EQ(st_value_get(k0, "key")->as.str.ptr, "model/a");
  CHECK_EQ_INT(st_value_get(k0, "version")->as.integer, 2);
  CHECK_EQ_INT(st_value_get(k0, "versions")->as.array.len, 2);
  CHECK_EQ_INT(st_value_get(k0, "bytes")->as.integer, 2 * 4096);
  CHECK_STR_EQ(st_value_get(k0, "policy")->as.str.ptr, "pinned");
  CHECK_STR_EQ(st_value_get(k0, "device")->as.str.ptr, "cpu");
  st_result_free(r);
  CHECK_RC(st_client_keys(cli, NULL, &r), ST_OK, cli);
  CHECK_EQ_INT(st_result_value(r)->as.array.len, 2);
  st_result_free(r);
  CHECK_RC(st_client_delete(cli, "model/a"), ST_OK, cli);
  CHECK_RC(st_client_delete(cli, "other"), ST_OK, cli);
  CHECK_RC(st_client_get(cli, "model/a", 0, 0, &r, NULL), ST_ERR_NOT_FOUND, cli);
  CHECK_CONTAINS(st_client_error(cli), "no key 'model/a'");
  CHECK_EQ_INT(hk_info(cli, "keys", "versions", NULL), versions0);
  st_result_free(a);
  st_result_free(b);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

static int child_reads_42(st_client_t *c, void *arg) {
  (void)arg;
  return read_elem(c, "shared", 0, "w", 5, NULL) == 42.0f ? 0 : 1;
}

static int child_reads_5(st_client_t *c, void *arg) {
  (void)arg;
  return read_elem(c, "copied", 0, "w", 5, NULL) == 5.0f ? 0 : 1;
}

TEST(adopted_memory_is_shared_and_plain_memory_is_copied) {
  st_result_t *a = alloc_filled(256, 1.0f);
  CHECK(a);
  const st_tensor_t *t = st_result_tensor(a, 0);
  CHECK_EQ_INT(put_one(cli, "shared", t, ST_KEY_PINNED, 0), 1);
  ((float *)t->data)[5] = 42.0f;   /* after the put: the same memory */
  CHECK_EQ_INT(in_child(child_reads_42, NULL), 0);
  /* plain memory: st_args_tensor refuses it, st_args_tensor_copy copies */
  float *plain = malloc(256 * sizeof(float));
  for (int i = 0; i < 256; i++) plain[i] = (float)i;
  st_tensor_t pt = *t;
  pt.data = plain;
  st_args_t *args = st_args_new();
  char err[256];
  CHECK_ERR(st_args_tensor(args, "w", &pt, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "was not allocated with st_tensor_alloc");
  int copied = 0;
  CHECK_ERR_MSG(st_args_tensor_copy(args, "w", &pt, &copied, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(copied, 1);
  CHECK_RC(st_client_put(cli, "copied", args, ST_KEY_PINNED, 0, NULL), ST_OK, cli);
  st_args_free(args);
  plain[5] = 99.0f;   /* not seen: the key holds a copy */
  CHECK_EQ_INT(in_child(child_reads_5, NULL), 0);
  /* memory of st_tensor_alloc is not copied */
  args = st_args_new();
  CHECK_ERR_MSG(st_args_tensor_copy(args, "w", t, &copied, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(copied, 0);
  st_args_free(args);
  free(plain);
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, "shared"), ST_OK, cli);
  CHECK_RC(st_client_delete(cli, "copied"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

static int child_puts_then_dies(st_client_t *c, void *arg) {
  (void)arg;
  st_result_t *a = alloc_filled(4096, 3.0f);
  if (!a || put_one(c, "orphan", st_result_tensor(a, 0), ST_KEY_PINNED, 7) != 1) return 1;
  kill(getpid(), SIGKILL);
  return 2;
}

TEST(state_outlives_a_publisher_killed) {
  CHECK_EQ_INT(in_child(child_puts_then_dies, NULL), -SIGKILL);
  uint64_t got = 0;
  CHECK(read_elem(cli, "orphan", 0, "w", 4095, &got) == 4095.0f * 3.0f);
  CHECK_EQ_INT(got, 1);
  CHECK_RC(st_client_delete(cli, "orphan"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

TEST(evictable_keys_go_under_the_budget_and_pinned_ones_stay) {
  /* memory_budget.cpu is 48 MiB: a pinned 16 MiB key, then evictable
   * 12 MiB keys until the oldest evictable one goes. */
  const int64_t big = 4 * MIB, mid = 3 * MIB;   /* floats: 16 and 12 MiB */
  st_result_t *p = alloc_filled(big, 1.0f);
  CHECK(p);
  CHECK_EQ_INT(put_one(cli, "pinned", st_result_tensor(p, 0), ST_KEY_PINNED, 0), 1);
  st_result_t *e[3];
  char name[32];
  for (int i = 0; i < 3; i++) {
    e[i] = alloc_filled(mid, 1.0f);
    CHECK(e[i]);
    snprintf(name, sizeof name, "ev%d", i);
    CHECK_EQ_INT(put_one(cli, name, st_result_tensor(e[i], 0), ST_KEY_EVICTABLE, i), 1);
  }
  /* 16 + 3 * 12 = 52 MiB > 48: ev0 went, the rest stay */
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "ev0", 0, 0, &r, NULL), ST_ERR_NOT_FOUND, cli);
  CHECK_CONTAINS(st_client_error(cli), "evicted under the memory budget");
  CHECK(read_elem(cli, "ev1", 0, "w", 1, NULL) == 1.0f);
  CHECK(read_elem(cli, "ev2", 0, "w", 1, NULL) == 1.0f);
  CHECK(read_elem(cli, "pinned", 0, "w", 1, NULL) == 1.0f);
  CHECK_EQ_INT(hk_info(cli, "keys", "count", NULL), 3);
  CHECK_EQ_INT(hk_info(cli, "keys", "evictions", NULL), 1);
  CHECK_EQ_INT(hk_info(cli, "keys", "bytes", NULL), 16 * MIB + 2 * 12 * MIB);
  CHECK(versions_agree());   /* the evicted version is not counted */
  /* a pinned key too big for what evictions can free is refused */
  st_result_t *huge = alloc_filled(9 * MIB, 1.0f);   /* 36 MiB */
  CHECK(huge);
  CHECK_EQ_INT(put_one(cli, "huge", st_result_tensor(huge, 0), ST_KEY_PINNED, 0), 0);
  CHECK_CONTAINS(st_client_error(cli), "memory_budget.cpu");
  CHECK(read_elem(cli, "pinned", 0, "w", 1, NULL) == 1.0f);
  st_result_free(huge);
  CHECK_RC(st_client_delete(cli, "pinned"), ST_OK, cli);
  st_client_delete(cli, "ev1");
  st_client_delete(cli, "ev2");
  st_result_free(p);
  for (int i = 0; i < 3; i++) st_result_free(e[i]);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

TEST(limits_and_bad_inputs_give_clear_errors) {
  st_result_t *a = alloc_filled(16, 1.0f);
  CHECK(a);
  const st_tensor_t *t = st_result_tensor(a, 0);
  CHECK_EQ_INT(put_one(cli, "bad name", t, ST_KEY_PINNED, 0), 0);
  CHECK_CONTAINS(st_client_error(cli), "character 4 is not one of");
  char longname[200];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  CHECK_EQ_INT(put_one(cli, longname, t, ST_KEY_PINNED, 0), 0);
  CHECK_CONTAINS(st_client_error(cli), "a key name is 1 to 128 characters");
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "nope", 0, 0, &r, NULL), ST_ERR_NOT_FOUND, cli);
  CHECK_RC(st_client_delete(cli, "nope"), ST_ERR_NOT_FOUND, cli);
  /* keys.max_versions = 2: version 1 goes at the third put */
  for (int i = 1; i <= 3; i++) CHECK_EQ_INT(put_one(cli, "v", t, ST_KEY_PINNED, i), i);
  CHECK_RC(st_client_get(cli, "v", 1, 0, &r, NULL), ST_ERR_NOT_FOUND, cli);
  CHECK_CONTAINS(st_client_error(cli), "key 'v' has no version 1 (kept: 2..3");
  CHECK_RC(st_client_get(cli, "v", 9, 0, &r, NULL), ST_ERR_NOT_FOUND, cli);
  /* keys.max_keys = 4 */
  char name[16];
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "k%d", i);
    CHECK_EQ_INT(put_one(cli, name, t, ST_KEY_PINNED, 0), 1);
  }
  CHECK_EQ_INT(put_one(cli, "k3", t, ST_KEY_PINNED, 0), 0);
  CHECK_CONTAINS(st_client_error(cli), "at most 4 keys (keys.max_keys)");
  /* a value with no tensor is fine; a tensor with no arena is not */
  st_args_t *args = st_args_new();
  st_args_int(args, "n", 3);
  CHECK_RC(st_client_put(cli, "v", args, ST_KEY_PINNED, 0, NULL), ST_OK, cli);
  st_args_free(args);
  CHECK_RC(st_client_put(cli, "v", NULL, ST_KEY_PINNED, 0, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_RC(st_client_put(cli, "v", st_args_new(), 7, 0, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "k%d", i);
    CHECK_RC(st_client_delete(cli, name), ST_OK, cli);
  }
  CHECK_RC(st_client_delete(cli, "v"), ST_OK, cli);
  st_result_free(a);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* Gets key "ro" (readonly: flags), checks w[5] == 5, then writes it: a
 * read-only mapping dies here of SIGSEGV. */
static int child_writes(st_client_t *c, void *arg) {
  st_result_t *r = NULL;
  if (st_client_get(c, "ro", 0, *(int *)arg, &r, NULL) != ST_OK) return 1;
  float *w = st_result_find(r, "w")->data;
  if (w[5] != 5.0f) return 2;
  w[5] = -1.0f;
  st_result_free(r);
  return 0;
}

TEST(readonly_mappings_refuse_writes) {
  st_result_t *a = put_counting("ro", 1024, 0);
  CHECK(a);
  /* the wire: the descriptor of a read-only get cannot map writable */
  rc_t w;
  CHECK(rc_open(&w, srv.socket) == 0);
  msg_t m;
  CHECK(rc_rpcf(&w, &m, "[0, 1, 'get', [{key: 'ro', readonly: true}]]") == 1);
  CHECK_EQ_INT(msg_code(&m), 0);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "readonly")), 1);
  const msgpack_object *arenas = obj_get(m.result, "arenas");
  CHECK(arenas && arenas->via.array.size == 1);
  CHECK_EQ_INT(obj_int(obj_get(&arenas->via.array.ptr[0], "readonly")), 1);
  CHECK_EQ_INT(w.nfds, 1);
  size_t len = (size_t)obj_int(obj_get(&arenas->via.array.ptr[0], "bytes"));
  errno = 0;
  CHECK(mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, w.fds[0], 0) == MAP_FAILED);
  CHECK_EQ_INT(errno, EACCES);
  float *p = mmap(NULL, len, PROT_READ, MAP_SHARED, w.fds[0], 0);
  CHECK(p != MAP_FAILED);
  CHECK(p[7] == 7.0f);
  CHECK(mprotect(p, len, PROT_READ | PROT_WRITE) != 0);
  munmap(p, len);
  msg_free(&m);
  rc_close(&w);
  /* a reader that asked for read-only and writes dies, the server lives */
  int ro = ST_GET_READONLY, rw = 0;
  CHECK_EQ_INT(in_child(child_writes, &ro), -SIGSEGV);
  CHECK(read_elem(cli, "ro", 0, "w", 5, NULL) == 5.0f);
  /* without the flag it may write (the adoption contract) */
  CHECK_EQ_INT(in_child(child_writes, &rw), 0);
  CHECK(read_elem(cli, "ro", 0, "w", 5, NULL) == -1.0f);
  ((float *)st_result_tensor(a, 0)->data)[5] = 5.0f;
  /* a key put read-only: read-only for every other connection... */
  CHECK_EQ_INT(put_flags(cli, "ro", st_result_tensor(a, 0), ST_KEY_PINNED, 0, ST_PUT_READONLY), 2);
  CHECK_EQ_INT(in_child(child_writes, &rw), -SIGSEGV);
  /* ...but not for the publisher's own */
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "ro", 0, 0, &r, NULL), ST_OK, cli);
  ((float *)st_result_find(r, "w")->data)[6] = 66.0f;
  st_result_free(r);
  CHECK(((float *)st_result_tensor(a, 0)->data)[6] == 66.0f);
  CHECK_RC(st_client_delete(cli, "ro"), ST_OK, cli);
  st_result_free(a);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* A tensor of `key`'s w scaled by 1 (the same memory), cached per key. */
static const stt_endpoint_t endpoints[] = {
    {"fromkey.lua",
     "return st.endpoint{ name = \"fromkey\", cache = true,\n"
     "  params = { key = st.required, version = 0 },\n"
     "  build = function(a)\n"
     "    local v, ver = st.key(a.key, a.version > 0 and a.version or nil)\n"
     "    if not v then error(ver) end\n"
     "    return { w = v.w, version = ver, step = v.step }\n"
     "  end }\n"},
    {"rozeros.lua",
     "return st.endpoint{ name = \"rozeros\", cache = true, readonly = true,\n"
     "  build = function() return { w = st.zeros{16} } end }\n"},
    {NULL, NULL}};

/* A call of `endpoint` (no arguments) with `flags`, then a write into the
 * first element of its tensor w: a read-only mapping dies here. */
typedef struct call_write {
  const char *endpoint;
  const char *key;
  int flags;
} call_write_t;

static int child_call_writes(st_client_t *c, void *arg) {
  const call_write_t *w = arg;
  st_args_t *a = st_args_new();
  if (w->key) st_args_string(a, "key", w->key);
  st_result_t *r = NULL;
  if (st_client_call_flags(c, w->endpoint, a, w->flags, &r) != ST_OK) return 1;
  const st_tensor_t *t = st_result_find(r, "w");
  if (!t) return 2;
  ((float *)t->data)[0] = 5.0f;
  st_result_free(r);
  st_args_free(a);
  return 0;
}

TEST(objects_map_readonly_by_call_or_by_endpoint) {
  /* the call asks: a cached object of fromkey */
  st_result_t *a = put_counting("obj", 64, 1);
  CHECK(a);
  call_write_t ro = {"fromkey", "obj", ST_CALL_READONLY}, rw = {"fromkey", "obj", 0};
  CHECK_EQ_INT(in_child(child_call_writes, &ro), -SIGSEGV);
  CHECK_EQ_INT(in_child(child_call_writes, &rw), 0);
  CHECK(((float *)st_result_tensor(a, 0)->data)[0] == 5.0f);
  /* the endpoint says readonly = true: every caller maps it read-only */
  call_write_t ep = {"rozeros", NULL, 0};
  CHECK_EQ_INT(in_child(child_call_writes, &ep), -SIGSEGV);
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(cli, "rozeros", NULL, &r), ST_OK, cli);
  CHECK(((const float *)st_result_find(r, "w")->data)[0] == 0.0f);
  st_result_free(r);
  CHECK_RC(st_client_delete(cli, "obj"), ST_OK, cli);
  CHECK_RC(st_client_invalidate_endpoint(cli, "fromkey", NULL), ST_OK, cli);
  CHECK_RC(st_client_invalidate_endpoint(cli, "rozeros", NULL), ST_OK, cli);
  st_result_free(a);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* fromkey's w[i] for (key, version); NaN on failure. */
static float from_endpoint(const char *key, int64_t version, int64_t i, int64_t *got) {
  st_args_t *a = st_args_new();
  st_args_string(a, "key", key);
  st_args_int(a, "version", version);
  st_result_t *r = NULL;
  float v = __builtin_nanf("");
  if (st_client_call(cli, "fromkey", a, &r) == ST_OK) {
    const st_tensor_t *t = st_result_find(r, "w");
    if (t && i < t->numel) v = ((const float *)t->data)[i];
    *got = st_value_get(st_result_value(r), "version")->as.integer;
  }
  st_args_free(a);
  st_result_free(r);
  return v;
}

TEST(a_lua_endpoint_reads_a_published_key) {
  st_result_t *a, *b;
  CHECK(two_versions("lk", 64, 5.0f, &a, &b));
  int64_t got = 0;
  CHECK(from_endpoint("lk", 0, 3, &got) == 15.0f);
  CHECK_EQ_INT(got, 2);
  CHECK(from_endpoint("lk", 1, 3, &got) == 3.0f);
  CHECK_EQ_INT(got, 1);
  /* the endpoint's tensor is the publisher's memory */
  ((float *)st_result_tensor(a, 0)->data)[3] = 7.0f;
  CHECK_RC(st_client_delete(cli, "lk"), ST_OK, cli);
  /* the cached object keeps its references after the delete */
  CHECK(from_endpoint("lk", 1, 3, &got) == 7.0f);
  /* a key that is not there fails the build with the reason (version 3:
   * no cache entry) */
  st_args_t *args = st_args_new();
  st_args_string(args, "key", "lk");
  st_args_int(args, "version", 3);
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(cli, "fromkey", args, &r), ST_ERR_ENDPOINT, cli);
  CHECK_CONTAINS(st_client_error(cli), "no key 'lk'");
  st_args_free(args);
  CHECK_RC(st_client_invalidate_endpoint(cli, "fromkey", NULL), ST_OK, cli);
  st_result_free(a);
  st_result_free(b);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

int main(void) {
  cli = hk_start(&srv,
                 "memory_budget = { cpu = 48 * 1024 * 1024 }, keys = { max_keys = 4, "
                 "max_versions = 2 }, pool = { max_regions = 0 },",
                 endpoints, &baseline);
  RUN(put_get_versions_keys_delete);
  RUN(adopted_memory_is_shared_and_plain_memory_is_copied);
  RUN(state_outlives_a_publisher_killed);
  RUN(evictable_keys_go_under_the_budget_and_pinned_ones_stay);
  RUN(limits_and_bad_inputs_give_clear_errors);
  RUN(readonly_mappings_refuse_writes);
  RUN(a_lua_endpoint_reads_a_published_key);
  RUN(objects_map_readonly_by_call_or_by_endpoint);
  return stt_client_finish(cli, &srv);
}

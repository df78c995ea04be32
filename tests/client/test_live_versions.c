/* Live keys (docs/views.md, section 3; docs/keys.md, section 8) through
 * libstclient against a real stserver, CPU memory: what a live key's
 * version is, what a put into one that does not match changes, and a torn
 * key's get through a view:
 *   - a live key has one version, its page's: get, get through a view,
 *     st_get_into through a view, `keys` (version and versions) and st.key
 *     all report it; asking for it by that number works, any other
 *     number is NOT_FOUND with the current one in the message;
 *   - a put into a live key whose tensors differ (a shape, a dtype, a
 *     name, one tensor fewer) changes nothing: no byte, no version, and
 *     the publisher keeps publishing; a matching one still takes it over;
 *   - get through a view of a torn key answers STALE_HANDLE and leaves
 *     nothing behind in the server (its heap does not grow).
 */
#include <stdlib.h>
#include <unistd.h>

#include "handoff_kit.h"
#include "live_kit.h"

static stt_server_t srv;
static st_client_t *cli;
static hk_figures_t baseline;

#define N 16   /* float32 elements of w */

/* A CPU tensor of n elements of `dtype` (st_tensor_alloc), each float
 * element `fill` (0 for other dtypes). */
static st_result_t *alloc_w(int64_t n, st_dtype_t dtype, float fill) {
  st_result_t *r = stt_tensor_alloc_1d("cpu", dtype, n);
  if (!r) return NULL;
  float *f = st_result_tensor(r, 0)->data;
  for (int64_t i = 0; dtype == ST_DTYPE_FLOAT32 && i < n; i++) f[i] = fill;
  return r;
}

/* Whether every float of r's first tensor is `want`. */
static int w_is(const st_result_t *r, float want) {
  const st_tensor_t *t = st_result_tensor(r, 0);
  for (int64_t i = 0; t && i < t->numel; i++)
    if (((const float *)t->data)[i] != want) return 0;
  return t != NULL;
}

/* The `keys` entry of key: field `field` of it as an integer, or, for
 * "versions", its only element (-1 unless it has exactly one). */
static int64_t listed(const char *key, const char *field) {
  st_result_t *r = NULL;
  int64_t out = -1;
  if (st_client_keys(cli, key, &r) != ST_OK) return -1;
  const st_value_t *l = st_result_value(r);
  const st_value_t *f = l && l->kind == ST_VALUE_ARRAY && l->as.array.len == 1
                            ? st_value_get(&l->as.array.items[0], field)
                            : NULL;
  if (f && f->kind == ST_VALUE_ARRAY && f->as.array.len == 1) f = &f->as.array.items[0];
  if (f && f->kind == ST_VALUE_INT) out = f->as.integer;
  st_result_free(r);
  return out;
}

/* st.key(key[, version]) in an endpoint: {version} or {err}. */
static const stt_endpoint_t endpoints[] = {
    {"keyat.lua",
     "return st.endpoint{ name = \"keyat\", params = { key = st.required, version = 0 },\n"
     "  build = function(a)\n"
     "    local v, ver = st.key(a.key, a.version > 0 and a.version or nil)\n"
     "    if not v then return { err = ver } end\n"
     "    return { version = ver }\n"
     "  end }\n"},
    {NULL, NULL}};

/* The endpoint's answer for (key, version): the version, or -1 with the
 * error in err. */
static int64_t lua_key(const char *key, int64_t version, char *err, size_t errlen) {
  st_args_t *p = st_args_new();
  st_args_string(p, "key", key);
  st_args_int(p, "version", version);
  st_result_t *r = NULL;
  int64_t out = -1;
  int rc = st_client_call(cli, "keyat", p, &r);
  snprintf(err, errlen, "call: %s", rc == ST_OK ? "ok" : st_client_error(cli));
  const st_value_t *v = r ? st_value_get(st_result_value(r), "version") : NULL;
  const st_value_t *e = r ? st_value_get(st_result_value(r), "err") : NULL;
  if (v && v->kind == ST_VALUE_INT) out = v->as.integer;
  if (e && e->kind == ST_VALUE_STRING) snprintf(err, errlen, "%s", e->as.str.ptr);
  st_result_free(r);
  st_args_free(p);
  return out;
}

/* ------------------------------------------------------------ versions */

TEST(a_live_keys_version_is_its_pages_everywhere) {
  st_result_t *a = alloc_w(N, ST_DTYPE_FLOAT32, 1.0f);
  CHECK(a != NULL);
  CHECK_RC(lk_put_live(cli, "lv", st_result_tensor(a, 0), ST_KEY_PINNED, NULL), ST_OK, cli);
  st_key_t *k = NULL;
  CHECK_EQ_INT(st_key_open(cli, "lv", 0, &k), ST_OK);
  CHECK_EQ_INT(lk_update(k, alloc_w(N, ST_DTYPE_FLOAT32, 2.0f)), ST_OK);
  CHECK_EQ_INT(lk_update(k, alloc_w(N, ST_DTYPE_FLOAT32, 3.0f)), ST_OK);
  CHECK_EQ_INT(st_key_version(k), 3);
  /* get, plain and through a view; by its number, or none */
  st_result_t *g = NULL;
  uint64_t got = 0;
  CHECK_RC(st_client_get(cli, "lv", 0, 0, &g, &got), ST_OK, cli);
  CHECK_EQ_INT(got, 3);
  st_result_free(g);
  const char *view = "w:narrow(0,0,4)";
  for (uint64_t asked = 0; asked <= 3; asked += 3) {
    got = 0;
    CHECK_RC(st_client_get_view(cli, "lv", asked, 0, view, &g, &got), ST_OK, cli);
    CHECK_EQ_INT(got, 3);
    CHECK(w_is(g, 3.0f) && st_result_tensor(g, 0)->numel == 4);
    st_result_free(g);
  }
  CHECK_RC(st_client_get(cli, "lv", 3, 0, &g, &got), ST_OK, cli);
  st_result_free(g);
  /* any other number: NOT_FOUND naming the current one */
  CHECK_RC(st_client_get(cli, "lv", 1, 0, &g, &got), ST_ERR_NOT_FOUND, cli);
  CHECK_CONTAINS(st_client_error(cli), "has only its current version 3 (asked: 1");
  CHECK_RC(st_client_get_view(cli, "lv", 2, 0, view, &g, &got), ST_ERR_NOT_FOUND, cli);
  /* st_get_into through a view */
  st_result_t *d = alloc_w(4, ST_DTYPE_FLOAT32, 0.0f);
  CHECK(d != NULL);
  st_tensor_t dst = *st_result_tensor(d, 0);
  dst.name = "w";
  got = 0;
  CHECK_RC(st_get_into(cli, "lv", 0, view, &dst, 1, NULL, &got), ST_OK, cli);
  CHECK_EQ_INT(got, 3);
  CHECK(w_is(d, 3.0f));
  st_result_free(d);
  /* keys: its version and its only one */
  CHECK_EQ_INT(listed("lv", "version"), 3);
  CHECK_EQ_INT(listed("lv", "versions"), 3);
  /* st.key: the latest, its number, another number */
  char err[300];
  CHECK_EQ_INT(lua_key("lv", 0, err, sizeof err), 3);
  CHECK_EQ_INT(lua_key("lv", 3, err, sizeof err), 3);
  CHECK_EQ_INT(lua_key("lv", 1, err, sizeof err), -1);
  CHECK_CONTAINS(err, "has only its current version 3 (asked: 1");
  st_key_close(k);
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, "lv"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* ------------------------------------------------------------ take-over */

/* A live put into key from c of {names[i]: tensor 0 of ts[i]}. */
static int put_tensors(st_client_t *c, const char *key, const char *const *names,
                       st_result_t *const *ts, size_t n) {
  st_args_t *p = st_args_new();
  char err[256];
  int rc = ST_OK;
  for (size_t i = 0; rc == ST_OK && i < n; i++)
    rc = st_args_tensor(p, names[i], st_result_tensor(ts[i], 0), err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(c, key, p, ST_KEY_PINNED, ST_PUT_LIVE, NULL);
  st_args_free(p);
  return rc;
}

TEST(a_put_that_does_not_match_a_live_key_changes_nothing) {
  st_result_t *w = alloc_w(N, ST_DTYPE_FLOAT32, 1.0f), *b = alloc_w(8, ST_DTYPE_FLOAT32, 1.0f);
  CHECK(w && b);
  const char *names[2] = {"w", "b"};
  st_result_t *mine[2] = {w, b};
  CHECK_RC(put_tensors(cli, "tm", names, mine, 2), ST_OK, cli);
  st_key_t *k = NULL;
  CHECK_EQ_INT(st_key_open(cli, "tm", 0, &k), ST_OK);
  CHECK(st_key_is_publisher(k));
  st_client_t *c2 = stt_client_open(srv.socket);
  CHECK(c2 != NULL);
  st_result_t *w7 = alloc_w(N, ST_DTYPE_FLOAT32, 7.0f), *b7 = alloc_w(8, ST_DTYPE_FLOAT32, 7.0f),
              *small = alloc_w(4, ST_DTYPE_FLOAT32, 7.0f), *ints = alloc_w(N, ST_DTYPE_INT32, 0);
  CHECK(w7 && b7 && small && ints);
  struct {
    const char *names[2];
    st_result_t *ts[2];
    size_t n;
    const char *says;
  } bad[] = {
      {{"w", "b"}, {small, b7}, 2, "tensor 'w' is float32 of 1 dims (first 16); the put gives "
                                   "float32 of 1 dims (first 4)"},
      {{"w", "b"}, {ints, b7}, 2, "the put gives int32"},
      {{"w", "c"}, {w7, b7}, 2, "has no tensor named 'c'"},
      {{"w", NULL}, {w7, NULL}, 1, "has 2 tensors; the put gives 1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_RC(put_tensors(c2, "tm", bad[i].names, bad[i].ts, bad[i].n), ST_ERR_INVALID_ARGUMENT,
             c2);
    const char *why = st_client_error(c2);
    /* nothing changed: the bytes, the version, who publishes */
    CHECK(w_is(st_key_result(k), 1.0f));
    CHECK_EQ_INT(st_key_version(k), 1 + i);
    CHECK_EQ_INT(st_key_begin_update(k), ST_OK);
    CHECK_EQ_INT(st_key_end_update(k, NULL), ST_OK);
    CHECK_EQ_INT(st_key_version(k), 2 + i);
    CHECK_CONTAINS(why, bad[i].says);
  }
  st_key_t *k2 = NULL;
  CHECK_EQ_INT(st_key_open(c2, "tm", 0, &k2), ST_OK);
  CHECK(!st_key_is_publisher(k2));
  st_key_close(k2);
  /* a matching put still takes it over, in place */
  st_result_t *all7[2] = {w7, b7};
  CHECK_RC(put_tensors(c2, "tm", names, all7, 2), ST_OK, c2);
  CHECK(w_is(w, 7.0f));
  CHECK_EQ_INT(st_key_begin_update(k), ST_ERR_STALE_HANDLE);
  st_key_close(k);
  st_client_close(c2);
  st_result_t *all[] = {w, b, w7, b7, small, ints};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) st_result_free(all[i]);
  CHECK_RC(st_client_delete(cli, "tm"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* ------------------------------------------------------------ torn view */

/* The server's VmData (its heap and private mappings), KiB; -1 unknown. */
static long vm_data_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmData: %ld kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}

TEST(a_torn_keys_get_through_a_view_leaves_nothing_behind) {
  /* a publisher on its own connection leaves in the middle of an update */
  st_client_t *c2 = stt_client_open(srv.socket);
  st_result_t *w = alloc_w(N, ST_DTYPE_FLOAT32, 1.0f);
  CHECK(c2 && w);
  CHECK_RC(lk_put_live(c2, "tv", st_result_tensor(w, 0), ST_KEY_PINNED, NULL), ST_OK, c2);
  st_key_t *k = NULL;
  CHECK_EQ_INT(st_key_open(c2, "tv", 0, &k), ST_OK);
  CHECK_EQ_INT(st_key_begin_update(k), ST_OK);
  st_key_close(k);
  st_client_close(c2);
  CHECK_EQ_INT(lk_get_until_refused(cli, "tv"), ST_ERR_STALE_HANDLE);
  /* the largest spec: 64 rules, ~150 KiB parsed, each get's own */
  st_result_t *g = NULL;
  char view[64 * 17];
  size_t at = 0;
  for (int i = 0; i < 64; i++)
    at += (size_t)snprintf(view + at, sizeof view - at, "%sw:narrow(0,0,1)", i ? ";" : "");
  for (int i = 0; i < 20; i++) st_client_get_view(cli, "tv", 0, 0, view, &g, NULL);
  long before = vm_data_kib(srv.pid);
  for (int i = 0; i < 200; i++) {
    CHECK_RC(st_client_get_view(cli, "tv", 0, 0, view, &g, NULL), ST_ERR_STALE_HANDLE, cli);
    CHECK_CONTAINS(st_client_error(cli), "is torn");
  }
  long after = vm_data_kib(srv.pid);
  fprintf(stderr, "   server VmData: %ld KiB before, %ld KiB after 200 gets\n", before, after);
  CHECK(before > 0 && after > 0);
  CHECK(after - before < 4096);   /* a leak keeps ~30 MiB */
  st_result_free(w);
  CHECK_RC(st_client_delete(cli, "tv"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

int main(void) {
  cli = hk_start(&srv, "memory_budget = { cpu = 64 * 1024 * 1024 },", endpoints, &baseline);
  RUN(a_live_keys_version_is_its_pages_everywhere);
  RUN(a_put_that_does_not_match_a_live_key_changes_nothing);
  RUN(a_torn_keys_get_through_a_view_leaves_nothing_behind);
  return stt_client_finish(cli, &srv);
}

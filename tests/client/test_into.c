/* Loading into caller-owned tensors (st_get_into, st_result_copy_into;
 * docs/views.md, section 2) through libstclient against a real stserver,
 * CPU memory, the publisher in a process of its own (the CUDA path is
 * test_gpu_into.c):
 *   - a key's tensors land in the reader's own memory, equal, by name, in
 *     any order; a version asked for is the one copied;
 *   - a second st_get_into of a key maps nothing new (the open-cache
 *     reuses the kept source), and st_client_close lets go of it;
 *   - every difference is refused at once, listed by name (missing, extra,
 *     shape, dtype, twice), and nothing is copied: the destinations are
 *     unchanged after a refused call;
 *   - destinations that cannot be copied into (not contiguous, no name,
 *     NULL data) and a view are refused before the get;
 *   - contiguity is the one rule of st_tensor_is_contiguous: a destination
 *     without elements is copied into whatever its strides;
 *   - st_result_copy_into from a cached object's result;
 *   - the server's budget, descriptors and arenas are back at the start.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "handoff_kit.h"

static stt_server_t srv;
static st_client_t *cli;
static hk_figures_t baseline;

/* The state dict the publisher puts: w [4, 8] float32 (i * scale), b [8]
 * float32 (scale), n [3] int32 (i + step), and a plain value `step`. */
static const int64_t W_SHAPE[2] = {4, 8}, B_SHAPE[1] = {8}, N_SHAPE[1] = {3};

static st_result_t *alloc(st_dtype_t dt, int ndim, const int64_t *shape) {
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc("cpu", dt, ndim, shape, &r, err, sizeof err) != ST_OK)
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
  return r;
}

/* Puts version `step` of `key` from this process's client c. 0 on
 * success. */
static int publish(st_client_t *c, const char *key, int step) {
  st_result_t *w = alloc(ST_DTYPE_FLOAT32, 2, W_SHAPE), *b = alloc(ST_DTYPE_FLOAT32, 1, B_SHAPE),
              *n = alloc(ST_DTYPE_INT32, 1, N_SHAPE);
  if (!w || !b || !n) return 1;
  float *pw = st_result_tensor(w, 0)->data, *pb = st_result_tensor(b, 0)->data;
  int32_t *pn = st_result_tensor(n, 0)->data;
  for (int i = 0; i < 32; i++) pw[i] = (float)i * (float)step;
  for (int i = 0; i < 8; i++) pb[i] = (float)step;
  for (int i = 0; i < 3; i++) pn[i] = i + step;
  st_args_t *a = st_args_new();
  char err[256] = "";
  int rc = st_args_tensor(a, "w", st_result_tensor(w, 0), err, sizeof err);
  if (rc == ST_OK) rc = st_args_tensor(a, "b", st_result_tensor(b, 0), err, sizeof err);
  if (rc == ST_OK) rc = st_args_tensor(a, "n", st_result_tensor(n, 0), err, sizeof err);
  if (rc == ST_OK) rc = st_args_int(a, "step", step);
  if (rc == ST_OK) rc = st_client_put(c, key, a, ST_KEY_PINNED, 0, NULL);
  if (rc != ST_OK) fprintf(stderr, "   put %s: %s %s\n", key, err, st_client_error(c));
  st_args_free(a);
  st_result_free(w);
  st_result_free(b);
  st_result_free(n);
  return rc != ST_OK;
}

/* Versions 1..steps of key put by a process of its own, which exits: 1
 * when it did. */
static int publish_in_child(const char *key, int steps) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    st_client_t *c = stt_client_open(srv.socket);
    int bad = !c;
    for (int s = 1; s <= steps && !bad; s++) bad = publish(c, key, s);
    st_client_close(c);
    _exit(bad);
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

/* The reader's own memory: plain malloc'd buffers, filled with a marker
 * that no published value has. */
typedef struct dests {
  float w[32], b[8];
  int32_t n[3];
  st_tensor_t t[3];
} dests_t;

static void dests_init(dests_t *d) {
  for (int i = 0; i < 32; i++) d->w[i] = -1.0f;
  for (int i = 0; i < 8; i++) d->b[i] = -1.0f;
  for (int i = 0; i < 3; i++) d->n[i] = -1;
  /* in another order than the put's */
  d->t[0] = (st_tensor_t){.name = "n", .data = d->n, .dtype = ST_DTYPE_INT32, .ndim = 1,
                          .shape = N_SHAPE, .device = ST_DEVICE_CPU, .device_index = -1};
  d->t[1] = (st_tensor_t){.name = "w", .data = d->w, .dtype = ST_DTYPE_FLOAT32, .ndim = 2,
                          .shape = W_SHAPE, .device = ST_DEVICE_CPU, .device_index = -1};
  d->t[2] = (st_tensor_t){.name = "b", .data = d->b, .dtype = ST_DTYPE_FLOAT32, .ndim = 1,
                          .shape = B_SHAPE, .device = ST_DEVICE_CPU, .device_index = -1};
}

/* 1 when d holds version `step` exactly. */
static int holds(const dests_t *d, int step) {
  for (int i = 0; i < 32; i++)
    if (d->w[i] != (float)i * (float)step) return 0;
  for (int i = 0; i < 8; i++)
    if (d->b[i] != (float)step) return 0;
  for (int i = 0; i < 3; i++)
    if (d->n[i] != i + step) return 0;
  return 1;
}

/* 1 when nothing of d was written. */
static int untouched(const dests_t *d) {
  dests_t fresh;
  dests_init(&fresh);
  return memcmp(d->w, fresh.w, sizeof d->w) == 0 && memcmp(d->b, fresh.b, sizeof d->b) == 0 &&
         memcmp(d->n, fresh.n, sizeof d->n) == 0;
}

TEST(a_key_lands_in_the_readers_memory_by_name) {
  CHECK(publish_in_child("m/a", 2));
  dests_t d;
  dests_init(&d);
  uint64_t got = 0;
  CHECK_RC(st_get_into(cli, "m/a", 0, NULL, d.t, 3, NULL, &got), ST_OK, cli);
  CHECK_EQ_INT(got, 2);
  CHECK(holds(&d, 2));
  CHECK_RC(st_get_into(cli, "m/a", 1, NULL, d.t, 3, NULL, &got), ST_OK, cli);
  CHECK_EQ_INT(got, 1);
  CHECK(holds(&d, 1));
  /* explicit contiguous strides are fine too */
  static const int64_t w_strides[2] = {8, 1};
  dests_init(&d);
  d.t[1].strides = w_strides;
  CHECK_RC(st_get_into(cli, "m/a", 0, NULL, d.t, 3, NULL, &got), ST_OK, cli);
  CHECK(holds(&d, 2));
  CHECK_RC(st_client_delete(cli, "m/a"), ST_OK, cli);
}

TEST(a_view_loads_one_rank_s_shard) {
  CHECK(publish_in_child("m/tp", 1));
  float w[16], b[4];
  int32_t n[3];
  for (int i = 0; i < 16; i++) w[i] = -1.0f;
  for (int i = 0; i < 4; i++) b[i] = -1.0f;
  static const int64_t wshape[2] = {2, 8}, bshape[1] = {4};
  st_tensor_t t[3] = {
      {.name = "w", .data = w, .dtype = ST_DTYPE_FLOAT32, .ndim = 2, .shape = wshape,
       .device = ST_DEVICE_CPU, .device_index = -1},
      {.name = "b", .data = b, .dtype = ST_DTYPE_FLOAT32, .ndim = 1, .shape = bshape,
       .device = ST_DEVICE_CPU, .device_index = -1},
      {.name = "n", .data = n, .dtype = ST_DTYPE_INT32, .ndim = 1, .shape = N_SHAPE,
       .device = ST_DEVICE_CPU, .device_index = -1}};
  CHECK_RC(st_get_into(cli, "m/tp", 0, "w:shard(0,1,2);b:shard(0,1,2)", t, 3, NULL, NULL),
           ST_OK, cli);
  for (int i = 0; i < 16; i++) CHECK(w[i] == (float)(16 + i));   /* rows 2 and 3 of step 1 */
  for (int i = 0; i < 4; i++) CHECK(b[i] == 1.0f);
  CHECK_RC(st_get_into(cli, "m/tp", 0, "w:shard(0,5,2)", t, 1, NULL, NULL),
           ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "rank 5 is not below world 2");
  CHECK_RC(st_client_delete(cli, "m/tp"), ST_OK, cli);
}

TEST(a_second_get_into_maps_nothing_new) {
  CHECK(publish_in_child("m/b", 1));
  st_client_t *c = stt_client_open(srv.socket);
  CHECK(c != NULL);
  size_t mapped0, mapped1, mapped2;
  uint64_t reused0, reused1, reused2;
  st_open_cache_stats(&mapped0, &reused0);
  dests_t d;
  dests_init(&d);
  CHECK_RC(st_get_into(c, "m/b", 0, NULL, d.t, 3, NULL, NULL), ST_OK, c);
  st_open_cache_stats(&mapped1, &reused1);
  CHECK_EQ_INT(mapped1, mapped0 + 3);   /* three arenas, kept mapped */
  dests_init(&d);
  for (int i = 0; i < 5; i++)
    CHECK_RC(st_get_into(c, "m/b", 0, NULL, d.t, 3, NULL, NULL), ST_OK, c);
  st_open_cache_stats(&mapped2, &reused2);
  CHECK(holds(&d, 1));
  CHECK_EQ_INT(mapped2, mapped1);
  /* Each of the 5 was a `same` reply: no descriptor came to be looked up. */
  CHECK_EQ_INT(reused2, reused1);
  /* A new version is sent in full, mapped and copied. */
  CHECK_EQ_INT(publish(cli, "m/b", 2), 0);
  uint64_t got = 0;
  CHECK_RC(st_get_into(c, "m/b", 0, NULL, d.t, 3, NULL, &got), ST_OK, c);
  CHECK_EQ_INT(got, 2);
  CHECK(holds(&d, 2));
  /* The kept version asked by number is `same` too, and still copied. */
  st_open_cache_stats(NULL, &reused1);
  dests_init(&d);
  CHECK_RC(st_get_into(c, "m/b", 2, NULL, d.t, 3, NULL, &got), ST_OK, c);
  st_open_cache_stats(NULL, &reused2);
  CHECK(got == 2 && holds(&d, 2) && reused2 == reused1);
  /* Version 1 by number comes in full (one source is kept per key). */
  CHECK_RC(st_get_into(c, "m/b", 1, NULL, d.t, 3, NULL, &got), ST_OK, c);
  CHECK(got == 1 && holds(&d, 1));
  st_client_close(c);
  st_open_cache_stats(&mapped2, NULL);
  CHECK_EQ_INT(mapped2, mapped0);       /* the close let go of the source */
  CHECK_RC(st_client_delete(cli, "m/b"), ST_OK, cli);
}

TEST(every_difference_is_listed_and_nothing_is_copied) {
  CHECK(publish_in_child("m/c", 1));
  dests_t d;
  dests_init(&d);
  /* missing and extra: "v" instead of "b" */
  d.t[2].name = "v";
  CHECK_RC(st_get_into(cli, "m/c", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS_ALL(st_client_error(cli), "2 differences, nothing copied",
                     "missing 'v' (the source has no such tensor)",
                     "extra 'b' (no destination of that name)");
  CHECK(untouched(&d));
  /* a shape and a dtype, together with a name given twice */
  static const int64_t wrong[2] = {8, 4};
  dests_init(&d);
  d.t[1].shape = wrong;
  d.t[0].dtype = ST_DTYPE_FLOAT32;
  st_tensor_t four[4] = {d.t[0], d.t[1], d.t[2], d.t[2]};
  CHECK_RC(st_get_into(cli, "m/c", 0, NULL, four, 4, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS_ALL(st_client_error(cli), "get_into 'm/c' version 1: 3 differences",
                     "'n': dtype float32 here, int32 in the source",
                     "'w': shape [8, 4] here, [4, 8] in the source", "'b' is given twice");
  CHECK(untouched(&d));
  /* fewer destinations than tensors: each left out is extra */
  dests_init(&d);
  CHECK_RC(st_get_into(cli, "m/c", 0, NULL, d.t, 1, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS_ALL(st_client_error(cli), "extra 'w'", "extra 'b'");
  CHECK(untouched(&d));
  /* a rank that differs */
  static const int64_t flat[1] = {32};
  dests_init(&d);
  d.t[1].ndim = 1;
  d.t[1].shape = flat;
  CHECK_RC(st_get_into(cli, "m/c", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "'w': shape [32] here, [4, 8] in the source");
  CHECK(untouched(&d));
  /* many differences: the first 8 are named, all counted */
  st_tensor_t many[12];
  char names[12][8];
  for (int i = 0; i < 12; i++) {
    snprintf(names[i], sizeof names[i], "x%d", i);
    many[i] = d.t[2];
    many[i].name = names[i];
  }
  CHECK_RC(st_get_into(cli, "m/c", 0, NULL, many, 12, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS_ALL(st_client_error(cli), "15 differences", "missing 'x7'", "; ...");
  CHECK(strstr(st_client_error(cli), "x8") == NULL);
  CHECK(untouched(&d));
  /* a key or version that is not there: the get's error */
  CHECK_RC(st_get_into(cli, "m/none", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_NOT_FOUND, cli);
  CHECK_RC(st_get_into(cli, "m/c", 7, NULL, d.t, 3, NULL, NULL), ST_ERR_NOT_FOUND, cli);
  CHECK(untouched(&d));
  CHECK_RC(st_client_delete(cli, "m/c"), ST_OK, cli);
}

TEST(destinations_that_cannot_be_copied_into_are_refused_first) {
  dests_t d;
  dests_init(&d);
  /* checked before the get: the key need not exist */
  static const int64_t transposed[2] = {1, 4};
  d.t[1].strides = transposed;
  CHECK_RC(st_get_into(cli, "m/none", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "destination 'w' is not contiguous");
  dests_init(&d);
  d.t[0].name = "";
  CHECK_RC(st_get_into(cli, "m/none", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "destination 0 has no name");
  dests_init(&d);
  d.t[2].data = NULL;
  CHECK_RC(st_get_into(cli, "m/none", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "destination 'b': NULL data");
  dests_init(&d);
  d.t[2].device = ST_DEVICE_CUDA;
  CHECK_RC(st_get_into(cli, "m/none", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "needs its device_index");
  dests_init(&d);
  CHECK_RC(st_get_into(cli, "", 0, NULL, d.t, 3, NULL, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK(untouched(&d));
}

/* One contiguity rule (st_tensor_is_contiguous, the geometry's): a
 * destination without elements is contiguous whatever its strides and is
 * copied into; the same strides over elements are refused. */
TEST(a_destination_without_elements_is_contiguous_whatever_its_strides) {
  static const int64_t empty[2] = {0, 8}, two_rows[2] = {2, 8}, odd[2] = {3, 1};
  st_result_t *e = alloc(ST_DTYPE_FLOAT32, 2, empty);
  CHECK(e != NULL);
  st_args_t *a = st_args_new();
  char err[256] = "";
  int rc = st_args_tensor(a, "e", st_result_tensor(e, 0), err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(cli, "m/empty", a, ST_KEY_PINNED, 0, NULL);
  st_args_free(a);
  st_result_free(e);
  CHECK_ERR_MSG(rc, ST_OK, err[0] ? err : st_client_error(cli));
  st_client_t *c = stt_client_open(srv.socket);
  CHECK(c != NULL);
  st_tensor_t t = {.name = "e", .dtype = ST_DTYPE_FLOAT32, .ndim = 2, .shape = empty,
                   .strides = odd, .device = ST_DEVICE_CPU, .device_index = -1};
  CHECK(st_tensor_is_contiguous(&t));
  CHECK_RC(st_get_into(c, "m/empty", 0, NULL, &t, 1, NULL, NULL), ST_OK, c);
  float w[16];
  t.shape = two_rows;
  t.data = w;
  CHECK(!st_tensor_is_contiguous(&t));
  CHECK_RC(st_get_into(c, "m/empty", 0, NULL, &t, 1, NULL, NULL), ST_ERR_INVALID_ARGUMENT, c);
  CHECK_CONTAINS(st_client_error(c), "destination 'e' is not contiguous");
  st_client_close(c);
  CHECK_RC(st_client_delete(cli, "m/empty"), ST_OK, cli);
}

/* st_copy_ranges on the host: the ranges land in order; an unknown flag,
 * and ST_COPY_DEVICE with no device, are refused with nothing copied. */
TEST(copy_ranges_copies_host_ranges_and_refuses_bad_flags) {
  char a[8] = "abcdefg", b[8] = "-------";
  uint64_t dst[2] = {(uint64_t)(uintptr_t)b, (uint64_t)(uintptr_t)(b + 4)};
  uint64_t src[2] = {(uint64_t)(uintptr_t)(a + 4), (uint64_t)(uintptr_t)a};
  uint64_t bytes[2] = {3, 2};
  char err[200] = "";
  CHECK_EQ_INT(st_copy_ranges(-1, dst, src, bytes, 2, NULL, 8, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "unknown flags 0x8");
  CHECK_EQ_INT(st_copy_ranges(-1, dst, src, bytes, 2, NULL, ST_COPY_DEVICE, err, sizeof err),
               ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "ordinal is -1");
  CHECK(strcmp(b, "-------") == 0);
  CHECK_ERR_MSG(st_copy_ranges(-1, dst, src, bytes, 2, NULL, ST_COPY_SYNC, err, sizeof err),
                ST_OK, err);
  CHECK(strcmp(b, "efg-ab-") == 0);
}

TEST(a_cached_objects_result_is_copied_into) {
  st_result_t *r = NULL;
  CHECK_RC(st_client_call_flags(cli, "weights", NULL, ST_CALL_READONLY, &r), ST_OK, cli);
  st_object_info_t info;
  CHECK_EQ_INT(st_result_object(r, &info), ST_OK);
  CHECK(info.cached);
  float w[6] = {0};
  static const int64_t shape[2] = {2, 3};
  st_tensor_t t = {.name = "w", .data = w, .dtype = ST_DTYPE_FLOAT32, .ndim = 2, .shape = shape,
                   .device = ST_DEVICE_CPU, .device_index = -1};
  char err[512] = "";
  CHECK_ERR_MSG(st_result_copy_into(r, &t, 1, NULL, err, sizeof err), ST_OK, err);
  for (int i = 0; i < 6; i++) CHECK(w[i] == (float)i);
  t.dtype = ST_DTYPE_FLOAT64;
  CHECK_ERR_MSG(st_result_copy_into(r, &t, 1, NULL, err, sizeof err), ST_ERR_INVALID_ARGUMENT,
                err);
  CHECK_CONTAINS(err, "copy_into: 1 difference, nothing copied: 'w': dtype float64 here");
  st_result_free(r);
  CHECK_RC(st_client_release(cli, info.id, NULL, NULL, NULL), ST_OK, cli);
  CHECK_RC(st_client_invalidate_endpoint(cli, "weights", NULL), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

static const stt_endpoint_t endpoints[] = {
    {"weights.lua",
     "return st.endpoint{ name = \"weights\", cache = true,\n"
     "  build = function() return { w = st.arange { 6 }:to(\"float32\"):reshape { 2, 3 } } end }\n"},
    {NULL, NULL}};

int main(void) {
  cli = hk_start(&srv, "memory_budget = { cpu = 16 * 1024 * 1024 }, keys = { max_keys = 8 },",
                 endpoints, &baseline);
  RUN(a_key_lands_in_the_readers_memory_by_name);
  RUN(a_view_loads_one_rank_s_shard);
  RUN(a_second_get_into_maps_nothing_new);
  RUN(every_difference_is_listed_and_nothing_is_copied);
  RUN(destinations_that_cannot_be_copied_into_are_refused_first);
  RUN(a_destination_without_elements_is_contiguous_whatever_its_strides);
  RUN(copy_ranges_copies_host_ranges_and_refuses_bad_flags);
  RUN(a_cached_objects_result_is_copied_into);
  return stt_client_finish(cli, &srv);
}

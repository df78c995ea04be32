/* CUDA tensors served over the real socket (docs/cuda.md, "Serving CUDA
 * tensors"). A raw client receives each arena's descriptor, imports it in
 * this process with st__cuda_import, copies the bytes back and compares
 * them with what the same endpoint built with device = "cpu":
 * constructors, views, casts, copies (also between devices), modules in
 * one arena, readiness at reply time, cached and managed objects counted
 * against memory.cuda:0, out of device memory, and device memory back at
 * its baseline once everything was released. Skipped (77) without a CUDA
 * device or a CUDA build. */
#include <math.h>
#include <signal.h>
#include <sys/mman.h>

#include "check.h"
#include "common/philox.h"
#include "mem/cuda.h"
#include "wire.h"
#include "st/dtype.h"
#include "st/wire.h"

#define MiB (1024ll * 1024ll)


#ifdef ST_HAVE_CUDA
#include "gpu_kit.h"

static stt_server_t S;

/* ------------------------------------------------------------- client side */

/* The arenas of one reply, mapped in this process. */
typedef struct reply_maps {
  int n;
  st__arena_desc_t d[ST_MAX_FDS_PER_MESSAGE];
  st__cuda_mapping_t cuda[ST_MAX_FDS_PER_MESSAGE];
  void *cpu[ST_MAX_FDS_PER_MESSAGE];
} reply_maps_t;

static void close_maps(rc_t *c, reply_maps_t *r) {
  for (int i = 0; i < r->n; i++) {
    if (r->d[i].cuda) st__cuda_unmap(&r->cuda[i]);
    else if (r->cpu[i]) munmap(r->cpu[i], r->d[i].bytes);
  }
  r->n = 0;
  rc_drop_fds(c);
}

/* Imports every arena of a call reply (CUDA: st__cuda_import, CPU: mmap). */
static int open_maps(rc_t *c, const msg_t *m, reply_maps_t *r) {
  memset(r, 0, sizeof *r);
  const msgpack_object *a = obj_get(m->result, "arenas");
  if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size > ST_MAX_FDS_PER_MESSAGE) {
    fprintf(stderr, "   reply: no arenas or too many\n");
    return -1;
  }
  for (uint32_t i = 0; i < a->via.array.size; i++) {
    char err[512];
    st__arena_desc_t *d = &r->d[r->n];
    if (st__parse_arena(&a->via.array.ptr[i], d, err, sizeof err) != ST_OK ||
        (int)d->fd >= c->nfds) {
      fprintf(stderr, "   arena %u: bad descriptor (%d fds received)\n", i, c->nfds);
      return -1;
    }
    int fd = c->fds[d->fd];
    r->n++;
    if (d->cuda) {
      if (strcmp(d->backend, "vmm") != 0 || strncmp(d->uuid, "GPU-", 4) != 0) {
        fprintf(stderr, "   arena %u: backend %s uuid %s\n", i, d->backend, d->uuid);
        return -1;
      }
      if (st__cuda_import(fd, d->bytes, d->uuid, &r->cuda[i], err, sizeof err) != ST_OK) {
        fprintf(stderr, "   import: %s\n", err);
        return -1;
      }
    } else {
      r->cpu[i] = mmap(NULL, d->bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (r->cpu[i] == MAP_FAILED) {
        r->cpu[i] = NULL;
        return -1;
      }
    }
  }
  return 0;
}

/* A tensor of a reply brought to the host, contiguous. */
typedef struct host {
  st__tensor_desc_t d;
  int cuda;
  uint64_t arena_id;
  unsigned char *data;         /* numel * element size bytes (malloc) */
  size_t bytes;
} host_t;

static int fetch(const reply_maps_t *r, const msgpack_object *ext, host_t *h) {
  memset(h, 0, sizeof *h);
  char err[256];
  if (!ext || ext->type != MSGPACK_OBJECT_EXT ||
      st__parse_tensor(ext, &h->d, err, sizeof err) != ST_OK || (int)h->d.arena >= r->n)
    return -1;
  const st__arena_desc_t *a = &r->d[h->d.arena];
  h->cuda = a->cuda;
  h->arena_id = a->id;
  uint64_t lo, hi;
  if (st__tensor_extent(&h->d, &lo, &hi) != ST_OK || hi > a->bytes) return -1;
  unsigned char *raw = malloc(hi - lo + 1);
  size_t es = st_dtype_size(h->d.dtype);
  int64_t n = st__tensor_numel(&h->d);
  h->bytes = (size_t)n * es;
  h->data = malloc(h->bytes + 1);
  if (!raw || !h->data) return -1;
  if (a->cuda) {
    const st__cuda_mapping_t *m = &r->cuda[h->d.arena];
    if (hi > lo &&
        st__cuda_copy_to_host(raw, m->dptr + lo, hi - lo, m->ordinal, err, sizeof err) != ST_OK) {
      fprintf(stderr, "   copy: %s\n", err);
      free(raw);
      return -1;
    }
  } else if (hi > lo) {
    memcpy(raw, (const char *)r->cpu[h->d.arena] + lo, hi - lo);
  }
  int64_t idx[ST_MAX_NDIM] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int j = 0; j < h->d.ndim; j++) off += idx[j] * h->d.strides[j];
    memcpy(h->data + (size_t)k * es, raw + (h->d.offset - lo) + (uint64_t)off * es, es);
    for (int j = h->d.ndim - 1; j >= 0; j--) {
      if (++idx[j] < h->d.shape[j]) break;
      idx[j] = 0;
    }
  }
  free(raw);
  return 0;
}

static void host_free(host_t *h) {
  free(h->data);
  h->data = NULL;
}

/* Distance in units of the last place between two floats of dtype `dt`
 * (0 for equal bytes; huge for a sign or NaN mismatch). */
static int64_t ulps(st_dtype_t dt, const unsigned char *a, const unsigned char *b) {
  size_t es = st_dtype_size(dt);
  if (memcmp(a, b, es) == 0) return 0;
  if (dt == ST_DTYPE_FLOAT64) {
    int64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return (x ^ y) < 0 ? INT64_MAX : llabs(x - y);
  }
  if (dt == ST_DTYPE_FLOAT32) {
    int32_t x, y;
    memcpy(&x, a, 4);
    memcpy(&y, b, 4);
    return (x ^ y) < 0 ? INT64_MAX : llabs((int64_t)x - y);
  }
  if (st_dtype_is_float(dt) && es <= 2) {   /* sign-magnitude codes */
    int64_t x = es == 2 ? (a[0] | a[1] << 8) : a[0], y = es == 2 ? (b[0] | b[1] << 8) : b[0];
    int64_t sign = es == 2 ? 0x8000 : 0x80;
    return (x ^ y) & sign ? INT64_MAX : llabs(x - y);
  }
  return INT64_MAX;   /* integers and bool: the bytes must match */
}

/* The randn tolerance of docs/cuda.md (device log/cos vs libm). */
static int64_t allowed_ulps(st_dtype_t dt) {
  return dt == ST_DTYPE_FLOAT64 ? 8 : dt == ST_DTYPE_FLOAT32 ? 2 : st_dtype_is_float(dt) ? 1 : 0;
}

static int same_values(const char *what, const host_t *g, const host_t *c) {
  if (g->d.dtype != c->d.dtype || g->d.ndim != c->d.ndim) {
    fprintf(stderr, "   %s: dtype/ndim differ\n", what);
    return 0;
  }
  for (int i = 0; i < g->d.ndim; i++)
    if (g->d.shape[i] != c->d.shape[i]) {
      fprintf(stderr, "   %s: shapes differ\n", what);
      return 0;
    }
  size_t es = st_dtype_size(g->d.dtype);
  int64_t n = st__tensor_numel(&g->d), worst = 0;
  for (int64_t k = 0; k < n; k++) {
    int64_t u = ulps(g->d.dtype, g->data + k * (int64_t)es, c->data + k * (int64_t)es);
    if (u > worst) worst = u;
  }
  if (worst > allowed_ulps(g->d.dtype)) {
    fprintf(stderr, "   %s: values differ (worst %lld ulp)\n", what, (long long)worst);
    return 0;
  }
  return 1;
}

/* value.<key> of a map-valued reply. */
static const msgpack_object *field(const msg_t *m, const char *key) {
  return obj_get(obj_get(m->result, "value"), key);
}

/* ------------------------------------------------------------- tests */

/* Every tensor of gen_gpu equals gen_cpu's (same seed, same numbers), lives
 * in a CUDA arena, and the plain values agree. */
TEST(constructors_and_methods_match_cpu) {
  OPEN_RC(c, S.socket);
  msg_t mg, mc;
  CHECK(rc_call(&c, "gen_gpu", NULL, 0, &mg) == 1 && !mg.error);
  reply_maps_t rg;
  CHECK(open_maps(&c, &mg, &rg) == 0);
  OPEN_RC(c2, S.socket);
  CHECK(rc_call(&c2, "gen_cpu", NULL, 0, &mc) == 1 && !mc.error);
  reply_maps_t rcpu;
  CHECK(open_maps(&c2, &mc, &rcpu) == 0);
  const msgpack_object *vg = obj_get(mg.result, "value");
  int tensors = 0;
  for (uint32_t i = 0; vg && vg->type == MSGPACK_OBJECT_MAP && i < vg->via.map.size; i++) {
    const msgpack_object *k = &vg->via.map.ptr[i].key, *v = &vg->via.map.ptr[i].val;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)k->via.str.size, k->via.str.ptr);
    if (v->type != MSGPACK_OBJECT_EXT) continue;
    host_t g, h;
    CHECK(fetch(&rg, v, &g) == 0);
    CHECK(fetch(&rcpu, field(&mc, name), &h) == 0);
    CHECK(g.cuda == 1);
    CHECK(h.cuda == 0);
    if (!same_values(name, &g, &h)) CHECK(!"values differ");
    host_free(&g);
    host_free(&h);
    tensors++;
  }
  CHECK(tensors >= 20);
  /* Element reads and tolist on the device give the CPU's numbers. */
  const msgpack_object *pg = field(&mg, "values"), *pc = field(&mc, "values");
  CHECK(pg && pc);
  const char *keys[] = {"get", "item", "list", "set_get", "n"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    const msgpack_object *a = obj_get(pg, keys[i]), *b = obj_get(pc, keys[i]);
    CHECK(a && b && msgpack_object_equal(*a, *b));
  }
  CHECK_STR_EQ(obj_str(obj_get(pg, "device")), "cuda:0");
  CHECK_STR_EQ(obj_str(obj_get(pc, "device")), "cpu");
  CHECK_STR_EQ(obj_str(obj_get(pg, "str")), "tensor(float32, {4,6}, cuda:0)");
  close_maps(&c, &rg);
  close_maps(&c2, &rcpu);
  msg_free(&mg);
  msg_free(&mc);
  rc_close(&c);
  rc_close(&c2);
}

/* Expected float value of element k of tensor h (any dtype). */
static double at(const host_t *h, int64_t k) {
  return st_dtype_load(h->d.dtype, h->data, (size_t)k);
}

TEST(copies_between_devices) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_call(&c, "xfer", NULL, 0, &m) == 1 && !m.error);
  reply_maps_t r;
  CHECK(open_maps(&c, &m, &r) == 0);
  host_t h;
  CHECK(fetch(&r, field(&m, "to_cpu"), &h) == 0);
  CHECK(h.cuda == 0 && h.d.dtype == ST_DTYPE_INT64 && st__tensor_numel(&h.d) == 24);
  for (int k = 0; k < 24; k++) CHECK(at(&h, k) == k);
  host_free(&h);
  CHECK(fetch(&r, field(&m, "to_cpu_strided"), &h) == 0);
  CHECK(h.cuda == 0 && h.d.dtype == ST_DTYPE_FLOAT32 && st__tensor_numel(&h.d) == 12);
  for (int k = 0; k < 12; k++) CHECK(at(&h, k) == (k / 3) * 6 + (k % 3) * 2);
  host_free(&h);
  CHECK(fetch(&r, field(&m, "to_gpu"), &h) == 0);
  CHECK(h.cuda == 1 && h.d.dtype == ST_DTYPE_FLOAT16 && st__tensor_numel(&h.d) == 100);
  for (int k = 0; k < 100; k++) CHECK(at(&h, k) == k);
  host_free(&h);
  CHECK(fetch(&r, field(&m, "to_gpu_strided"), &h) == 0);
  CHECK(h.cuda == 1 && st__tensor_numel(&h.d) == 12);
  for (int k = 0; k < 12; k++) CHECK(at(&h, k) == (k / 3) * 6 + 1 + k % 3);
  host_free(&h);
  CHECK(fetch(&r, field(&m, "into_strided"), &h) == 0);
  for (int k = 0; k < 24; k++) CHECK(at(&h, k) == ((k % 6 == 1 || k % 6 == 2) ? 1.0 : 0.0));
  host_free(&h);
  host_t a, b;
  CHECK(fetch(&r, field(&m, "roundtrip"), &a) == 0);
  CHECK(fetch(&r, field(&m, "round_ref"), &b) == 0);
  CHECK(a.cuda && b.cuda && a.bytes == b.bytes && memcmp(a.data, b.data, a.bytes) == 0);
  host_free(&a);
  host_free(&b);
  CHECK(fetch(&r, field(&m, "overlap"), &h) == 0);
  static const double want[] = {0, 1, 0, 1, 2, 3, 4, 5, 8, 9};
  for (int k = 0; k < 10; k++) CHECK(at(&h, k) == want[k]);
  host_free(&h);
  close_maps(&c, &r);
  msg_free(&m);
  rc_close(&c);
}

/* A module of CUDA tensors is one CUDA arena at 256-byte offsets with the
 * CPU module's values; mixing devices in one module is an error. */
TEST(modules_are_one_cuda_arena) {
  OPEN_RC(c, S.socket);
  msg_t mg, mc;
  CHECK(rc_call(&c, "mod_gpu", NULL, 0, &mg) == 1 && !mg.error);
  const msgpack_object *arenas = obj_get(mg.result, "arenas");
  CHECK(arenas && arenas->via.array.size == 1);
  CHECK_EQ_INT(c.nfds, 1);
  reply_maps_t rg;
  CHECK(open_maps(&c, &mg, &rg) == 0);
  CHECK(rg.d[0].cuda == 1);
  OPEN_RC(c2, S.socket);
  CHECK(rc_call(&c2, "mod_cpu", NULL, 0, &mc) == 1 && !mc.error);
  reply_maps_t rcpu;
  CHECK(open_maps(&c2, &mc, &rcpu) == 0);
  msgpack_unpacked pg, pc;
  const msgpack_object *tg, *tc, *meta;
  char err[256];
  CHECK(st__parse_module(obj_get(mg.result, "value"), &pg, &tg, &meta, err, sizeof err) == ST_OK);
  CHECK(st__parse_module(obj_get(mc.result, "value"), &pc, &tc, &meta, err, sizeof err) == ST_OK);
  CHECK(tg->via.array.size == 4 && tc->via.array.size == 4);
  for (uint32_t i = 0; i < tg->via.array.size && i < tc->via.array.size; i++) {
    const msgpack_object *eg = &tg->via.array.ptr[i].via.array.ptr[1];
    const msgpack_object *ec = &tc->via.array.ptr[i].via.array.ptr[1];
    host_t g, h;
    CHECK(fetch(&rg, eg, &g) == 0);
    CHECK(fetch(&rcpu, ec, &h) == 0);
    CHECK(g.cuda == 1 && g.d.arena == 0);
    CHECK_EQ_INT(g.d.offset % 256, 0);
    CHECK_EQ_INT(g.d.offset, h.d.offset);
    if (!same_values("module tensor", &g, &h)) CHECK(!"module values differ");
    host_free(&g);
    host_free(&h);
  }
  msgpack_unpacked_destroy(&pg);
  msgpack_unpacked_destroy(&pc);
  close_maps(&c, &rg);
  close_maps(&c2, &rcpu);
  msg_free(&mg);
  msg_free(&mc);
  msg_t m;
  CHECK(rc_call(&c, "mod_mixed", NULL, 0, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_ENDPOINT, "module: tensors on different devices");
  msg_free(&m);
  rc_close(&c);
  rc_close(&c2);
}

/* The reply comes after the stream was synchronized: the last elements of
 * a 256 MiB randn are final the moment the descriptor arrives. */
TEST(ready_when_replied) {
  OPEN_RC(c, S.socket);
  const int64_t n = 1 << 26;
  msg_t m;
  CHECK(rc_call(&c, "big", "n", n, &m) == 1 && !m.error);
  reply_maps_t r;
  CHECK(open_maps(&c, &m, &r) == 0);
  st__tensor_desc_t d;
  char err[256];
  CHECK(st__parse_tensor(obj_get(m.result, "value"), &d, err, sizeof err) == ST_OK);
  float tail[64];
  CHECK(st__cuda_copy_to_host(tail, r.cuda[0].dptr + d.offset + (uint64_t)(n - 64) * 4,
                              sizeof tail, r.cuda[0].ordinal, err, sizeof err) == ST_OK);
  for (int k = 0; k < 64; k++) {
    float want;
    st_dtype_store(ST_DTYPE_FLOAT32, &want, 0, st__rng_normal(9, (uint64_t)(n - 64 + k)));
    CHECK(ulps(ST_DTYPE_FLOAT32, (unsigned char *)&tail[k], (unsigned char *)&want) <= 2);
  }
  close_maps(&c, &r);
  msg_free(&m);
  rc_close(&c);
}

static uint64_t baseline_free;

/* Cached and managed CUDA objects count against memory.cuda:0 (their
 * allocated size), whose budget defaults to 90% of the device. */
TEST(cached_and_managed_objects) {
  rc_t a, b;
  CHECK(rc_open(&a, S.socket) == 0);
  CHECK(rc_open(&b, S.socket) == 0);
  msg_t h;
  CHECK(rc_rpcf(&a, &h, "[0, 2, 'hello', []]") == 1);
  int64_t mem = INT64_MIN;
  const msgpack_object *devs = obj_get(h.result, "devices");
  for (uint32_t i = 0; devs && i < devs->via.array.size; i++)
    if (obj_int(obj_get(&devs->via.array.ptr[i], "index")) == 0)
      mem = obj_int(obj_get(&devs->via.array.ptr[i], "memory_bytes"));
  msg_free(&h);
  CHECK_EQ_INT(rc_info_int(&a, "memory.cuda:0.budget"), mem / 10 * 9);
  CHECK(rc_info_int(&a, "memory.cuda:0.total_bytes") > 0);
  CHECK(rc_info_int(&a, "memory.cuda:0.free_bytes") > 0);
  msg_t m1, m2;
  CHECK(rc_call(&a, "cached_gpu", "n", 4, &m1) == 1 && !m1.error);
  CHECK(rc_call(&b, "cached_gpu", "n", 4, &m2) == 1 && !m2.error);
  CHECK_EQ_INT(obj_field(&m1, "id"), obj_field(&m2, "id"));
  CHECK_EQ_INT(arena_id(&m1, 0), arena_id(&m2, 0));
  CHECK_STR_EQ(obj_str(obj_get(obj_get(m1.result, "object"), "device")), "cuda:0");
  reply_maps_t r;
  CHECK(open_maps(&b, &m2, &r) == 0);
  host_t t;
  CHECK(fetch(&r, obj_get(m2.result, "value"), &t) == 0);
  CHECK(t.cuda && at(&t, 0) == 4.0 && at(&t, st__tensor_numel(&t.d) - 1) == 4.0);
  host_free(&t);
  close_maps(&b, &r);
  rc_drop_fds(&a);
  msg_free(&m1);
  msg_free(&m2);
  CHECK_EQ_INT(rc_info_int(&a, "memory.cuda:0.objects"), 1);
  CHECK_EQ_INT(rc_info_int(&a, "memory.cuda:0.cached_bytes"), 4 * MiB);
  CHECK_EQ_INT(rc_info_int(&a, "memory.cuda:0.leased_bytes"), 0);
  /* A managed object: leased until released. */
  msg_t mm;
  CHECK(rc_call(&a, "managed_gpu", "n", 2, &mm) == 1 && !mm.error);
  rc_drop_fds(&a);
  int64_t oid = obj_field(&mm, "id");
  msg_free(&mm);
  CHECK_EQ_INT(rc_info_int(&a, "memory.cuda:0.leased_bytes"), 2 * MiB);
  CHECK(rk_id(&a, "release", "object_id", (uint64_t)oid, &mm) == 1 && !mm.error);
  CHECK_EQ_INT(obj_int(obj_get(mm.result, "destroyed")), 1);
  msg_free(&mm);
  CHECK_EQ_INT(rc_info_int(&a, "memory.cuda:0.leased_bytes"), 0);
  /* Invalidation drops the cached one. */
  CHECK(rc_rpcf(&a, &mm,
                "[0, 8, 'invalidate_endpoint', [{endpoint: 'cached_gpu'}]]") == 1 && !mm.error);
  msg_free(&mm);
  CHECK_EQ_INT(rc_info_int(&a, "memory.cuda:0.objects"), 0);
  CHECK_EQ_INT(rc_info_int(&a, "objects.count"), 0);
  rc_close(&a);
  rc_close(&b);
}

/* info samples the driver's free_bytes at most every 100 ms, but at once
 * when the server's own charge on the device moved: an object made right
 * after one info shows in the next. */
TEST(info_free_bytes_follows_the_servers_allocations) {
  OPEN_RC(c, S.socket);
  int64_t before = rc_info_int(&c, "memory.cuda:0.free_bytes");
  CHECK(before > 0);
  msg_t m;
  CHECK(rc_call(&c, "managed_gpu", "n", 32, &m) == 1 && !m.error);
  rc_drop_fds(&c);
  int64_t oid = obj_field(&m, "id");
  msg_free(&m);
  int64_t during = rc_info_int(&c, "memory.cuda:0.free_bytes");
  CHECK(during > 0 && during <= before - 32 * MiB);
  CHECK(rk_id(&c, "release", "object_id", (uint64_t)oid, &m) == 1 && !m.error);
  msg_free(&m);
  rc_close(&c);
}

/* More than the device has: OUT_OF_MEMORY with the requested and free
 * bytes, and the server keeps building on the device. */
TEST(out_of_device_memory) {
  OPEN_RC(c, S.socket);
  int64_t total = rc_info_int(&c, "memory.cuda:0.total_bytes");
  CHECK(total > 0);
  msg_t m;
  /* The device's budget (90% of it) refuses it before cuMemCreate. */
  CHECK(rc_call(&c, "huge", "n", total * 2, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_OUT_OF_MEMORY, "on cuda:0 is larger than its memory budget");
  CHECK_CONTAINS(msg_errmsg(&m), "memory_budget[\"cuda:0\"]");
  msg_free(&m);
  CHECK(stt_ping(c.fd, 3) == 0);
  for (int i = 0; i < 4; i++) {
    CHECK(rc_call(&c, "huge", "n", 1000, &m) == 1 && !m.error);
    rc_drop_fds(&c);
    msg_free(&m);
  }
  rc_close(&c);
}

/* Everything released, clients gone, caches invalidated: the device's free
 * memory (seen from this process) is back where it was before the
 * object tests, within one allocation granule. */
TEST(device_memory_back_to_baseline) {
  OPEN_RC(c, S.socket);
  CHECK(rc_wait_info(&c, "arenas.count", 0, 10000) == 0);
  CHECK(rc_wait_info(&c, "objects.count", 0, 10000) == 0);
  CHECK(gk_wait_back_to(baseline_free, 10000) == 0);
  rc_close(&c);
}


static const char GEN[] =
    "local function gen(a)\n"
    "  local t = {}\n"
    "  t.empty = st.empty{3, 4}\n"
    "  t.zeros = st.zeros{5, dtype = 'int32'}\n"
    "  t.ones = st.ones{7, dtype = 'bfloat16'}\n"
    "  t.full = st.full{2, 3, value = 2.5, dtype = 'float16'}\n"
    "  t.full_bool = st.full{4, value = true, dtype = 'bool'}\n"
    "  t.full_i64 = st.full{3, value = -123456789012, dtype = 'int64'}\n"
    "  t.arange_i = st.arange{10}\n"
    "  t.arange_f = st.arange{1, 2, 0.125}\n"
    "  t.arange_f8 = st.arange{-3, 3, 0.5, dtype = 'float8_e4m3fn'}\n"
    "  t.rand32 = st.rand{1000, seed = 7}\n"
    "  t.rand64 = st.rand{1000, seed = 7, dtype = 'float64'}\n"
    "  t.rand_bf = st.rand{33, 5, seed = 3, dtype = 'bfloat16'}\n"
    "  t.randn32 = st.randn{4097, seed = 11}\n"
    "  t.randn64 = st.randn{513, seed = 11, dtype = 'float64'}\n"
    "  t.randn16 = st.randn{100, seed = 11, dtype = 'float16'}\n"
    "  local base = st.arange{24, dtype = 'float32'}:view{4, 6}\n"
    "  t.view = base:view{6, 4}\n"
    "  t.narrow = base:narrow(1, 2, 3)\n"
    "  t.slice = base:slice(0, 0, 4, 2)\n"
    "  t.strided_contig = base:slice(1, 1, 6, 2):contiguous()\n"
    "  t.reshape_copy = base:slice(1, 0, 6, 2):reshape{12}\n"
    "  t.cast = st.randn{300, seed = 5}:to('float16')\n"
    "  t.cast_e5m2 = st.randn{300, seed = 5}:to('float8_e5m2')\n"
    "  t.cast_strided = base:slice(1, 0, 6, 2):to('int8')\n"
    "  t.clone = base:clone()\n"
    "  local f = st.zeros{4, 6, dtype = 'float64'}\n"
    "  f:narrow(1, 1, 2):fill(-7)\n"
    "  t.fill_strided = f\n"
    "  t.fill_contig = st.zeros{9, dtype = 'uint8'}:fill(200)\n"
    "  local c = st.zeros{4, 3, dtype = 'int16'}\n"
    "  c:copy_(base:slice(1, 0, 6, 2))\n"
    "  t.copy_strided = c\n"
    "  local s = st.zeros{3}\n"
    "  s:set(1, 42.5)\n"
    "  t.set = s\n"
    "  t.values = { get = base:get(2, 3), item = st.full{1, value = 9}:item(),\n"
    "               list = base:slice(1, 0, 6, 3):tolist(), set_get = s:get(1),\n"
    "               n = base:numel(), device = base:device(), str = tostring(base) }\n"
    "  return t\n"
    "end\n"
    "return { st.endpoint{ name = 'gen_cpu', device = 'cpu', build = gen },\n"
    "         st.endpoint{ name = 'gen_gpu', device = 'cuda', build = gen } }\n";

static const char XFER[] =
    "return st.endpoint{ name = 'xfer', device = 'cuda', build = function()\n"
    "  local base = st.arange{24}:view{4, 6}\n"
    "  local t = {}\n"
    "  t.to_cpu = base:to('cpu')\n"
    "  t.to_cpu_strided = base:slice(1, 0, 6, 2):to('cpu', 'float32')\n"
    "  t.to_gpu = st.arange{100, device = 'cpu'}:to('cuda:0', 'float16')\n"
    "  t.to_gpu_strided = st.arange{24, device = 'cpu'}:view{4, 6}:narrow(1, 1, 3):to('cuda')\n"
    "  local z = st.zeros{4, 6}\n"
    "  z:narrow(1, 1, 2):copy_(st.ones{4, 2, device = 'cpu'})\n"
    "  t.into_strided = z\n"
    "  t.roundtrip = st.randn{1000, seed = 2}:to('cpu'):to('cuda')\n"
    "  t.round_ref = st.randn{1000, seed = 2}\n"
    "  local o = st.arange{10, dtype = 'float32'}\n"
    "  o:narrow(0, 2, 6):copy_(o:narrow(0, 0, 6))\n"
    "  t.overlap = o\n"
    "  assert(t.to_cpu:device() == 'cpu' and t.to_gpu:device() == 'cuda:0')\n"
    "  return t\n"
    "end }\n";

static const char MOD[] =
    "local function mod()\n"
    "  return st.module({ { 'w', st.randn{64, 32, seed = 1} }, { 'b', st.zeros{64} },\n"
    "                     { 's', st.arange{24}:view{4, 6}:slice(1, 0, 6, 2) },\n"
    "                     { 'h', st.ones{5, dtype = 'float16'} } }, { arch = 'x' })\n"
    "end\n"
    "return { st.endpoint{ name = 'mod_cpu', device = 'cpu', build = mod },\n"
    "         st.endpoint{ name = 'mod_gpu', device = 'cuda', build = mod },\n"
    "         st.endpoint{ name = 'mod_mixed', device = 'cuda', build = function()\n"
    "           local m = st.module{ a = st.zeros{2}, b = st.zeros{2, device = 'cpu'} }\n"
    "           return m end } }\n";

static const char OBJECTS[] =
    "return {\n"
    "  st.endpoint{ name = 'big', device = 'cuda', params = { n = 1 },\n"
    "    build = function(a) return st.randn{a.n, seed = 9} end },\n"
    "  st.endpoint{ name = 'cached_gpu', device = 'cuda', cache_format_key = 'c:{n}',\n"
    "    params = { n = 1 }, build = function(a) return st.full{a.n * 262144, value = a.n} end },\n"
    "  st.endpoint{ name = 'managed_gpu', device = 'cuda', managed = true, params = { n = 1 },\n"
    "    build = function(a) return st.ones{a.n * 262144} end },\n"
    "  st.endpoint{ name = 'huge', device = 'cuda', params = { n = 1 },\n"
    "    build = function(a) local t = st.empty{a.n, dtype = 'uint8'} return t end },\n"
    "}\n";

static const stt_endpoint_t endpoints[] = {
    {"gen.lua", GEN},
    {"xfer.lua", XFER},
    {"mod.lua", MOD},
    {"objects.lua", OBJECTS},
    {NULL, NULL},
};

#endif /* ST_HAVE_CUDA */

int main(void) {
  char why[512];
  if (st__cuda_available(why, sizeof why) != ST_OK) stt_skip(why);
#ifdef ST_HAVE_CUDA
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "limits = { max_object_bytes = 0 },", endpoints);
  RUN(constructors_and_methods_match_cpu);
  RUN(copies_between_devices);
  RUN(modules_are_one_cuda_arena);
  RUN(ready_when_replied);
  baseline_free = gk_free();
  RUN(cached_and_managed_objects);
  RUN(info_free_bytes_follows_the_servers_allocations);
  RUN(out_of_device_memory);
  RUN(device_memory_back_to_baseline);
  return stt_server_finish(&S);
#endif
  return stt_summary();
}

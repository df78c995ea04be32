/* st_tensor_copy_to_host and st_tensor_get on CPU tensors of every layout a
 * reply can describe: contiguous, transposed, broadcast (stride 0), sliced
 * with a step, 0-d and empty, in dtypes of 1, 2, 4 and 8 bytes. The CUDA
 * side of the same functions is tests/client/test_gpu_map.c. */
#include <math.h>
#include <st/client.h>
#include <stdint.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"

static fake_server_t fs;

/* The arena: 64 bytes that read as 0..15 (float32), 0..31 (int16), or
 * 0..63 (uint8), by dtype. */
static unsigned char arena[256];

static void fill_arena(void) {
  for (int i = 0; i < 16; i++) {
    float f = (float)i;
    memcpy(arena + 4 * i, &f, 4);
  }
  for (int i = 0; i < 32; i++) {
    int16_t v = (int16_t)(i - 5);
    memcpy(arena + 64 + 2 * i, &v, 2);
  }
  for (int i = 0; i < 8; i++) {
    double d = i * 0.5;
    memcpy(arena + 128 + 8 * i, &d, 8);
  }
}

/* Each tensor of the reply: name, offset, dtype, ndim, shape, strides. */
typedef struct spec {
  const char *name;
  uint64_t offset;
  const char *dtype;
  int ndim;
  int64_t shape[2], strides[2];
} spec_t;

static const spec_t specs[] = {
    {"contiguous", 0, "float32", 2, {2, 3}, {3, 1}},
    {"transposed", 0, "float32", 2, {3, 2}, {1, 3}},
    {"broadcast", 4, "float32", 2, {3, 4}, {0, 1}},
    {"stepped", 64 + 4, "int16", 1, {5}, {3}},
    {"scalar", 128 + 24, "float64", 0, {0}, {0}},
    {"empty", 0, "float32", 1, {0}, {1}},
    {"column", 128, "float64", 2, {4, 1}, {2, 7}},
};
#define NSPECS (sizeof specs / sizeof specs[0])

/* "[a, b]" of the first n of v, appended at buf + *used. */
static void append_dims(char *buf, size_t len, size_t *used, int n, const int64_t *v) {
  *used += (size_t)snprintf(buf + *used, len - *used, "[");
  for (int i = 0; i < n; i++)
    *used += (size_t)snprintf(buf + *used, len - *used, "%s%lld", i ? ", " : "", (long long)v[i]);
  *used += (size_t)snprintf(buf + *used, len - *used, "]");
}

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  (void)params;
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  char value[2048];
  size_t used = 0;
  for (size_t i = 0; i < NSPECS; i++) {
    used += (size_t)snprintf(value + used, sizeof value - used, "%s%s: tensor(0, %llu, '%s', ",
                             i ? ", " : "", specs[i].name, (unsigned long long)specs[i].offset,
                             specs[i].dtype);
    append_dims(value, sizeof value, &used, specs[i].ndim, specs[i].shape);
    used += (size_t)snprintf(value + used, sizeof value - used, ", ");
    append_dims(value, sizeof value, &used, specs[i].ndim, specs[i].strides);
    used += (size_t)snprintf(value + used, sizeof value - used, ")");
  }
  int fd = fake_memfd(sizeof arena, arena, sizeof arena, 1);
  int rc = fake_replyf(conn, id, &fd, 1,
                       "{value: {%s}, arenas: [{fd: 0, bytes: %zu, device: 'cpu', "
                       "backend: 'memfd', id: 1}]}",
                       value, sizeof arena);
  close(fd);
  return rc;
}

static st_result_t *result;

/* Element k (row-major) of spec s, computed from the arena by hand. */
static double want(const spec_t *s, int64_t k) {
  int64_t off = 0;
  for (int i = s->ndim - 1; i >= 0; i--) {
    off += (k % s->shape[i]) * s->strides[i];
    k /= s->shape[i];
  }
  const unsigned char *p = arena + s->offset;
  if (strcmp(s->dtype, "float32") == 0) {
    float f;
    memcpy(&f, p + 4 * off, 4);
    return f;
  }
  if (strcmp(s->dtype, "int16") == 0) {
    int16_t v;
    memcpy(&v, p + 2 * off, 2);
    return v;
  }
  double d;
  memcpy(&d, p + 8 * off, 8);
  return d;
}

TEST(copies_every_layout_in_row_major_order) {
  for (size_t i = 0; i < NSPECS; i++) {
    const spec_t *s = &specs[i];
    const st_tensor_t *t = st_result_find(result, s->name);
    CHECK(t);
    CHECK(t->device == ST_DEVICE_CPU && t->device_index == -1);
    unsigned char out[128];
    memset(out, 0xee, sizeof out);
    CHECK(t->nbytes <= sizeof out);
    CHECK_ERR(st_tensor_copy_to_host(t, out, t->nbytes), ST_OK);
    CHECK_EQ_INT(out[t->nbytes], 0xee); /* nothing past nbytes is written */
    for (int64_t k = 0; k < t->numel; k++) {
      double w = want(s, k);
      CHECK(st_dtype_load(t->dtype, out, (size_t)k) == w);
      CHECK(st_tensor_get(t, k) == w);
    }
  }
}

TEST(shapes_checked) {
  const st_tensor_t *c = st_result_find(result, "contiguous");
  CHECK(c && c->nbytes == 24);
  const st_tensor_t *b = st_result_find(result, "broadcast");
  CHECK(b && b->numel == 12 && b->nbytes == 48);
  const st_tensor_t *sc = st_result_find(result, "scalar");
  CHECK(sc && sc->numel == 1 && st_tensor_get(sc, 0) == 1.5);
}

TEST(bad_arguments) {
  const st_tensor_t *t = st_result_find(result, "transposed");
  CHECK(t);
  unsigned char out[64];
  CHECK_ERR(st_tensor_copy_to_host(t, out, t->nbytes - 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_tensor_copy_to_host(t, NULL, t->nbytes), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_tensor_copy_to_host(NULL, out, sizeof out), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_tensor_copy_to_host(t, out, sizeof out), ST_OK); /* larger is fine */
  const st_tensor_t *e = st_result_find(result, "empty");
  CHECK(e && e->numel == 0);
  CHECK_ERR(st_tensor_copy_to_host(e, NULL, 0), ST_OK);
  CHECK(isnan(st_tensor_get(t, -1)));
  CHECK(isnan(st_tensor_get(t, t->numel)));
  CHECK(isnan(st_tensor_get(e, 0)));
  CHECK(isnan(st_tensor_get(NULL, 0)));
}

int main(void) {
  fill_arena();
  fs.on_request = on_request;
  fake_start(&fs);
  st_client_t *c = stt_client_open(fs.path);
  if (!c || stt_client_report(c, "call", st_client_call(c, "layouts", NULL, &result)) != ST_OK)
    return 1;
  st_client_close(c);
  RUN(copies_every_layout_in_row_major_order);
  RUN(shapes_checked);
  RUN(bad_arguments);
  st_result_free(result);
  fake_stop(&fs);
  return stt_summary();
}

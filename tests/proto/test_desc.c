/* Tensor, arena and module descriptors (src/proto/desc.c): round trips,
 * every rejection, and byte extents. */
#include "check.h"
#include "mpbuf.h"
#include "proto/proto.h"

static char why[256];

/* ------------------------------------------------------------- helpers */


static void key(msgpack_packer *pk, const char *k) { st__pack_cstr(pk, k); }

static void dims(msgpack_packer *pk, const int64_t *v, int n) {
  msgpack_pack_array(pk, (size_t)n);
  for (int i = 0; i < n; i++) msgpack_pack_int64(pk, v[i]);
}

/* Wraps the payload packed in `payload` as an ext of `type` into out. */
static void wrap_ext(mpbuf_t *out, int8_t type, const msgpack_sbuffer *payload) {
  st__pack_ext(&out->pk, type, payload);
}

/* Hand-made tensor payload: the keys in `skip` are left out, `dtype`,
 * shape and strides as given. */
static void tensor_payload(msgpack_sbuffer *sb, const char *skip, const char *dtype,
                           const int64_t *shape, int nshape, const int64_t *strides,
                           int nstrides) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  int n = 5 - (skip ? 1 : 0);
  msgpack_pack_map(&pk, (size_t)n);
  if (!skip || strcmp(skip, "arena")) { key(&pk, "arena"); msgpack_pack_uint32(&pk, 2); }
  if (!skip || strcmp(skip, "offset")) { key(&pk, "offset"); msgpack_pack_uint64(&pk, 128); }
  if (!skip || strcmp(skip, "dtype")) { key(&pk, "dtype"); st__pack_cstr(&pk, dtype); }
  if (!skip || strcmp(skip, "shape")) { key(&pk, "shape"); dims(&pk, shape, nshape); }
  if (!skip || strcmp(skip, "strides")) { key(&pk, "strides"); dims(&pk, strides, nstrides); }
}

/* Parses a hand-made tensor; returns the rc. */
static int parse_made(const char *skip, const char *dtype, const int64_t *shape, int nshape,
                      const int64_t *strides, int nstrides, st__tensor_desc_t *d) {
  msgpack_sbuffer payload;
  msgpack_sbuffer_init(&payload);
  tensor_payload(&payload, skip, dtype, shape, nshape, strides, nstrides);
  mpbuf_t b;
  mpbuf_init(&b);
  wrap_ext(&b, ST_EXT_TENSOR, &payload);
  why[0] = '\0';
  int rc = st__parse_tensor(mpbuf_obj(&b), d, why, sizeof why);
  if (rc != ST_OK) fprintf(stderr, "  refused: %s\n", why);
  mpbuf_free(&b);
  msgpack_sbuffer_destroy(&payload);
  return rc;
}

/* Parses raw payload bytes wrapped as an ext of `type`. */
static int parse_raw(int8_t type, const void *bytes, size_t n) {
  msgpack_sbuffer payload;
  msgpack_sbuffer_init(&payload);
  if (n) msgpack_sbuffer_write(&payload, bytes, n);
  mpbuf_t b;
  mpbuf_init(&b);
  wrap_ext(&b, type, &payload);
  st__tensor_desc_t d;
  int rc = st__parse_tensor(mpbuf_obj(&b), &d, why, sizeof why);
  if (rc != ST_OK) fprintf(stderr, "  refused: %s\n", why);
  mpbuf_free(&b);
  msgpack_sbuffer_destroy(&payload);
  return rc;
}

/* ------------------------------------------------------------- tensors */

static int same_tensor(const st__tensor_desc_t *a, const st__tensor_desc_t *b) {
  if (a->arena != b->arena || a->offset != b->offset || a->dtype != b->dtype ||
      a->ndim != b->ndim)
    return 0;
  for (int k = 0; k < a->ndim; k++)
    if (a->shape[k] != b->shape[k] || a->strides[k] != b->strides[k]) return 0;
  return 1;
}

TEST(tensor_round_trip) {
  st__tensor_desc_t cases[4];
  memset(cases, 0, sizeof cases);
  cases[0] = (st__tensor_desc_t){.arena = 0, .offset = 0, .dtype = ST_DTYPE_FLOAT32, .ndim = 2,
                                 .shape = {4, 16}, .strides = {16, 1}};
  cases[1] = (st__tensor_desc_t){.arena = 0xffffffffu, .offset = UINT64_C(1) << 40,
                                 .dtype = ST_DTYPE_FLOAT8_E4M3FN, .ndim = 0};
  cases[2] = (st__tensor_desc_t){.arena = 3, .offset = 4096, .dtype = ST_DTYPE_BOOL, .ndim = 3,
                                 .shape = {0, 5, 1}, .strides = {0, 0, 7}};
  cases[3].dtype = ST_DTYPE_BFLOAT16;
  cases[3].ndim = ST_MAX_NDIM;
  for (int k = 0; k < ST_MAX_NDIM; k++) {
    cases[3].shape[k] = INT64_MAX - k;
    cases[3].strides[k] = (int64_t)1 << k;
  }
  for (int i = 0; i < 4; i++) {
    mpbuf_t b;
    mpbuf_init(&b);
    st__pack_tensor(&b.pk, &cases[i]);
    const msgpack_object *o = mpbuf_obj(&b);
    CHECK(o && o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_TENSOR);
    st__tensor_desc_t d;
    memset(&d, 0xee, sizeof d);
    CHECK_ERR_MSG(st__parse_tensor(o, &d, why, sizeof why), ST_OK, why);
    CHECK(same_tensor(&d, &cases[i]));
    mpbuf_free(&b);
  }
  /* Every dtype by name. */
  for (int t = ST_DTYPE_INVALID + 1; t < ST_DTYPE_COUNT; t++) {
    const int64_t shape[1] = {3}, strides[1] = {1};
    st__tensor_desc_t d;
    CHECK_ERR(parse_made(NULL, st_dtype_name((st_dtype_t)t), shape, 1, strides, 1, &d), ST_OK);
    CHECK_EQ_INT(d.dtype, t);
    CHECK_EQ_INT(d.arena, 2);
    CHECK_EQ_INT(d.offset, 128);
  }
}

TEST(tensor_rejections) {
  const int64_t s2[2] = {2, 3}, st2[2] = {3, 1}, st1[1] = {1};
  const int64_t neg[2] = {2, -3}, big[ST_MAX_NDIM + 1] = {1};
  st__tensor_desc_t d;
  CHECK_ERR(parse_made(NULL, "float32", s2, 2, st2, 2, &d), ST_OK);
  CHECK_ERR(parse_made(NULL, "float128", s2, 2, st2, 2, &d), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "dtype");
  CHECK_ERR(parse_made(NULL, "float", s2, 2, st2, 2, &d), ST_ERR_PROTOCOL);   /* alias */
  CHECK_ERR(parse_made(NULL, "", s2, 2, st2, 2, &d), ST_ERR_PROTOCOL);
  CHECK_ERR(parse_made(NULL, "float32", neg, 2, st2, 2, &d), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "negative");
  CHECK_ERR(parse_made(NULL, "float32", s2, 2, neg, 2, &d), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "negative");
  CHECK_ERR(parse_made(NULL, "float32", s2, 2, st1, 1, &d), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "strides");
  CHECK_ERR(parse_made(NULL, "float32", big, ST_MAX_NDIM + 1, big, ST_MAX_NDIM + 1, &d),
            ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "dimensions");
  CHECK_ERR(parse_made(NULL, "float32", big, ST_MAX_NDIM, big, ST_MAX_NDIM, &d), ST_OK);
  const char *keys[] = {"arena", "offset", "dtype", "shape", "strides"};
  for (int i = 0; i < 5; i++) {
    CHECK_ERR(parse_made(keys[i], "float32", s2, 2, st2, 2, &d), ST_ERR_PROTOCOL);
    CHECK_CONTAINS(why, keys[i]);
  }
}

TEST(tensor_rejects_malformed_payloads) {
  /* Wrong ext type, not an ext at all. */
  const int64_t s1[1] = {1};
  msgpack_sbuffer payload;
  msgpack_sbuffer_init(&payload);
  tensor_payload(&payload, NULL, "float32", s1, 1, s1, 1);
  CHECK_ERR(parse_raw(ST_EXT_MODULE, payload.data, payload.size), ST_ERR_PROTOCOL);
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, payload.data, payload.size), ST_OK);
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, payload.data, payload.size - 1), ST_ERR_PROTOCOL);
  msgpack_sbuffer_write(&payload, "\xc0", 1);   /* trailing byte */
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, payload.data, payload.size), ST_ERR_PROTOCOL);
  msgpack_sbuffer_destroy(&payload);
  msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
  st__tensor_desc_t d;
  CHECK_ERR_MSG(st__parse_tensor(&nil, &d, why, sizeof why), ST_ERR_PROTOCOL, why);
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, "\x90", 1), ST_ERR_PROTOCOL);     /* [] */
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, "", 0), ST_ERR_PROTOCOL);
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, "\xc1", 1), ST_ERR_PROTOCOL);
  /* A payload announcing 2^32-1 map entries in 5 bytes is refused before
   * anything is allocated for it. */
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, "\xdf\xff\xff\xff\xff", 5), ST_ERR_PROTOCOL);
  /* Values of the wrong type. */
  static const unsigned char float_shape[] = {
    0x85, 0xa5, 'a', 'r', 'e', 'n', 'a', 0x00, 0xa6, 'o', 'f', 'f', 's', 'e', 't', 0x00,
    0xa5, 'd', 't', 'y', 'p', 'e', 0xa4, 'b', 'o', 'o', 'l',
    0xa5, 's', 'h', 'a', 'p', 'e', 0x91, 0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0,   /* 2.0 */
    0xa7, 's', 't', 'r', 'i', 'd', 'e', 's', 0x91, 0x01};
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, float_shape, sizeof float_shape), ST_ERR_PROTOCOL);
  static const unsigned char big_arena[] = {
    0x85, 0xa5, 'a', 'r', 'e', 'n', 'a', 0xcf, 0, 0, 0, 1, 0, 0, 0, 0,   /* 2^32 */
    0xa6, 'o', 'f', 'f', 's', 'e', 't', 0x00,
    0xa5, 'd', 't', 'y', 'p', 'e', 0xa4, 'b', 'o', 'o', 'l',
    0xa5, 's', 'h', 'a', 'p', 'e', 0x90, 0xa7, 's', 't', 'r', 'i', 'd', 'e', 's', 0x90};
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, big_arena, sizeof big_arena), ST_ERR_PROTOCOL);
  static const unsigned char huge_dim[] = {
    0x85, 0xa5, 'a', 'r', 'e', 'n', 'a', 0x00, 0xa6, 'o', 'f', 'f', 's', 'e', 't', 0x00,
    0xa5, 'd', 't', 'y', 'p', 'e', 0xa4, 'b', 'o', 'o', 'l',
    0xa5, 's', 'h', 'a', 'p', 'e', 0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0,   /* 2^63 */
    0xa7, 's', 't', 'r', 'i', 'd', 'e', 's', 0x91, 0x01};
  CHECK_ERR(parse_raw(ST_EXT_TENSOR, huge_dim, sizeof huge_dim), ST_ERR_PROTOCOL);
}

/* ------------------------------------------------------------- extents */

static st__tensor_desc_t tensor(st_dtype_t dt, uint64_t off, int ndim, const int64_t *shape,
                                const int64_t *strides) {
  st__tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.dtype = dt;
  d.offset = off;
  d.ndim = ndim;
  for (int k = 0; k < ndim; k++) {
    d.shape[k] = shape[k];
    d.strides[k] = strides[k];
  }
  return d;
}

TEST(extent) {
  uint64_t lo = 1, hi = 1;
  st__tensor_desc_t d;
  d = tensor(ST_DTYPE_FLOAT32, 64, 2, (int64_t[]){2, 3}, (int64_t[]){3, 1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK_EQ_INT(lo, 64);
  CHECK_EQ_INT(hi, 64 + 6 * 4);
  CHECK_EQ_INT(st__tensor_numel(&d), 6);
  /* Strided: last element at 1*10 + 2*2 = 14. */
  d = tensor(ST_DTYPE_FLOAT64, 8, 2, (int64_t[]){2, 3}, (int64_t[]){10, 2});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK_EQ_INT(lo, 8);
  CHECK_EQ_INT(hi, 8 + 15 * 8);
  /* Transposed view: strides in any order. */
  d = tensor(ST_DTYPE_INT16, 0, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK_EQ_INT(hi, 6 * 2);
  /* Broadcast (stride 0): one element. */
  d = tensor(ST_DTYPE_FLOAT16, 100, 1, (int64_t[]){1000}, (int64_t[]){0});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK_EQ_INT(hi, 102);
  CHECK_EQ_INT(st__tensor_numel(&d), 1000);
  /* Scalar. */
  d = tensor(ST_DTYPE_INT64, 40, 0, NULL, NULL);
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK_EQ_INT(lo, 40);
  CHECK_EQ_INT(hi, 48);
  CHECK_EQ_INT(st__tensor_numel(&d), 1);
  /* Empty: lo == hi == offset, whatever the other sizes. */
  d = tensor(ST_DTYPE_FLOAT32, 77, 3, (int64_t[]){5, 0, INT64_MAX}, (int64_t[]){INT64_MAX, 1, 9});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK_EQ_INT(lo, 77);
  CHECK_EQ_INT(hi, 77);
  CHECK_EQ_INT(st__tensor_numel(&d), 0);
}

TEST(extent_overflow) {
  uint64_t lo, hi;
  st__tensor_desc_t d;
  /* Element count past int64. */
  d = tensor(ST_DTYPE_UINT8, 0, 2, (int64_t[]){INT64_C(1) << 62, 4}, (int64_t[]){0, 0});
  CHECK_EQ_INT(st__tensor_numel(&d), -1);
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  /* Byte size past int64. */
  d = tensor(ST_DTYPE_FLOAT64, 0, 1, (int64_t[]){INT64_C(1) << 61}, (int64_t[]){0});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  /* Span past 2^64. */
  d = tensor(ST_DTYPE_UINT8, 0, 1, (int64_t[]){INT64_C(1) << 40}, (int64_t[]){INT64_C(1) << 40});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  d = tensor(ST_DTYPE_UINT8, 0, 2, (int64_t[]){2, 2}, (int64_t[]){INT64_MAX, INT64_MAX});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  /* Offset + size past 2^64, and past INT64_MAX (byte offsets stay signed). */
  d = tensor(ST_DTYPE_FLOAT32, UINT64_MAX - 3, 1, (int64_t[]){1}, (int64_t[]){1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  d = tensor(ST_DTYPE_FLOAT32, (uint64_t)INT64_MAX - 3, 1, (int64_t[]){1}, (int64_t[]){1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  d = tensor(ST_DTYPE_FLOAT32, (uint64_t)INT64_MAX - 4, 1, (int64_t[]){1}, (int64_t[]){1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK(hi == (uint64_t)INT64_MAX);
  /* An empty tensor ends where it starts: its offset too stays signed. */
  d = tensor(ST_DTYPE_FLOAT64, (uint64_t)INT64_MAX + 1, 2, (int64_t[]){5, 0}, (int64_t[]){1, 1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  d = tensor(ST_DTYPE_FLOAT64, (uint64_t)INT64_MAX, 1, (int64_t[]){0}, (int64_t[]){1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_OK);
  CHECK(lo == (uint64_t)INT64_MAX && hi == lo);
  /* Malformed descriptors. */
  d = tensor(ST_DTYPE_INVALID, 0, 1, (int64_t[]){1}, (int64_t[]){1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  d = tensor(ST_DTYPE_UINT8, 0, 1, (int64_t[]){-1}, (int64_t[]){1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  d = tensor(ST_DTYPE_UINT8, 0, 1, (int64_t[]){2}, (int64_t[]){-1});
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
  d.ndim = ST_MAX_NDIM + 1;
  CHECK_ERR(st__tensor_extent(&d, &lo, &hi), ST_ERR_PROTOCOL);
}

/* -------------------------------------------------------------- arenas */

TEST(arena_round_trip) {
  st__arena_desc_t cpu = {.fd = 0, .bytes = 4096, .cuda = 0, .backend = "memfd", .id = 17};
  st__arena_desc_t gpu = {.fd = 252, .bytes = UINT64_C(1) << 40, .cuda = 1,
                          .uuid = "GPU-12345678-abcd-ef01-2345-6789abcdef01", .backend = "vmm",
                          .id = UINT64_MAX};
  const st__arena_desc_t *in[2] = {&cpu, &gpu};
  for (int i = 0; i < 2; i++) {
    mpbuf_t b;
    mpbuf_init(&b);
    st__pack_arena(&b.pk, in[i]);
    const msgpack_object *o = mpbuf_obj(&b);
    CHECK(o && o->type == MSGPACK_OBJECT_MAP);
    CHECK_EQ_INT(o->via.map.size, in[i]->cuda ? 6 : 5);   /* uuid only for CUDA */
    CHECK_EQ_INT(st__map_get(o, "uuid") != NULL, in[i]->cuda);
    st__arena_desc_t a;
    memset(&a, 0x55, sizeof a);
    CHECK_ERR_MSG(st__parse_arena(o, &a, why, sizeof why), ST_OK, why);
    CHECK_EQ_INT(a.fd, in[i]->fd);
    CHECK(a.bytes == in[i]->bytes);
    CHECK_EQ_INT(a.cuda, in[i]->cuda);
    CHECK_STR_EQ(a.uuid, in[i]->uuid);
    CHECK_STR_EQ(a.backend, in[i]->backend);
    CHECK(a.id == in[i]->id);
    mpbuf_free(&b);
  }
}

/* st__parse_arena of the map packed in b (which it frees); the rc, the
 * refusal printed (why holds it). */
static int parse_arena_then_free(mpbuf_t *b) {
  st__arena_desc_t a;
  int rc = st__parse_arena(mpbuf_obj(b), &a, why, sizeof why);
  if (rc != ST_OK) fprintf(stderr, "  refused: %s\n", why);
  mpbuf_free(b);
  return rc;
}

/* Packs an arena map field by field; `skip` leaves one key out. */
static int parse_arena_made(const char *skip, const char *device, const char *uuid,
                            uint64_t fd, const char *backend) {
  mpbuf_t b;
  mpbuf_init(&b);
  int n = 5 + (uuid ? 1 : 0) - (skip ? 1 : 0);
  msgpack_pack_map(&b.pk, (size_t)n);
  if (!skip || strcmp(skip, "fd")) { key(&b.pk, "fd"); msgpack_pack_uint64(&b.pk, fd); }
  if (!skip || strcmp(skip, "bytes")) { key(&b.pk, "bytes"); msgpack_pack_uint64(&b.pk, 1); }
  if (!skip || strcmp(skip, "device")) { key(&b.pk, "device"); st__pack_cstr(&b.pk, device); }
  if (uuid) { key(&b.pk, "uuid"); st__pack_cstr(&b.pk, uuid); }
  if (!skip || strcmp(skip, "backend")) { key(&b.pk, "backend"); st__pack_cstr(&b.pk, backend); }
  if (!skip || strcmp(skip, "id")) { key(&b.pk, "id"); msgpack_pack_uint64(&b.pk, 9); }
  return parse_arena_then_free(&b);
}

TEST(arena_rejections) {
  CHECK_ERR(parse_arena_made(NULL, "cpu", NULL, 1, "memfd"), ST_OK);
  CHECK_ERR(parse_arena_made(NULL, "cuda", "GPU-x", 1, "vmm"), ST_OK);
  CHECK_ERR(parse_arena_made(NULL, "cuda", NULL, 1, "vmm"), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "uuid");
  CHECK_ERR(parse_arena_made(NULL, "tpu", NULL, 1, "memfd"), ST_ERR_PROTOCOL);
  CHECK_ERR(parse_arena_made(NULL, "cpu", NULL, UINT64_C(1) << 32, "memfd"),
            ST_ERR_PROTOCOL);
  CHECK_ERR(parse_arena_made(NULL, "cpu", NULL, 1, "a-backend-name-too-long"),
            ST_ERR_PROTOCOL);
  CHECK_ERR(parse_arena_made(NULL, "cpu", NULL, 1, ""), ST_ERR_PROTOCOL);
  /* Each device has its backends; no other name gets through. */
  CHECK_ERR(parse_arena_made(NULL, "cpu", NULL, 1, "file"), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "backend 'file' is not one of device 'cpu' (memfd)");
  CHECK_ERR(parse_arena_made(NULL, "cpu", NULL, 1, "vmm"), ST_ERR_PROTOCOL);
  CHECK_ERR(parse_arena_made(NULL, "cuda", "GPU-x", 1, "memfd"), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "(vmm or legacy)");
  char long_uuid[64];
  memset(long_uuid, 'u', 48);
  long_uuid[48] = '\0';
  CHECK_ERR(parse_arena_made(NULL, "cuda", long_uuid, 1, "vmm"), ST_ERR_PROTOCOL);
  const char *keys[] = {"fd", "bytes", "device", "backend", "id"};
  for (int i = 0; i < 5; i++) {
    CHECK_ERR(parse_arena_made(keys[i], "cpu", NULL, 1, "memfd"), ST_ERR_PROTOCOL);
    CHECK_CONTAINS(why, keys[i]);
  }
  msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
  st__arena_desc_t a;
  CHECK_ERR_MSG(st__parse_arena(&nil, &a, why, sizeof why), ST_ERR_PROTOCOL, why);
}

/* A legacy CUDA IPC arena: no "fd", the handle, device index and
 * storage_bytes instead; its bytes survive the round trip. */
TEST(legacy_arena_round_trip) {
  st__arena_desc_t in = {.fd = 7, .bytes = 2u << 20, .cuda = 1, .backend = "legacy", .id = 41,
                         .uuid = "GPU-12345678-abcd-ef01-2345-6789abcdef01", .legacy = 1,
                         .device_index = 3, .storage_bytes = 1000};
  for (int i = 0; i < ST_IPC_HANDLE_LEN; i++) in.ipc_handle[i] = (unsigned char)(i * 7 + 1);
  in.ipc_handle[5] = 0;   /* a NUL byte inside the handle travels too */
  mpbuf_t b;
  mpbuf_init(&b);
  st__pack_arena(&b.pk, &in);
  const msgpack_object *o = mpbuf_obj(&b);
  CHECK(o && o->type == MSGPACK_OBJECT_MAP);
  CHECK_EQ_INT(o->via.map.size, 8);
  CHECK(st__map_get(o, "fd") == NULL);
  CHECK(st__str_eq(st__map_get(o, "backend"), "legacy"));
  const msgpack_object *h = st__map_get(o, "ipc_handle");
  CHECK(h && h->type == MSGPACK_OBJECT_BIN && h->via.bin.size == ST_IPC_HANDLE_LEN);
  st__arena_desc_t a;
  memset(&a, 0x55, sizeof a);
  CHECK_ERR_MSG(st__parse_arena(o, &a, why, sizeof why), ST_OK, why);
  CHECK_EQ_INT(a.legacy, 1);
  CHECK_EQ_INT(a.cuda, 1);
  CHECK_EQ_INT(a.fd, 0);
  CHECK(a.bytes == in.bytes && a.id == 41 && a.storage_bytes == 1000);
  CHECK_EQ_INT(a.device_index, 3);
  CHECK_STR_EQ(a.uuid, in.uuid);
  CHECK_STR_EQ(a.backend, "legacy");
  CHECK(memcmp(a.ipc_handle, in.ipc_handle, ST_IPC_HANDLE_LEN) == 0);
  mpbuf_free(&b);
}

/* A legacy arena map built key by key: `fd` adds an fd key, `skip` leaves
 * one key out, `hlen` is the handle's length, `dev` the device. */
static int parse_legacy_made(int fd, const char *skip, uint32_t hlen, const char *dev,
                             uint64_t storage) {
  mpbuf_t b;
  mpbuf_init(&b);
  msgpack_pack_map(&b.pk, (size_t)(8 + (fd ? 1 : 0) - (skip ? 1 : 0)));
  if (fd) { key(&b.pk, "fd"); msgpack_pack_uint64(&b.pk, 0); }
  key(&b.pk, "bytes"); msgpack_pack_uint64(&b.pk, 4096);
  key(&b.pk, "device"); st__pack_cstr(&b.pk, dev);
  key(&b.pk, "uuid"); st__pack_cstr(&b.pk, "GPU-x");
  key(&b.pk, "backend"); st__pack_cstr(&b.pk, "legacy");
  key(&b.pk, "id"); msgpack_pack_uint64(&b.pk, 9);
  unsigned char hb[80] = {1};
  if (!skip || strcmp(skip, "ipc_handle")) {
    key(&b.pk, "ipc_handle");
    msgpack_pack_bin(&b.pk, hlen);
    msgpack_pack_bin_body(&b.pk, hb, hlen);
  }
  if (!skip || strcmp(skip, "device_index")) {
    key(&b.pk, "device_index");
    msgpack_pack_uint64(&b.pk, 0);
  }
  if (!skip || strcmp(skip, "storage_bytes")) {
    key(&b.pk, "storage_bytes");
    msgpack_pack_uint64(&b.pk, storage);
  }
  return parse_arena_then_free(&b);
}

TEST(legacy_arena_rejections) {
  CHECK_ERR(parse_legacy_made(0, NULL, 64, "cuda", 4096), ST_OK);
  CHECK_ERR(parse_legacy_made(1, NULL, 64, "cuda", 4096), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "'fd'");
  CHECK_ERR(parse_legacy_made(0, NULL, 63, "cuda", 10), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "ipc_handle");
  CHECK_ERR(parse_legacy_made(0, NULL, 64, "cpu", 10), ST_ERR_PROTOCOL);
  CHECK_ERR(parse_legacy_made(0, NULL, 64, "cuda", 4097), ST_ERR_PROTOCOL);
  CHECK_CONTAINS(why, "storage_bytes");
  const char *keys[] = {"ipc_handle", "device_index", "storage_bytes"};
  for (int i = 0; i < 3; i++) {
    CHECK_ERR(parse_legacy_made(0, keys[i], 64, "cuda", 10), ST_ERR_PROTOCOL);
    CHECK_CONTAINS(why, keys[i]);
  }
}

/* ------------------------------------------------------------- modules */

typedef struct {
  const char *names[3];
  uint32_t arenas[3];
  int n;
  int pair_shape;      /* 0 ok, 1 name not a string, 2 pair of 3 */
  int bad_tensor;      /* tensor 1 has dtype "nope" */
  int metadata;        /* 0 ok map, 1 missing, 2 not a map, 3 int key */
  int no_tensors;
} module_spec_t;

/* Packs a module ext from a spec into b. */
static void pack_module(mpbuf_t *b, const module_spec_t *s) {
  mpbuf_t mb;
  mpbuf_init(&mb);
  msgpack_pack_map(&mb.pk, (size_t)(2 - (s->metadata == 1) - s->no_tensors));
  if (!s->no_tensors) {
    key(&mb.pk, "tensors");
    msgpack_pack_array(&mb.pk, (size_t)s->n);
    for (int i = 0; i < s->n; i++) {
      msgpack_pack_array(&mb.pk, s->pair_shape == 2 ? 3 : 2);
      if (s->pair_shape == 1) msgpack_pack_int(&mb.pk, i);
      else st__pack_cstr(&mb.pk, s->names[i]);
      st__tensor_desc_t d = tensor(ST_DTYPE_FLOAT32, 256 * (uint64_t)i, 1, (int64_t[]){4},
                                   (int64_t[]){1});
      d.arena = s->arenas[i];
      if (s->bad_tensor && i == 1) {
        msgpack_sbuffer tp;
        msgpack_sbuffer_init(&tp);
        tensor_payload(&tp, NULL, "nope", d.shape, 1, d.strides, 1);
        st__pack_ext(&mb.pk, ST_EXT_TENSOR, &tp);
        msgpack_sbuffer_destroy(&tp);
      } else {
        st__pack_tensor(&mb.pk, &d);
      }
      if (s->pair_shape == 2) msgpack_pack_nil(&mb.pk);
    }
  }
  if (s->metadata != 1) {
    key(&mb.pk, "metadata");
    if (s->metadata == 2) {
      msgpack_pack_array(&mb.pk, 0);
    } else {
      msgpack_pack_map(&mb.pk, 1);
      if (s->metadata == 3) msgpack_pack_int(&mb.pk, 1);
      else key(&mb.pk, "step");
      msgpack_pack_int(&mb.pk, 1000);
    }
  }
  st__pack_ext(&b->pk, ST_EXT_MODULE, &mb.sb);
  mpbuf_free(&mb);
}

static int parse_module_spec(const module_spec_t *s) {
  mpbuf_t b;
  mpbuf_init(&b);
  pack_module(&b, s);
  msgpack_unpacked payload;
  const msgpack_object *tensors = (void *)1, *metadata = (void *)1;
  int rc = st__parse_module(mpbuf_obj(&b), &payload, &tensors, &metadata, why, sizeof why);
  if (rc == ST_OK) {
    if (!tensors || tensors->via.array.size != (uint32_t)s->n || !metadata ||
        metadata->type != MSGPACK_OBJECT_MAP)
      rc = -999;
    for (int i = 0; rc == ST_OK && i < s->n; i++) {
      const msgpack_object *pair = &tensors->via.array.ptr[i];
      st__tensor_desc_t d;
      if (!st__str_eq(&pair->via.array.ptr[0], s->names[i]) ||
          st__parse_tensor(&pair->via.array.ptr[1], &d, why, sizeof why) != ST_OK ||
          d.offset != 256 * (uint64_t)i)
        rc = -998;
    }
    msgpack_unpacked_destroy(&payload);
  } else {
    fprintf(stderr, "  refused: %s\n", why);
    if (tensors || metadata || payload.zone) rc = -997;   /* nothing handed back */
  }
  mpbuf_free(&b);
  return rc;
}

TEST(module_round_trip) {
  module_spec_t s = {.names = {"weight", "bias", "0.running_mean"}, .arenas = {4, 4, 4}, .n = 3};
  CHECK_ERR(parse_module_spec(&s), ST_OK);
  s.n = 0;   /* an empty module */
  CHECK_ERR(parse_module_spec(&s), ST_OK);
}

TEST(module_rejections) {
  /* Three good tensors "weight", "bias", "x" in arena 1, but for one
   * flaw each; refused as PROTOCOL with the part (NULL: not checked). */
#define GOOD_TENSORS .names = {"weight", "bias", "x"}, .arenas = {1, 1, 1}, .n = 3
  static const struct {
    module_spec_t s;
    const char *part;
  } flawed[] = {
      {{.names = {"weight", "bias", "weight"}, .arenas = {1, 1, 1}, .n = 3}, "repeat"},
      {{.names = {"weight", "bias", "x"}, .arenas = {1, 1, 2}, .n = 3}, "arena"},
      {{GOOD_TENSORS, .pair_shape = 1}, NULL},
      {{GOOD_TENSORS, .pair_shape = 2}, NULL},
      {{GOOD_TENSORS, .bad_tensor = 1}, "dtype"},
      {{GOOD_TENSORS, .metadata = 1}, "metadata"},
      {{GOOD_TENSORS, .metadata = 2}, NULL},
      {{GOOD_TENSORS, .metadata = 3}, NULL},
      {{GOOD_TENSORS, .no_tensors = 1}, "tensors"},
  };
#undef GOOD_TENSORS
  for (size_t i = 0; i < sizeof flawed / sizeof flawed[0]; i++) {
    module_spec_t s = flawed[i].s;
    CHECK_ERR(parse_module_spec(&s), ST_ERR_PROTOCOL);
    if (flawed[i].part) CHECK_CONTAINS(why, flawed[i].part);
  }
  /* A tensor ext is not a module. */
  mpbuf_t b;
  mpbuf_init(&b);
  st__tensor_desc_t d = tensor(ST_DTYPE_FLOAT32, 0, 0, NULL, NULL);
  st__pack_tensor(&b.pk, &d);
  msgpack_unpacked payload;
  const msgpack_object *t, *m;
  CHECK_ERR_MSG(st__parse_module(mpbuf_obj(&b), &payload, &t, &m, why, sizeof why),
                ST_ERR_PROTOCOL, why);
  mpbuf_free(&b);
}

int main(void) {
  RUN(tensor_round_trip);
  RUN(tensor_rejections);
  RUN(tensor_rejects_malformed_payloads);
  RUN(extent);
  RUN(extent_overflow);
  RUN(arena_round_trip);
  RUN(arena_rejections);
  RUN(legacy_arena_round_trip);
  RUN(legacy_arena_rejections);
  RUN(module_round_trip);
  RUN(module_rejections);
  return stt_summary();
}

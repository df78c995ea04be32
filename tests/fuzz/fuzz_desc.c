/* Fuzz target: the descriptor decoders (src/proto/desc.c), tensors,
 * arenas and modules as both sides read them off the wire.
 *
 * Input: one msgpack value (bounded by the framing scan, as every value
 * that reaches the decoders is). An ext 1 is parsed as a tensor, an ext 2
 * as a module, a map as an arena, an array as a list of those.
 *
 * Properties: a descriptor that parses packs back to bytes that parse to
 * the same descriptor; a parsed tensor's extent, when it has one, is
 * ordered and starts at its offset when it is empty or has zero strides
 * only; the element count is -1 or the product of the shape; a module
 * that parses has tensors that all parse.
 */
#include <string.h>

#include "fuzz.h"
#include "proto/scan.h"

/* Packs the tensor or the arena descriptor given (the other is NULL),
 * parses the bytes back and checks that the same descriptor comes out. */
static void repack(const st__tensor_desc_t *t, const st__arena_desc_t *a) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  if (t) st__pack_tensor(&pk, t);
  else st__pack_arena(&pk, a);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  FUZZ_CHECK(msgpack_unpack_next(&u, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS);
  FUZZ_CHECK(off == sb.size);
  char err[256];
  if (t) {
    st__tensor_desc_t back;
    FUZZ_CHECK(st__parse_tensor(&u.data, &back, err, sizeof err) == ST_OK);
    FUZZ_CHECK(memcmp(&back, t, sizeof back) == 0);
  } else {
    st__arena_desc_t back;
    FUZZ_CHECK(st__parse_arena(&u.data, &back, err, sizeof err) == ST_OK);
    FUZZ_CHECK(memcmp(&back, a, sizeof back) == 0);
  }
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&sb);
}

static void tensor(const msgpack_object *o) {
  st__tensor_desc_t d;
  char err[256];
  if (st__parse_tensor(o, &d, err, sizeof err) != ST_OK) return;
  FUZZ_CHECK(d.ndim >= 0 && d.ndim <= ST_MAX_NDIM);
  FUZZ_CHECK(st_dtype_size(d.dtype) > 0);
  int64_t numel = st__tensor_numel(&d);
  if (numel >= 0) {
    int64_t p = 1;
    for (int i = 0; i < d.ndim; i++) p *= d.shape[i];
    FUZZ_CHECK(p == numel);
  }
  uint64_t lo, hi;
  if (st__tensor_extent(&d, &lo, &hi) == ST_OK) {
    FUZZ_CHECK(lo <= hi && hi <= (uint64_t)INT64_MAX);
    FUZZ_CHECK(lo == d.offset);
    if (numel == 0) FUZZ_CHECK(hi == lo);
    else FUZZ_CHECK(hi - lo >= st_dtype_size(d.dtype));
  }
  repack(&d, NULL);
}

static void module(const msgpack_object *o) {
  msgpack_unpacked pl;
  const msgpack_object *tensors, *meta;
  char err[256];
  if (st__parse_module(o, &pl, &tensors, &meta, err, sizeof err) != ST_OK) return;
  FUZZ_CHECK(tensors->type == MSGPACK_OBJECT_ARRAY && meta->type == MSGPACK_OBJECT_MAP);
  for (uint32_t i = 0; i < tensors->via.array.size; i++) {
    const msgpack_object *pair = &tensors->via.array.ptr[i];
    st__tensor_desc_t d;
    FUZZ_CHECK(st__parse_tensor(&pair->via.array.ptr[1], &d, err, sizeof err) == ST_OK);
    tensor(&pair->via.array.ptr[1]);
  }
  msgpack_unpacked_destroy(&pl);
}

static void arena(const msgpack_object *o) {
  st__arena_desc_t a;
  char err[256];
  if (st__parse_arena(o, &a, err, sizeof err) != ST_OK) return;
  FUZZ_CHECK(strlen(a.backend) > 0 && a.backend[sizeof a.backend - 1] == '\0');
  if (a.legacy) FUZZ_CHECK(a.cuda && a.storage_bytes <= a.bytes);
  repack(NULL, &a);
}

static void one(const msgpack_object *o) {
  if (o->type == MSGPACK_OBJECT_EXT) {
    if (o->via.ext.type == ST_EXT_MODULE) module(o);
    else tensor(o);
  } else if (o->type == MSGPACK_OBJECT_MAP) {
    arena(o);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (st__scan_bounded(data, size) != ST_OK) return 0;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  if (msgpack_unpack_next(&u, (const char *)data, size, &off) == MSGPACK_UNPACK_SUCCESS) {
    if (u.data.type == MSGPACK_OBJECT_ARRAY)
      for (uint32_t i = 0; i < u.data.via.array.size; i++) one(&u.data.via.array.ptr[i]);
    else one(&u.data);
  }
  msgpack_unpacked_destroy(&u);
  return 0;
}

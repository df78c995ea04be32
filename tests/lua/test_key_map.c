/* An imported CUDA allocation is mapped in the server on first need
 * (mem/arena.h, st__arena_map), and a mapping that fails is an error the
 * reader gets, never a NULL the tensor core dereferences. Runs on every
 * host: the arena here holds a descriptor no driver can import (no
 * driver on a host without CUDA; a UUID no device has and /dev/null on a
 * GPU host), so every mapping of it fails:
 *   - the arena is not mapped until asked (st__arena_base NULL), still
 *     describes itself (vmm, its UUID, its bytes) and dups its descriptor;
 *   - st__arena_map fails with "mapping imported CUDA allocation (arena
 *     <id>, <bytes> bytes on <uuid>) in the server: <reason>", every time
 *     (a failure is not remembered as success), and st__tensor_from_desc
 *     fails with the same reason and takes no reference;
 *   - st.key of a key made of it returns nil and that reason (a runtime
 *     failure, not a raise), and the same body reads a memfd key's values.
 * The mapping that succeeds is CUDA-only: tests/client/test_gpu_keys.c. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "desc.h"
#include "engine/keys.h"
#include "lua_kit.h"
#include "mem/arena.h"
#include "mem/cuda.h"
#include "mem/ledger.h"
#include "tensor/tensor.h"

#define UUID "GPU-12345678-9abc-def0-1234-56789abcdef0"
#define TWO_MIB (2ull << 20)
#define MAP_FAILS "mapping imported CUDA allocation (arena "

/* A client's CUDA arena of 2 MiB on UUID that cannot be imported (no
 * device has that UUID; its descriptor is /dev/null), holding one
 * reference and the descriptor charge st__arena_import makes. */
static st__arena_t *unmappable(void) {
  char err[256];
  if (st__ledger_charge(-1, 0, 1, err, sizeof err) != ST_OK) return NULL;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0 ? st__arena_adopt_cuda_import(fd, TWO_MIB, 0, UUID) : NULL;
}

/* A float32 tensor of n elements at offset 0 of arena 0. */
static st__tensor_desc_t f32(int64_t n) { return stt_desc_1d(ST_DTYPE_FLOAT32, n); }

TEST(an_unmappable_import_fails_clearly_and_stays_unmapped) {
  uint64_t n0, b0;
  st__arena_stats(&n0, &b0);
  st__arena_t *a = unmappable();
  CHECK(a);
  CHECK(st__arena_base(a) == NULL);   /* nothing mapped at import */
  CHECK_EQ_INT(st__arena_device(a), 0);
  CHECK_EQ_INT(st__arena_bytes(a), TWO_MIB);
  st__arena_desc_t d = {.fd = 1};
  st__arena_describe(a, &d);
  CHECK_EQ_INT(d.cuda, 1);
  CHECK_STR_EQ(d.backend, "vmm");
  CHECK_STR_EQ(d.uuid, UUID);
  CHECK_EQ_INT(d.bytes, TWO_MIB);
  int fd = st__arena_dup_fd(a, NULL, 0);   /* a reply sends the received descriptor */
  CHECK(fd >= 0);
  close(fd);

  char err[512], again[512];
  void *base = (void *)1;
  int rc = st__arena_map(a, &base, err, sizeof err);
  fprintf(stderr, "   map: %s\n", err);
  CHECK(rc < 0);
  CHECK(base == NULL);
  CHECK(strncmp(err, MAP_FAILS, strlen(MAP_FAILS)) == 0);
  CHECK_CONTAINS(err, "2097152 bytes on " UUID ") in the server: ");
  CHECK(st__arena_base(a) == NULL);
  CHECK_EQ_INT(st__arena_map(a, NULL, again, sizeof again), rc);   /* tried again, fails again */
  CHECK_STR_EQ(again, err);

  /* The tensor core's one way in: the same failure, no tensor, no reference. */
  st__tensor_desc_t td = f32(16);
  st__tensor_t t = {0};
  CHECK_EQ_INT(st__tensor_from_desc(&t, a, &td, again, sizeof again), rc);
  CHECK_STR_EQ(again, err);
  CHECK(t.arena == NULL);
  st__arena_unref(a);
  uint64_t n1, b1;
  st__arena_stats(&n1, &b1);
  CHECK_EQ_INT(n1, n0);   /* the one reference was the last */
  CHECK_EQ_INT(b1, b0);
}

/* Puts `a` (its reference moves to the table) as key `name` = {w = a
 * float32 tensor of n elements at offset 0}. */
static int put(st__keys_t *t, const char *name, st__arena_t *a, int64_t n) {
  st__build_result_t r;
  st__build_result_init(&r);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &r.value, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  msgpack_pack_str_with_body(&pk, "w", 1);
  st__tensor_desc_t d = f32(n);
  st__pack_tensor(&pk, &d);
  r.arenas = malloc(sizeof *r.arenas);
  if (!r.arenas) return ST_ERR_OUT_OF_MEMORY;
  r.arenas[0] = a;
  r.narenas = 1;
  r.bytes = st__arena_bytes(a);
  st__key_put_t p = {.name = name, .len = strlen(name), .uid = getuid(), .conn = 1};
  uint64_t version = 0;
  char err[400];
  int rc = st__keys_put(t, &p, &r, &version, err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "   put %s: %s\n", name, err);
    st__build_result_destroy(&r);
  }
  return rc;
}

/* Builds an endpoint reading key `name` and returns the string it
 * returned (static), or NULL. */
static const char *read_key(const char *name) {
  static char out[700];
  char body[300], err[1024];
  snprintf(body, sizeof body,
           "local v, e = st.key('%s')\n"
           "if v == nil then return 'nil: ' .. e end\n"
           "return string.format('%%g %%g', v.w:get(0), v.w:get(5))",
           name);
  st__build_result_t res;
  if (kit_run_body(body, &res, err, sizeof err) != ST_OK) return NULL;
  msgpack_unpacked up;
  const msgpack_object *o = kit_value(&res, &up);
  const char *s = NULL;
  if (o && o->type == MSGPACK_OBJECT_STR && o->via.str.size < sizeof out) {
    memcpy(out, o->via.str.ptr, o->via.str.size);
    out[o->via.str.size] = '\0';
    s = out;
  }
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
  return s;
}

TEST(st_key_of_an_unmappable_key_returns_nil_and_the_reason) {
  st__keys_t t;
  st__keys_init(&t, 16, 0, 2);
  st__keys_serve(&t);
  char err[256];
  st__arena_t *cpu = NULL;
  CHECK_ERR_MSG(st__arena_new_cpu(64, &cpu, err, sizeof err), ST_OK, err);
  float *f = st__arena_base(cpu);
  for (int i = 0; i < 16; i++) f[i] = (float)i * 2.5f;
  CHECK_EQ_INT(put(&t, "lazy/cpu", cpu, 16), ST_OK);
  st__arena_t *gpu = unmappable();
  CHECK(gpu);
  CHECK_EQ_INT(put(&t, "lazy/gpu", gpu, 16), ST_OK);

  /* The body's way of reading works: a memfd key's values. */
  const char *got = read_key("lazy/cpu");
  CHECK(got);
  CHECK_STR_EQ(got, "0 12.5");
  /* The CUDA key: nil and the mapping's failure, the body carries on. */
  got = read_key("lazy/gpu");
  CHECK(got);
  fprintf(stderr, "   st.key: %s\n", got ? got : "(none)");
  CHECK(got && strncmp(got, "nil: key 'lazy/gpu' version 1: " MAP_FAILS,
                       strlen("nil: key 'lazy/gpu' version 1: " MAP_FAILS)) == 0);
  CHECK_CONTAINS(got, UUID ") in the server: ");
  st__keys_free(&t);
  uint64_t n, b;
  st__arena_stats(&n, &b);
  CHECK_EQ_INT(n, 0);   /* both arenas went with their keys */
}

int main(void) {
  RUN(an_unmappable_import_fails_clearly_and_stays_unmapped);
  RUN(st_key_of_an_unmappable_key_returns_nil_and_the_reason);
  kit_rmdir();
  return stt_summary();
}

/* Result-pool checks shared by test_pool_fill.c (CPU, in CI) and
 * test_gpu_pool.c (CUDA): one endpoint, `make`, builds a fresh float32
 * result of `n` elements on device `dev` with the maker `kind` names, and
 * the checks below call it through libstclient on a pooled connection.
 * A result of 1000 floats (4,000 bytes) fills one 4 KiB region but for
 * its last 96 bytes, the region's tail, which the client can see in its
 * slab mapping (its own bytes).
 *
 * pk_dev is "cpu" or "cuda"; pk_get / pk_put copy bytes at an offset
 * from a tensor's data (host memory, or a device address of the
 * client's mapping: a file that defines PK_WITH_CUDA links src/mem's
 * copies, as gpu client tests do). */
#ifndef STT_POOL_KIT_H
#define STT_POOL_KIT_H

#include <st/client.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_kit.h"
#ifdef PK_WITH_CUDA
#include "mem/cuda.h"
#endif

#define PK_N 1000
#define PK_BYTES (PK_N * 4)
#define PK_REGION 4096

static const char PK_MAKE[] =
    "local stash\n"
    "return st.endpoint{ name = 'make', params = { kind = 'ones', n = 1000, dev = 'cpu', v = 0.5 },\n"
    "  build = function(a)\n"
    "    local o = { dtype = 'float32', device = a.dev }\n"
    "    local function shaped(f, extra)\n"
    "      local t = { a.n, dtype = 'float32', device = a.dev }\n"
    "      for k, v in pairs(extra or {}) do t[k] = v end\n"
    "      return f(t)\n"
    "    end\n"
    "    if a.kind == 'ones' then return shaped(st.ones) end\n"
    "    if a.kind == 'zeros' then return shaped(st.zeros) end\n"
    "    if a.kind == 'empty' then return shaped(st.empty) end\n"
    "    if a.kind == 'full' then return shaped(st.full, { value = a.v }) end\n"
    "    if a.kind == 'rand' then return shaped(st.rand, { seed = 3 }) end\n"
    "    if a.kind == 'randn' then return shaped(st.randn, { seed = 4 }) end\n"
    "    if a.kind == 'arange' then o[1] = a.n; return st.arange(o) end\n"
    "    if a.kind == 'clone' then o[1] = a.n; return st.arange(o):clone() end\n"
    "    if a.kind == 'cast' then\n"
    "      return st.arange{ a.n, dtype = 'int32', device = a.dev }:to('float32')\n"
    "    end\n"
    "    if a.kind == 'stash' then stash = shaped(st.ones); return stash:clone():mul_(2) end\n"
    "    if a.kind == 'stash_module' then\n"
    "      stash = st.module{ { 'w', shaped(st.ones) } }; return stash\n"
    "    end\n"
    "    if a.kind == 'use_stash' then return stash:clone() end\n"
    "    if a.kind == 'use_stash_module' then return stash end\n"
    "    error('unknown kind ' .. a.kind)\n"
    "  end }\n";

static const char *pk_dev = "cpu";

static void pk_get(const st_tensor_t *t, size_t off, void *dst, size_t n) {
  if (t->device == ST_DEVICE_CPU) {
    memcpy(dst, (const char *)t->data + off, n);
    return;
  }
#ifdef PK_WITH_CUDA
  CHECK_EQ_INT(st__cuda_copy_to_host(dst, (uint64_t)(uintptr_t)t->data + off, n,
                                     t->device_index, NULL, 0),
               ST_OK);
#else
  STT_FAIL("a CUDA tensor in a test built without PK_WITH_CUDA");
#endif
}

static void pk_put(const st_tensor_t *t, size_t off, const void *src, size_t n) {
  if (t->device == ST_DEVICE_CPU) {
    memcpy((char *)t->data + off, src, n);
    return;
  }
#ifdef PK_WITH_CUDA
  CHECK_EQ_INT(st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data + off, src, n,
                                       t->device_index, NULL, 0),
               ST_OK);
#else
  STT_FAIL("a CUDA tensor in a test built without PK_WITH_CUDA");
#endif
}

/* Calls make{kind, v} on c; NULL when it fails (printed). */
static st_result_t *pk_make(st_client_t *c, const char *kind, double v) {
  st_args_t *a = st_args_new();
  st_args_string(a, "kind", kind);
  st_args_string(a, "dev", pk_dev);
  st_args_float(a, "v", v);
  st_result_t *r = NULL;
  int rc = st_client_call(c, "make", a, &r);
  st_args_free(a);
  if (rc != ST_OK) fprintf(stderr, "   make %s: %s\n", kind, st_client_error(c));
  return rc == ST_OK ? r : NULL;
}

/* Fills the whole 4 KiB region of r's tensor with byte `b`. */
static void pk_scribble(const st_result_t *r, unsigned char b) {
  unsigned char buf[PK_REGION];
  memset(buf, b, sizeof buf);
  pk_put(st_result_tensor(r, 0), 0, buf, sizeof buf);
}

/* A maker that writes every byte skips the zero fill of a recycled
 * region: the region comes back (same address) with the tensor written
 * and the tail as the client left it. */
/* A "ones" result whose region the client scribbles with byte `b` and
 * frees, then a `kind` result, which gets that region again (checked);
 * NULL when a call failed. */
static st_result_t *pk_make_in_scribbled(st_client_t *c, const char *kind, unsigned char b) {
  st_result_t *r = pk_make(c, "ones", 0);
  if (!r) {
    stt_fail(__FILE__, __LINE__, "make ones failed");
    return NULL;
  }
  void *at = st_result_tensor(r, 0)->data;
  pk_scribble(r, b);
  st_result_free(r);
  r = pk_make(c, kind, 0);
  if (!r) stt_fail(__FILE__, __LINE__, "make %s failed", kind);
  else if (st_result_tensor(r, 0)->data != at)
    stt_fail(__FILE__, __LINE__, "%s did not get the freed region again", kind);
  return r;
}

static void pk_written_result_skips_the_fill(st_client_t *c) {
  st_result_t *r = pk_make_in_scribbled(c, "ones", 0x5a);
  if (!r) return;
  unsigned char buf[PK_REGION];
  pk_get(st_result_tensor(r, 0), 0, buf, sizeof buf);
  for (int i = 0; i < PK_N; i++) CHECK(((float *)buf)[i] == 1.0f);
  for (int i = PK_BYTES; i < PK_REGION; i++) CHECK(buf[i] == 0x5a);
  st_result_free(r);
}

/* zeros promises zeros: in a region that held ones and bytes the client
 * wrote, every byte of the region reads zero. */
static void pk_zeros_never_show_old_bytes(st_client_t *c) {
  st_result_t *r = pk_make(c, "ones", 0);
  CHECK(r);
  void *at = st_result_tensor(r, 0)->data;
  unsigned char buf[PK_REGION];
  pk_get(st_result_tensor(r, 0), 0, buf, PK_BYTES);
  CHECK(((float *)buf)[PK_N - 1] == 1.0f);
  pk_put(st_result_tensor(r, 0), PK_BYTES, buf, PK_REGION - PK_BYTES);
  st_result_free(r);
  r = pk_make(c, "zeros", 0);
  CHECK(r);
  CHECK(st_result_tensor(r, 0)->data == at);
  pk_get(st_result_tensor(r, 0), 0, buf, sizeof buf);
  for (int i = 0; i < PK_REGION; i++) CHECK(buf[i] == 0);
  st_result_free(r);
}

/* empty promises no contents and skips the fill: a recycled region shows
 * the bytes this connection left in it; a second connection's first
 * empty (a new slab of its own) reads zeros, never those bytes. */
static void pk_empty_shows_only_own_bytes(st_client_t *c, const char *socket) {
  st_result_t *r = pk_make_in_scribbled(c, "empty", 0x3c);
  if (!r) return;
  unsigned char buf[PK_REGION];
  pk_get(st_result_tensor(r, 0), 0, buf, sizeof buf);
  for (int i = 0; i < PK_REGION; i++) CHECK(buf[i] == 0x3c);
  st_result_free(r);
  OPEN_CLIENT(other, socket);
  r = pk_make(other, "empty", 0);
  CHECK(r);
  pk_get(st_result_tensor(r, 0), 0, buf, sizeof buf);
  for (int i = 0; i < PK_REGION; i++) CHECK(buf[i] == 0);
  st_result_free(r);
  st_client_close(other);
}

/* A tensor or module a call made in the pool lives for that call only:
 * usable in it (returned, or a computation returned), then released with
 * the call, so a later call that uses it gets a clear error (not the
 * memory of a region the client may have been given again). */
static void pk_stashed_region_tensors_end_with_their_call(st_client_t *c) {
  static const char *const kinds[][2] = {{"stash", "use_stash"},
                                         {"stash_module", "use_stash_module"}};
  for (int k = 0; k < 2; k++) {
    st_result_t *r = pk_make(c, kinds[k][0], 0);
    CHECK(r);
    if (!r) continue;
    float v = 0;
    pk_get(st_result_tensor(r, 0), 0, &v, sizeof v);
    CHECK(v == (k ? 1.0f : 2.0f));
    st_result_free(r);
    st_args_t *a = st_args_new();
    st_args_string(a, "kind", kinds[k][1]);
    st_args_string(a, "dev", pk_dev);
    /* Used in a body: the body fails; returned: it cannot be sent. */
    CHECK_ERR(st_client_call(c, "make", a, &r), k ? ST_ERR_SERIALIZATION : ST_ERR_ENDPOINT);
    CHECK(strstr(st_client_error(c), "made by an earlier call") != NULL);
    st_args_free(a);
  }
}

/* Every maker that skips the fill writes every byte: the same call in a
 * region scribbled with two different patterns gives the same bytes. */
static void pk_written_makers_write_every_byte(st_client_t *c) {
  static const char *const kinds[] = {"ones", "full", "arange", "rand", "randn", "clone", "cast"};
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    unsigned char first[PK_BYTES], again[PK_BYTES];
    for (int round = 0; round < 3; round++) {
      st_result_t *r = pk_make(c, kinds[k], 2.5);
      CHECK(r);
      pk_get(st_result_tensor(r, 0), 0, round ? again : first, PK_BYTES);
      if (round) CHECK(memcmp(first, again, PK_BYTES) == 0);
      pk_scribble(r, round ? 0x5c : 0xab);
      st_result_free(r);
    }
    if (strcmp(kinds[k], "arange") == 0) CHECK(((float *)first)[PK_N - 1] == PK_N - 1);
    if (strcmp(kinds[k], "full") == 0) CHECK(((float *)first)[PK_N - 1] == 2.5f);
  }
}

/* The four checks above as tests on a connection of their own to
 * pk_socket: PK_RUN_FILL_TESTS() runs them. */
static const char *pk_socket;

TEST(a_written_result_skips_the_fill) {
  OPEN_CLIENT(c, pk_socket);
  pk_written_result_skips_the_fill(c);
  st_client_close(c);
}

TEST(zeros_never_show_old_bytes) {
  OPEN_CLIENT(c, pk_socket);
  pk_zeros_never_show_old_bytes(c);
  st_client_close(c);
}

TEST(stashed_region_tensors_end_with_their_call) {
  OPEN_CLIENT(c, pk_socket);
  pk_stashed_region_tensors_end_with_their_call(c);
  st_client_close(c);
}

TEST(empty_shows_only_own_bytes) {
  OPEN_CLIENT(c, pk_socket);
  pk_empty_shows_only_own_bytes(c, pk_socket);
  st_client_close(c);
}

TEST(written_makers_write_every_byte) {
  OPEN_CLIENT(c, pk_socket);
  pk_written_makers_write_every_byte(c);
  st_client_close(c);
}

#define PK_RUN_FILL_TESTS()                                          \
  do {                                                               \
    RUN(a_written_result_skips_the_fill);                            \
    RUN(zeros_never_show_old_bytes);                                 \
    RUN(empty_shows_only_own_bytes);                                 \
    RUN(written_makers_write_every_byte);                            \
    RUN(stashed_region_tensors_end_with_their_call);                 \
  } while (0)

#endif

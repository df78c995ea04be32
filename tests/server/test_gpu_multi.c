/* Two GPUs behind one server (docs/cuda.md, "Which device a call builds
 * on"): a server with devices = {0, 1} listens on <base>-0.sock and
 * <base>-1.sock, and an endpoint with device = "cuda" builds on the
 * socket's device. A raw client checks, for each socket, that the reply's
 * arena names the UUID of that GPU (cuDeviceGetUuid through
 * st__cuda_device_uuid), imports it with st__cuda_import on the right
 * ordinal, and reads the same values from both GPUs. Also: a cached
 * endpoint keeps one entry per device, an endpoint pinned to "cuda:1"
 * builds there whatever the socket, a copy from cuda:0 to cuda:1 in a body
 * lands on GPU 1 with the same bytes, and both devices have a budget.
 * Skipped (77) with fewer than 2 CUDA devices. */
#include <signal.h>

#include "check.h"
#include "mem/cuda.h"
#include "wire.h"
#include "st/dtype.h"
#include "st/wire.h"

static char uuid[2][ST_CUDA_UUID_LEN];

#ifdef ST_HAVE_CUDA

static stt_server_t S;
static char sock1[340];

/* Arena i of a reply, imported in this process. */
typedef struct imported {
  st__arena_desc_t d;
  st__cuda_mapping_t m;
} imported_t;

static int import_arena(rc_t *c, const msg_t *m, uint32_t i, imported_t *out) {
  memset(out, 0, sizeof *out);
  const msgpack_object *a = obj_get(m->result, "arenas");
  char err[512];
  if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size <= i ||
      st__parse_arena(&a->via.array.ptr[i], &out->d, err, sizeof err) != ST_OK ||
      (int)out->d.fd >= c->nfds || !out->d.cuda) {
    fprintf(stderr, "   arena %u: missing, unparsable or not CUDA\n", i);
    return -1;
  }
  if (st__cuda_import(c->fds[out->d.fd], out->d.bytes, out->d.uuid, &out->m, err,
                      sizeof err) != ST_OK) {
    fprintf(stderr, "   import: %s\n", err);
    return -1;
  }
  return 0;
}

/* The bytes of tensor `ext` (contiguous) from its imported arena;
 * malloc'ed, *len set. */
static unsigned char *tensor_bytes(const msgpack_object *ext, const imported_t *arenas, int n,
                                   size_t *len) {
  st__tensor_desc_t d;
  char err[256];
  if (!ext || ext->type != MSGPACK_OBJECT_EXT ||
      st__parse_tensor(ext, &d, err, sizeof err) != ST_OK || (int)d.arena >= n)
    return NULL;
  const imported_t *a = &arenas[d.arena];
  *len = (size_t)st__tensor_numel(&d) * st_dtype_size(d.dtype);
  if (d.offset + *len > a->m.bytes) return NULL;
  unsigned char *buf = malloc(*len + 1);
  if (buf && st__cuda_copy_to_host(buf, a->m.dptr + d.offset, *len, a->m.ordinal, err,
                                   sizeof err) != ST_OK) {
    fprintf(stderr, "   copy: %s\n", err);
    free(buf);
    return NULL;
  }
  return buf;
}

/* The value of reply m, whose one arena must be a VMM allocation on the
 * GPU of socket s (its UUID, imported on ordinal s), copied to the host:
 * *bytes (malloc'ed) and *len. The descriptors are dropped. */
static void value_on_gpu(rc_t *c, const msg_t *m, int s, unsigned char **bytes, size_t *len) {
  imported_t a;
  CHECK(import_arena(c, m, 0, &a) == 0);
  *bytes = tensor_bytes(obj_get(m->result, "value"), &a, 1, len);
  /* The ordinal it was imported on, read before st__cuda_unmap clears
   * the mapping (and sets its ordinal to -1). */
  int ordinal = a.m.ordinal;
  st__cuda_unmap(&a.m);
  rc_drop_fds(c);
  CHECK_STR_EQ(a.d.uuid, uuid[s]);
  CHECK_STR_EQ(a.d.backend, "vmm");
  CHECK_EQ_INT(ordinal, s);
  CHECK(*bytes != NULL);
}

/* hello on each socket names its own device index. */
TEST(each_socket_is_its_device) {
  const char *socks[2] = {S.socket, sock1};
  for (int s = 0; s < 2; s++) {
    OPEN_RC(c, socks[s]);
    msg_t m;
    CHECK(rc_rpcf(&c, &m, "[0, 1, 'hello', []]") == 1 && !m.error);
    CHECK_EQ_INT(obj_int(obj_get(m.result, "device")), s);
    msg_free(&m);
    rc_close(&c);
  }
}

/* device = "cuda": socket S builds on GPU S; the values agree. */
TEST(socket_selects_the_gpu) {
  const char *socks[2] = {S.socket, sock1};
  unsigned char *bytes[2] = {NULL, NULL};
  size_t len[2] = {0, 0};
  for (int s = 0; s < 2; s++) {
    OPEN_RC(c, socks[s]);
    msg_t m;
    CHECK(rc_call(&c, "where", NULL, 0, &m) == 1 && !m.error);
    value_on_gpu(&c, &m, s, &bytes[s], &len[s]);
    msg_free(&m);
    rc_close(&c);
  }
  CHECK_EQ_INT(len[0], 4096 * 4);
  CHECK(len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0);
  const float *f = (const float *)bytes[0];
  for (int k = 0; k < 4096; k++) CHECK(f[k] == (float)k);
  free(bytes[0]);
  free(bytes[1]);
}

/* A cached endpoint keeps one entry per device: two objects, each on its
 * socket's GPU, with equal bytes (the same seed on both). */
TEST(cache_entry_per_device) {
  const char *socks[2] = {S.socket, sock1};
  unsigned char *bytes[2] = {NULL, NULL};
  size_t len[2] = {0, 0};
  int64_t oid[2];
  for (int s = 0; s < 2; s++) {
    OPEN_RC(c, socks[s]);
    msg_t m;
    CHECK(rc_call(&c, "cached", NULL, 0, &m) == 1 && !m.error);
    oid[s] = obj_field(&m, "id");
    CHECK_EQ_INT(obj_field(&m, "cached"), 1);
    char want[16];
    snprintf(want, sizeof want, "cuda:%d", s);
    CHECK_STR_EQ(obj_str(obj_get(obj_get(m.result, "object"), "device")), want);
    value_on_gpu(&c, &m, s, &bytes[s], &len[s]);
    msg_free(&m);
    /* A second call on the same socket hits that device's entry. */
    CHECK(rc_call(&c, "cached", NULL, 0, &m) == 1 && !m.error);
    CHECK_EQ_INT(obj_field(&m, "id"), oid[s]);
    rc_drop_fds(&c);
    msg_free(&m);
    rc_close(&c);
  }
  CHECK(oid[0] != oid[1]);
  CHECK(len[0] > 0 && len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0);
  free(bytes[0]);
  free(bytes[1]);
  OPEN_RC(c, S.socket);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cuda:0.objects"), 1);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cuda:1.objects"), 1);
  CHECK(rc_info_int(&c, "memory.cuda:1.budget") > 0);
  CHECK(rc_info_int(&c, "memory.cuda:1.free_bytes") > 0);
  rc_close(&c);
}

/* device = "cuda:1" builds on GPU 1 from socket 0; a body on cuda:0 that
 * copies to cuda:1 returns one arena on each GPU with equal bytes. */
TEST(named_device_and_copy_between_gpus) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_call(&c, "on1", NULL, 0, &m) == 1 && !m.error);
  imported_t a;
  CHECK(import_arena(&c, &m, 0, &a) == 0);
  CHECK_STR_EQ(a.d.uuid, uuid[1]);
  CHECK_EQ_INT(a.m.ordinal, 1);
  st__cuda_unmap(&a.m);
  rc_drop_fds(&c);
  msg_free(&m);

  CHECK(rc_call(&c, "xdev", NULL, 0, &m) == 1 && !m.error);
  const msgpack_object *arenas = obj_get(m.result, "arenas");
  CHECK(arenas && arenas->via.array.size == 2);
  imported_t two[2];
  CHECK(import_arena(&c, &m, 0, &two[0]) == 0);
  CHECK(import_arena(&c, &m, 1, &two[1]) == 0);
  const msgpack_object *v = obj_get(m.result, "value");
  size_t la = 0, lb = 0;
  unsigned char *ba = tensor_bytes(obj_get(v, "a"), two, 2, &la);
  unsigned char *bb = tensor_bytes(obj_get(v, "b"), two, 2, &lb);
  CHECK(ba && bb);
  st__tensor_desc_t da, db;
  char err[256];
  CHECK(st__parse_tensor(obj_get(v, "a"), &da, err, sizeof err) == ST_OK);
  CHECK(st__parse_tensor(obj_get(v, "b"), &db, err, sizeof err) == ST_OK);
  CHECK_STR_EQ(two[da.arena].d.uuid, uuid[0]);
  CHECK_STR_EQ(two[db.arena].d.uuid, uuid[1]);
  CHECK_EQ_INT(two[db.arena].m.ordinal, 1);
  CHECK(la == 100000 * 2 && la == lb && memcmp(ba, bb, la) == 0);
  free(ba);
  free(bb);
  st__cuda_unmap(&two[0].m);
  st__cuda_unmap(&two[1].m);
  rc_drop_fds(&c);
  msg_free(&m);
  rc_close(&c);
}

static const char ENDPOINTS[] =
    "return {\n"
    "  st.endpoint{ name = 'where', device = 'cuda',\n"
    "    build = function() return st.arange{4096, dtype = 'float32'} end },\n"
    "  st.endpoint{ name = 'cached', device = 'cuda', cache = true,\n"
    "    build = function() return st.randn{100003, seed = 5} end },\n"
    "  st.endpoint{ name = 'on1', device = 'cuda:1',\n"
    "    build = function() return st.ones{16} end },\n"
    "  st.endpoint{ name = 'xdev', device = 'cuda:0', build = function()\n"
    "    local a = st.randn{100000, seed = 8, dtype = 'bfloat16'}\n"
    "    local b = a:to('cuda:1')\n"
    "    assert(b:device() == 'cuda:1')\n"
    "    return { a = a, b = b } end },\n"
    "}\n";

#endif /* ST_HAVE_CUDA */

int main(void) {
  char why[512];
  int n = 0;
  if (st__cuda_device_count(&n, why, sizeof why) != ST_OK) {
    char msg[600];
    snprintf(msg, sizeof msg, "needs 2 CUDA devices (%s)", why);
    stt_skip(msg);
  }
  if (n < 2) {
    char msg[96];
    snprintf(msg, sizeof msg, "needs 2 CUDA devices (%d visible)", n);
    stt_skip(msg);
  }
  for (int i = 0; i < 2; i++)
    if (st__cuda_device_uuid(i, uuid[i], why, sizeof why) != ST_OK) {
      fprintf(stderr, "uuid of device %d: %s\n", i, why);
      return 1;
    }
#ifdef ST_HAVE_CUDA
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "devices = {0, 1}, workers = 2,",
                   (const stt_endpoint_t[]){{"multi.lua", ENDPOINTS}, {NULL, NULL}});
  snprintf(sock1, sizeof sock1, "%s-1.sock", S.base);
  RUN(each_socket_is_its_device);
  RUN(socket_selects_the_gpu);
  RUN(cache_entry_per_device);
  RUN(named_device_and_copy_between_gpus);
  return stt_server_finish(&S);
#endif
  return stt_summary();
}

/* Endpoints with ipc = "legacy" (docs/cuda.md, "Legacy CUDA IPC";
 * docs/protocol.md, "Legacy CUDA IPC arenas"; docs/security.md).
 *
 * A real server builds a module on the GPU into one dedicated legacy
 * allocation. Over the raw socket the test checks the wire (backend
 * "legacy", no descriptor and no "fd" key, a 64-byte ipc_handle,
 * device_index, storage_bytes, 256-aligned offsets), then hands those
 * fields to tests/server/legacy_reopen.py, which reopens every tensor with
 * PyTorch's rebuild_cuda_tensor; its bytes must equal what the same
 * endpoint built with device = "cpu" (mapped from its memfd). The C client
 * (through stcli) refuses a legacy arena with CAPABILITY; the object counts
 * against memory.cuda:0 while leased; after release the allocation is
 * freed and device memory is back at its baseline.
 *
 * Skipped (77) without a CUDA device, or without python3 + torch with CUDA.
 */
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"
#include "mem/cuda.h"
#include "wire.h"
#include "st/dtype.h"
#include "st/wire.h"

#define MiB (1024ll * 1024ll)


#ifdef ST_HAVE_CUDA
#include "gpu_kit.h"

static stt_server_t S;

/* ------------------------------------------------------------- helpers */

/* Runs argv (execvp) with stdout captured into out[cap] (NUL-terminated);
 * stderr goes to the test's. Returns the exit status, or -1. Waits at
 * most timeout_ms. */
static int run_capture(char *const *argv, char *out, size_t cap, int timeout_ms) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(p[1]);
  size_t n = 0;
  double end = stt_now_ms() + timeout_ms;
  for (;;) {
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    int left = (int)(end - stt_now_ms());
    if (left <= 0 || poll(&pf, 1, left) <= 0) {
      kill(pid, SIGKILL);
      break;
    }
    ssize_t k = read(p[0], out + n, cap - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
    if (n == cap - 1) break;
  }
  out[n] = '\0';
  close(p[0]);
  int status;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int python_has_cuda_torch(void) {
  char *argv[] = {"python3", "-c",
                  "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)", NULL};
  char out[256];
  return run_capture(argv, out, sizeof out, 120000) == 0;
}

/* Distance in units of the last place for floats (0 for equal bytes). */
static int64_t ulps(st_dtype_t dt, const unsigned char *a, const unsigned char *b) {
  size_t es = st_dtype_size(dt);
  if (memcmp(a, b, es) == 0) return 0;
  if (dt == ST_DTYPE_FLOAT32) {
    int32_t x, y;
    memcpy(&x, a, 4);
    memcpy(&y, b, 4);
    return (x ^ y) < 0 ? INT64_MAX : llabs((int64_t)x - y);
  }
  return INT64_MAX;
}

/* A tensor of the CPU reply, contiguous in host memory. */
typedef struct host {
  st__tensor_desc_t d;
  unsigned char *data;
  size_t bytes;
} host_t;

/* Copies tensor `ext` of a reply whose arena 0 is mapped at `base`. */
static int fetch_cpu(const void *base, uint64_t arena_bytes, const msgpack_object *ext,
                     host_t *h) {
  memset(h, 0, sizeof *h);
  char err[256];
  uint64_t lo, hi;
  if (st__parse_tensor(ext, &h->d, err, sizeof err) != ST_OK ||
      st__tensor_extent(&h->d, &lo, &hi) != ST_OK || hi > arena_bytes)
    return -1;
  size_t es = st_dtype_size(h->d.dtype);
  int64_t n = st__tensor_numel(&h->d);
  h->bytes = (size_t)n * es;
  h->data = malloc(h->bytes + 1);
  if (!h->data) return -1;
  int64_t idx[ST_MAX_NDIM] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int j = 0; j < h->d.ndim; j++) off += idx[j] * h->d.strides[j];
    memcpy(h->data + (size_t)k * es, (const char *)base + h->d.offset + (uint64_t)off * es, es);
    for (int j = h->d.ndim - 1; j >= 0; j--) {
      if (++idx[j] < h->d.shape[j]) break;
      idx[j] = 0;
    }
  }
  return 0;
}

static void hex_of(const unsigned char *b, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

static int unhex(const char *s, size_t n, unsigned char *out) {
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (unsigned char)v;
  }
  return 0;
}

/* "1,2,3" of n integers. */
static void join(const int64_t *v, int n, char *out, size_t cap) {
  size_t k = 0;
  out[0] = '\0';
  for (int i = 0; i < n && k < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, "%s%lld", i ? "," : "", (long long)v[i]);
}

static uint64_t baseline_free;

/* ------------------------------------------------------------- tests */

/* The reply of a legacy endpoint: one arena, no descriptor, every legacy
 * field; the object is managed and charged to memory.cuda:0. */
TEST(legacy_arena_on_the_wire) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_call(&c, "leg_gpu", NULL, 0, &m) == 1 && !m.error);
  CHECK_EQ_INT(c.nfds, 0);                       /* nothing passed by SCM_RIGHTS */
  const msgpack_object *arenas = obj_get(m.result, "arenas");
  CHECK(arenas && arenas->type == MSGPACK_OBJECT_ARRAY && arenas->via.array.size == 1);
  const msgpack_object *a = &arenas->via.array.ptr[0];
  CHECK(obj_get(a, "fd") == NULL);
  CHECK_STR_EQ(obj_str(obj_get(a, "backend")), "legacy");
  CHECK_STR_EQ(obj_str(obj_get(a, "device")), "cuda");
  char uuid[ST_CUDA_UUID_LEN];
  CHECK(st__cuda_device_uuid(0, uuid, NULL, 0) == ST_OK);
  CHECK_STR_EQ(obj_str(obj_get(a, "uuid")), uuid);
  const msgpack_object *h = obj_get(a, "ipc_handle");
  CHECK(h && h->type == MSGPACK_OBJECT_BIN && h->via.bin.size == 64);
  int nonzero = 0;
  for (uint32_t i = 0; h && i < h->via.bin.size; i++) nonzero |= h->via.bin.ptr[i];
  CHECK(nonzero);
  CHECK_EQ_INT(obj_int(obj_get(a, "device_index")), 0);
  st__arena_desc_t d;
  char err[256];
  CHECK(st__parse_arena(a, &d, err, sizeof err) == ST_OK);
  CHECK(d.legacy && d.cuda);
  uint64_t gran = 0;
  st__cuda_granularity(0, &gran, NULL, 0);
  CHECK(gran > 0 && d.bytes % gran == 0);
  CHECK(d.storage_bytes > 0 && d.storage_bytes <= d.bytes);
  msgpack_unpacked pl;
  const msgpack_object *tensors, *meta;
  CHECK(st__parse_module(obj_get(m.result, "value"), &pl, &tensors, &meta, err, sizeof err) ==
        ST_OK);
  CHECK_EQ_INT(tensors->via.array.size, 4);
  for (uint32_t i = 0; i < tensors->via.array.size; i++) {
    st__tensor_desc_t t;
    uint64_t lo, hi;
    CHECK(st__parse_tensor(&tensors->via.array.ptr[i].via.array.ptr[1], &t, err, sizeof err) ==
          ST_OK);
    CHECK_EQ_INT(t.arena, 0);
    CHECK_EQ_INT(t.offset % 256, 0);
    CHECK(st__tensor_extent(&t, &lo, &hi) == ST_OK && hi <= d.storage_bytes);
  }
  msgpack_unpacked_destroy(&pl);
  const msgpack_object *o = obj_get(m.result, "object");
  CHECK(o && obj_get(o, "managed") && obj_get(o, "managed")->via.boolean);
  CHECK_STR_EQ(obj_str(obj_get(o, "device")), "cuda:0");
  int64_t oid = obj_field(&m, "id");
  CHECK_EQ_INT(rc_info_int(&c, "memory.cuda:0.leased_bytes"), (int64_t)d.bytes);
  msg_free(&m);
  CHECK(rk_id(&c, "release", "object_id", (uint64_t)oid, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "destroyed")), 1);
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cuda:0.leased_bytes"), 0);
  CHECK(rc_wait_info(&c, "arenas.count", 0, 10000) == 0);
  rc_close(&c);
}

/* PyTorch reopens every tensor of the module from the handle and gets the
 * CPU endpoint's values (randn within the 2-ulp tolerance of docs/cuda.md). */
TEST(pytorch_reopens_the_module) {
  rc_t c, c2;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(rc_open(&c2, S.socket) == 0);
  msg_t mg, mc;
  CHECK(rc_call(&c, "leg_gpu", NULL, 0, &mg) == 1 && !mg.error);
  CHECK(rc_call(&c2, "leg_cpu", NULL, 0, &mc) == 1 && !mc.error);
  /* The CPU object of a legacy endpoint is a plain memfd arena. */
  CHECK_EQ_INT(c2.nfds, 1);
  st__arena_desc_t dg, dc;
  char err[256];
  CHECK(st__parse_arena(&obj_get(mg.result, "arenas")->via.array.ptr[0], &dg, err,
                        sizeof err) == ST_OK);
  CHECK(st__parse_arena(&obj_get(mc.result, "arenas")->via.array.ptr[0], &dc, err,
                        sizeof err) == ST_OK);
  CHECK(!dc.legacy && !dc.cuda && dc.fd == 0);
  void *cpu = mmap(NULL, dc.bytes, PROT_READ, MAP_SHARED, c2.fds[0], 0);
  CHECK(cpu != MAP_FAILED);

  msgpack_unpacked pg, pc;
  const msgpack_object *tg, *tc, *meta;
  CHECK(st__parse_module(obj_get(mg.result, "value"), &pg, &tg, &meta, err, sizeof err) == ST_OK);
  CHECK(st__parse_module(obj_get(mc.result, "value"), &pc, &tc, &meta, err, sizeof err) == ST_OK);
  uint32_t n = tg->via.array.size;
  CHECK(n == 4 && tc->via.array.size == n);

  /* argv: python3 script handle device storage uuid name:dtype:off:shape:strides... */
  char script[1024], handle[2 * ST_IPC_HANDLE_LEN + 1], devs[16], storage[32];
  const char *src = getenv("ST_SOURCE_DIR");
  snprintf(script, sizeof script, "%s/tests/server/legacy_reopen.py", src ? src : ".");
  hex_of(dg.ipc_handle, ST_IPC_HANDLE_LEN, handle);
  snprintf(devs, sizeof devs, "%d", (int)dg.device_index);
  snprintf(storage, sizeof storage, "%llu", (unsigned long long)dg.storage_bytes);
  char specs[4][512];
  char *argv[16] = {"python3", script, handle, devs, storage, dg.uuid};
  int argc = 6;
  st__tensor_desc_t td[4];
  for (uint32_t i = 0; i < n && i < 4; i++) {
    const msgpack_object *name = &tg->via.array.ptr[i].via.array.ptr[0];
    CHECK(st__parse_tensor(&tg->via.array.ptr[i].via.array.ptr[1], &td[i], err, sizeof err) ==
          ST_OK);
    char shape[128], strides[128];
    join(td[i].shape, td[i].ndim, shape, sizeof shape);
    join(td[i].strides, td[i].ndim, strides, sizeof strides);
    snprintf(specs[i], sizeof specs[i], "%.*s:%s:%llu:%s:%s", (int)name->via.str.size,
             name->via.str.ptr, st_dtype_name(td[i].dtype), (unsigned long long)td[i].offset,
             shape, strides);
    argv[argc++] = specs[i];
  }
  argv[argc] = NULL;
  static char out[1 << 20];
  int status = run_capture(argv, out, sizeof out, 180000);
  CHECK_EQ_INT(status, 0);

  int seen = 0;
  for (uint32_t i = 0; i < n && i < 4; i++) {
    host_t h;
    CHECK(fetch_cpu(cpu, dc.bytes, &tc->via.array.ptr[i].via.array.ptr[1], &h) == 0);
    const msgpack_object *name = &tg->via.array.ptr[i].via.array.ptr[0];
    char want[96];
    snprintf(want, sizeof want, "T %.*s ", (int)name->via.str.size, name->via.str.ptr);
    const char *line = strstr(out, want);
    CHECK(line != NULL);
    if (!line) {
      free(h.data);
      continue;
    }
    int dev = -1, is_cuda = 0, used = 0;
    double sum = 0;
    CHECK(sscanf(line + strlen(want), "%d %d %lf %n", &dev, &is_cuda, &sum, &used) == 3);
    CHECK_EQ_INT(is_cuda, 1);
    const char *hex = line + strlen(want) + used;
    size_t hexlen = strcspn(hex, "\n");
    CHECK_EQ_INT(hexlen, 2 * h.bytes);
    unsigned char *got = malloc(h.bytes + 1);
    CHECK(got && hexlen == 2 * h.bytes && unhex(hex, h.bytes, got) == 0);
    size_t es = st_dtype_size(h.d.dtype);
    int64_t worst = 0;
    for (size_t k = 0; got && hexlen == 2 * h.bytes && k < h.bytes / es; k++) {
      int64_t u = ulps(h.d.dtype, got + k * es, h.data + k * es);
      if (u > worst) worst = u;
    }
    if (worst > 2) fprintf(stderr, "   %s: worst %lld ulp\n", want, (long long)worst);
    CHECK(worst <= 2);
    free(got);
    free(h.data);
    seen++;
  }
  CHECK_EQ_INT(seen, 4);
  msgpack_unpacked_destroy(&pg);
  msgpack_unpacked_destroy(&pc);
  munmap(cpu, dc.bytes);
  rc_drop_fds(&c2);
  /* The lease ends with the connection: the server frees the allocation. */
  msg_free(&mg);
  msg_free(&mc);
  rc_close(&c);
  rc_close(&c2);
}

/* libstclient maps VMM memory only: a legacy arena is CAPABILITY with the
 * way out, and the call leaves nothing behind in the server. */
TEST(c_client_refuses_legacy_arenas) {
  const char *cli = getenv("ST_CLI_BIN");
  CHECK(cli != NULL);
  if (!cli) return;
  /* stderr of stcli into stdout, so that the message is captured. */
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "exec '%s' --socket '%s' call leg_gpu 2>&1", cli, S.socket);
  char *argv[] = {"sh", "-c", cmd, NULL};
  static char out[16384];
  int status = run_capture(argv, out, sizeof out, 60000);
  CHECK_EQ_INT(status, 1);
  CHECK_CONTAINS(out, "CAPABILITY");
  CHECK_CONTAINS(out,
                 "legacy CUDA IPC arenas are for PyTorch's rebuild_cuda_tensor; use ipc = vmm");
  OPEN_RC(c, S.socket);
  CHECK(rc_wait_info(&c, "objects.count", 0, 10000) == 0);
  rc_close(&c);
}

/* A legacy endpoint whose result holds VMM memory is refused; the same
 * tensor copied into a module goes out as a legacy arena. */
TEST(vmm_memory_in_a_legacy_result_is_refused) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_call(&c, "leg_vmm", NULL, 0, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_ENDPOINT, "not a legacy IPC allocation");
  msg_free(&m);
  CHECK(rc_call(&c, "leg_copied", NULL, 0, &m) == 1 && !m.error);
  CHECK_EQ_INT(c.nfds, 0);
  CHECK_STR_EQ(obj_str(obj_get(&obj_get(m.result, "arenas")->via.array.ptr[0], "backend")),
               "legacy");
  msg_free(&m);
  rc_close(&c);
}

/* Every legacy allocation was freed: no arena left, and the device's free
 * memory is back at its baseline within one granule. */
TEST(device_memory_back_to_baseline) {
  OPEN_RC(c, S.socket);
  CHECK(rc_wait_info(&c, "objects.count", 0, 10000) == 0);
  CHECK(rc_wait_info(&c, "arenas.count", 0, 10000) == 0);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cuda:0.leased_bytes"), 0);
  CHECK(gk_wait_back_to(baseline_free, 10000) == 0);
  rc_close(&c);
}


static const char LEGACY[] =
    "local function mod()\n"
    "  return st.module({ { 'weight', st.randn{16, 8, seed = 3} },\n"
    "                     { 'bias', st.arange{16} },\n"
    "                     { 'half', st.arange{0, 3, 0.25, dtype = 'float16'} },\n"
    "                     { 'cols', st.arange{24, dtype = 'int32'}:view{4, 6}:slice(1, 0, 6, 2) } },\n"
    "                   { arch = 'legacy' })\n"
    "end\n"
    "return { st.endpoint{ name = 'leg_gpu', device = 'cuda', ipc = 'legacy', managed = true,\n"
    "                      build = mod },\n"
    "         st.endpoint{ name = 'leg_cpu', device = 'cpu', ipc = 'legacy', build = mod } }\n";

/* A checkpoint loads into a VMM arena: returned as is from a legacy
 * endpoint it is refused; copied into a module it is a legacy arena. */
static const char LEGACY_VMM[] =
    "return { st.endpoint{ name = 'leg_vmm', device = 'cuda', ipc = 'legacy',\n"
    "  build = function() return st.load_safetensors('w.safetensors') end },\n"
    "  st.endpoint{ name = 'leg_copied', device = 'cuda', ipc = 'legacy', managed = true,\n"
    "  build = function() local m = st.load_safetensors('w.safetensors')\n"
    "    return st.module{ w = m.w } end } }\n";

/* <dir>/data/w.safetensors: one float32 tensor "w" = {1, 2, 3, 4}. */
static void write_checkpoint(const stt_server_t *s) {
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/data", s->dir);
  if (mkdir(dir, 0700) != 0) abort();
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
  char padded[64];
  snprintf(padded, sizeof padded, "%-56s", hdr);
  uint64_t n = strlen(padded);
  float v[4] = {1, 2, 3, 4};
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
  fwrite(len, 1, 8, f);
  fwrite(padded, 1, n, f);
  fwrite(v, 1, sizeof v, f);
  fclose(f);
}

#endif /* ST_HAVE_CUDA */

int main(void) {
  char why[512];
  if (st__cuda_available(why, sizeof why) != ST_OK) stt_skip(why);
#ifdef ST_HAVE_CUDA
  if (!python_has_cuda_torch()) stt_skip("python3 with torch and CUDA is not available");
  signal(SIGPIPE, SIG_IGN);
  /* The memory check compares free device memory with a baseline taken
   * after the first call. With lazy module loading (the CUDA default), a
   * kernel's first launch later in the run loads its code into device
   * memory for good, which is not a leak: load every kernel up front. */
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  stt_server_init(&S);
  stt_write_endpoint(&S, "legacy.lua", LEGACY);
  stt_write_endpoint(&S, "legacy_vmm.lua", LEGACY_VMM);
  write_checkpoint(&S);
  char cfg[700];
  /* One worker: its stream (and the device state that comes with it) is
   * made by the first call, before the memory baseline is taken. */
  snprintf(cfg, sizeof cfg, "data_dirs = { '%s/data' }, workers = 1,", S.dir);
  stt_server_config(&S, cfg);
  stt_server_start_or_exit(&S);
  RUN(legacy_arena_on_the_wire);
  baseline_free = gk_free();
  RUN(pytorch_reopens_the_module);
  fprintf(stderr, "   free vs baseline: %+lld bytes\n", (long long)(gk_free() - baseline_free));
  RUN(c_client_refuses_legacy_arenas);
  fprintf(stderr, "   free vs baseline: %+lld bytes\n", (long long)(gk_free() - baseline_free));
  RUN(vmm_memory_in_a_legacy_result_is_refused);
  fprintf(stderr, "   free vs baseline: %+lld bytes\n", (long long)(gk_free() - baseline_free));
  RUN(device_memory_back_to_baseline);
  return stt_server_finish(&S);
#endif
  return stt_summary();
}

/* Published keys of CUDA memory (docs/keys.md) through libstclient against
 * a real stserver, readers and publishers in processes of their own (this
 * program run again with --child: a fork cannot use the parent's CUDA):
 *   - a put of st_tensor_alloc("cuda:0") memory is that memory: a reader
 *     in another process reads it and its write shows in the publisher's
 *     allocation;
 *   - the publisher SIGKILLed: its device memory stays readable;
 *   - a read-only get maps with read access only: the reader's write
 *     fails (or kills the reader), the data and the server are unharmed.
 * A put keeps each allocation's descriptor and makes no driver import
 * (mem/arena.h); the server imports and maps an allocation the first time
 * it reads it. Each key below
 * is made of a fresh allocation the server never mapped before the read:
 *   - an endpoint reads it with st.key (the first mapping, on a worker):
 *     the publisher's values, and its in-place write (mul_) lands in the
 *     publisher's allocation; a second call finds the mapping made;
 *   - a `contiguous` view of a strided window of it (a copy on the
 *     server's GPU, the first mapping) holds the publisher's values;
 *   - the publisher killed above: the server's handle alone kept the
 *     memory, and the server's first mapping of it, made afterwards,
 *     reads the values;
 *   - a descriptor claiming twice its allocation's size: the put is taken
 *     (the driver cannot tell the size without mapping), every read that
 *     maps it fails cleanly with the mapping's reason (st.key returns nil
 *     and "mapping imported CUDA allocation ... cuMemMap ...", a
 *     contiguous view is an error reply, a client's get fails to map it),
 *     and the server carries on;
 *   - a descriptor that is no CUDA allocation (a memfd sent as "vmm") is
 *     still refused at the put (an fstat; the CPU host's test:
 *     test_key_release.c);
 *   - versions of fresh allocations the publisher freed, pushed out by
 *     later puts, and the key deleted: the loop hands every final release (the close of the
 *     server's descriptor, the unmap of what it mapped) to the releaser
 *     (info arenas.released_off_loop), and right after info (which
 *     settles) the server's descriptors and arenas are back at the start,
 *     without polling.
 * (The CPU path: test_keys.c; what runs without a GPU of the server's
 * mapping: tests/lua/test_key_map.c.) Exit 77 without a CUDA device. */
#include <signal.h>
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"
#include "handoff_kit.h"
#include "mem/cuda.h"
#include "wire.h"

#include "../server/gpu_kit.h"

#ifdef ST_HAVE_CUDA

#define N 4096

/* st.key(a.key): element a.i read before w is multiplied in place by a.k;
 * "nil: <why>" when st.key returns nil. */
static const stt_endpoint_t endpoints[] = {
    {"keyread.lua",
     "return st.endpoint{ name = 'keyread', params = { key = 'x', i = 0, k = 1 },\n"
     "  build = function(a)\n"
     "    local v, e = st.key(a.key)\n"
     "    if v == nil then return 'nil: ' .. e end\n"
     "    local x = v.w:get(a.i)\n"
     "    if a.k ~= 1 then v.w:mul_(a.k) end\n"
     "    return x end }\n"},
    {NULL, NULL}};

static stt_server_t srv;
static st_client_t *cli;

/* A cuda:0 float32 tensor of N elements i * scale (NULL on failure). */
static st_result_t *counting(float scale) {
  int64_t n = N;
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 1, &n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
    return NULL;
  }
  static float h[N];
  for (int i = 0; i < N; i++) h[i] = (float)i * scale;
  const st_tensor_t *t = st_result_tensor(r, 0);
  if (st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, h, t->nbytes, 0, err, sizeof err) !=
      ST_OK) {
    fprintf(stderr, "   fill: %s\n", err);
    st_result_free(r);
    return NULL;
  }
  return r;
}

/* Element i of a float32 tensor of at most N elements (-1 when it cannot
 * be read). */
static float elem(const st_tensor_t *t, int64_t i) {
  static float h[N];
  if (!t || t->numel > N || i >= t->numel) return -1.0f;
  return st_tensor_copy_to_host(t, h, (size_t)t->numel * sizeof *h) == ST_OK ? h[i] : -1.0f;
}

static int put(st_client_t *c, const char *key, const st_tensor_t *t) {
  st_args_t *a = st_args_new();
  char err[256];
  int rc = st_args_tensor(a, "w", t, err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(c, key, a, ST_KEY_PINNED, 0, NULL);
  if (rc != ST_OK) fprintf(stderr, "   put %s: %s %s\n", key, err, st_client_error(c));
  st_args_free(a);
  return rc;
}

/* keyread {key, i, k}: the element as a number in *x, or the string the
 * endpoint returned in why[] (then *x is -1). The call's status. */
static int keyread(const char *key, int64_t i, int64_t k, double *x, char *why, size_t len) {
  st_args_t *a = st_args_new();
  st_args_string(a, "key", key);
  st_args_int(a, "i", i);
  st_args_int(a, "k", k);
  st_result_t *r = NULL;
  int rc = st_client_call(cli, "keyread", a, &r);
  st_args_free(a);
  *x = -1;
  if (why && len) why[0] = '\0';
  const st_value_t *v = rc == ST_OK ? st_result_value(r) : NULL;
  if (v && v->kind == ST_VALUE_FLOAT) *x = v->as.number;
  if (v && v->kind == ST_VALUE_INT) *x = (double)v->as.integer;
  if (v && v->kind == ST_VALUE_STRING && why)
    snprintf(why, len, "%.*s", (int)v->as.str.len, v->as.str.ptr);
  if (rc != ST_OK) fprintf(stderr, "   keyread %s: %s\n", key, st_client_error(cli));
  st_result_free(r);
  return rc;
}

/* --child MODE SOCKET: one reader or publisher; exit 0 when it did what
 * MODE says (a read-only write that fails exits 0 too). */
static int child(const char *mode, const char *sock) {
  st_client_t *c = stt_client_open(sock);
  if (!c) return 90;
  st_result_t *r = NULL;
  if (strcmp(mode, "publish_and_die") == 0) {
    st_result_t *a = counting(3.0f);
    if (!a || put(c, "orphan", st_result_tensor(a, 0)) != ST_OK) return 91;
    kill(getpid(), SIGKILL);
  }
  int ro = strcmp(mode, "write_ro") == 0;
  if (st_client_get(c, "g", 0, ro ? ST_GET_READONLY : 0, &r, NULL) != ST_OK) return 92;
  const st_tensor_t *w = st_result_find(r, "w");
  if (!w || elem(w, 7) != 7.0f) return 93;
  float v = 42.0f;
  char err[256];
  int rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)w->data + 5 * sizeof v, &v, sizeof v, 0,
                                   err, sizeof err);
  if (ro) return rc == ST_OK ? 94 : 0;   /* a write through read access fails */
  return rc == ST_OK ? 0 : 95;
}

/* Runs this program with --child MODE; its exit code, or -signal. */
static int run_child(const char *mode) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    execl("/proc/self/exe", "test_gpu_keys", "--child", mode, srv.socket, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1000;
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

TEST(a_put_of_device_memory_is_that_memory) {
  st_result_t *a = counting(1.0f);
  CHECK(a);
  CHECK_EQ_INT(put(cli, "g", st_result_tensor(a, 0)), ST_OK);
  CHECK_EQ_INT(run_child("write"), 0);
  CHECK(elem(st_result_tensor(a, 0), 5) == 42.0f);   /* the reader wrote our memory */
  st_result_free(a);   /* the key keeps it */
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "g", 0, 0, &r, NULL), ST_OK, cli);
  CHECK(elem(st_result_find(r, "w"), 5) == 42.0f);
  st_result_free(r);
}

TEST(a_readonly_get_refuses_device_writes) {
  int rc = run_child("write_ro");
  CHECK(rc == 0 || rc < 0);   /* the write failed, or the reader died of it */
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "g", 0, 0, &r, NULL), ST_OK, cli);
  CHECK(elem(st_result_find(r, "w"), 5) == 42.0f);   /* unchanged */
  CHECK(elem(st_result_find(r, "w"), 6) == 6.0f);
  st_result_free(r);
  CHECK_RC(st_client_delete(cli, "g"), ST_OK, cli);
}

TEST(device_state_outlives_a_publisher_killed) {
  CHECK_EQ_INT(run_child("publish_and_die"), -SIGKILL);
  /* The server's first mapping of it, after its publisher died. */
  double x;
  CHECK_RC(keyread("orphan", N - 1, 1, &x, NULL, 0), ST_OK, cli);
  CHECK(x == (N - 1) * 3.0);
  st_result_t *r = NULL;
  CHECK_RC(st_client_get_view(cli, "orphan", 0, 0, "w:slice(0,10,18,2)|contiguous", &r, NULL),
           ST_OK, cli);
  CHECK(elem(st_result_find(r, "w"), 3) == 16 * 3.0f);
  st_result_free(r);
  CHECK_RC(st_client_get(cli, "orphan", 0, 0, &r, NULL), ST_OK, cli);
  CHECK(elem(st_result_find(r, "w"), 4095) == 4095.0f * 3.0f);
  st_result_free(r);
  CHECK_RC(st_client_delete(cli, "orphan"), ST_OK, cli);
}

TEST(an_endpoint_reads_and_writes_a_fresh_put_in_place) {
  st_result_t *a = counting(1.5f);
  CHECK(a);
  const st_tensor_t *w = st_result_tensor(a, 0);
  CHECK_EQ_INT(put(cli, "lz/ep", w), ST_OK);
  double x;
  CHECK_RC(keyread("lz/ep", 7, 2, &x, NULL, 0), ST_OK, cli);   /* maps it, then writes */
  CHECK(x == 7 * 1.5);
  CHECK(elem(w, 7) == 7 * 3.0f);          /* the write is in the publisher's memory */
  CHECK(elem(w, N - 1) == (N - 1) * 3.0f);
  CHECK_RC(keyread("lz/ep", N - 1, 1, &x, NULL, 0), ST_OK, cli);   /* mapped already */
  CHECK(x == (N - 1) * 3.0);
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, "lz/ep"), ST_OK, cli);
}

TEST(a_contiguous_view_of_a_fresh_put_holds_the_publishers_values) {
  st_result_t *a = counting(0.5f);
  CHECK(a);
  CHECK_EQ_INT(put(cli, "lz/view", st_result_tensor(a, 0)), ST_OK);
  st_result_t *r = NULL;
  /* A strided window: `contiguous` copies it on the server (a window that
   * is contiguous already would be sent as it is, mapped by the client
   * alone). */
  CHECK_RC(st_client_get_view(cli, "lz/view", 0, 0, "w:slice(0,100,132,2)|contiguous", &r, NULL),
           ST_OK, cli);
  const st_tensor_t *v = st_result_find(r, "w");
  CHECK(v && v->numel == 16);
  for (int j = 0; v && j < 16; j++) CHECK(elem(v, j) == (float)(100 + 2 * j) * 0.5f);
  st_result_free(r);
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, "lz/view"), ST_OK, cli);
}

/* A raw put of key `key` = {w: 16 float32} on a "vmm" arena of `bytes`
 * whose descriptor is fd (closed here); the reply in *m. */
static int raw_put(rc_t *c, const char *key, int fd, uint64_t bytes, const char *uuid,
                   msg_t *m) {
  int fds[1] = {fd};
  return rc_rpcf_fds(c, m, fds, 1,
                     "[0, 1, 'put', [{key: '%s', value: {w: tensor(0, 0, 'float32', [16], [1])}, "
                     "arenas: [{fd: 0, bytes: %llu, device: 'cuda', uuid: '%s', backend: 'vmm', "
                     "id: 77}]}]]",
                     key, (unsigned long long)bytes, uuid);
}

#define LIAR_NIL "nil: key 'lz/liar' version 1: mapping imported CUDA allocation (arena "

TEST(a_put_claiming_more_than_its_allocation_fails_when_read) {
  char uuid[ST_CUDA_UUID_LEN], err[512];
  CHECK_ERR_MSG(st__cuda_device_uuid(0, uuid, err, sizeof err), ST_OK, err);
  int fd = -1;
  uint64_t size = 0;
  CHECK_ERR_MSG(st__cuda_create_fd(0, 1, &fd, &size, err, sizeof err), ST_OK, err);
  OPEN_RC(c, srv.socket);
  msg_t m;
  CHECK(raw_put(&c, "lz/liar", fd, 2 * size, uuid, &m) == 1);
  CHECK_REPLY(&m, ST_OK, NULL);   /* taken: nothing maps it at put */
  msg_free(&m);

  char why[1024];
  double x;
  CHECK_RC(keyread("lz/liar", 0, 1, &x, why, sizeof why), ST_OK, cli);
  fprintf(stderr, "   st.key: %s\n", why);
  CHECK(strncmp(why, LIAR_NIL, strlen(LIAR_NIL)) == 0);
  CHECK_CONTAINS(why, "cuMemMap");
  CHECK_CONTAINS(why, uuid);

  st_result_t *r = NULL;
  int rc = st_client_get_view(cli, "lz/liar", 0, 0, "w:slice(0,0,8,2)|contiguous", &r, NULL);
  fprintf(stderr, "   contiguous: %s\n", st_client_error(cli));
  CHECK(rc < 0 && r == NULL);
  CHECK_CONTAINS(st_client_error(cli), "mapping imported CUDA allocation");
  CHECK_CONTAINS(st_client_error(cli), "cuMemMap");
  /* A reader's own mapping of it fails in the reader, as any lying reply. */
  rc = st_client_get(cli, "lz/liar", 0, 0, &r, NULL);
  fprintf(stderr, "   get: %s\n", st_client_error(cli));
  CHECK(rc < 0 && r == NULL);
  CHECK_RC(st_client_delete(cli, "lz/liar"), ST_OK, cli);
  CHECK_RC(st_client_ping(cli, NULL), ST_OK, cli);   /* the server carries on */
  rc_close(&c);
}

TEST(a_descriptor_that_is_no_cuda_allocation_is_refused_at_put) {
  char uuid[ST_CUDA_UUID_LEN], err[512];
  CHECK_ERR_MSG(st__cuda_device_uuid(0, uuid, err, sizeof err), ST_OK, err);
  uint64_t gran = 0;
  CHECK_ERR_MSG(st__cuda_granularity(0, &gran, err, sizeof err), ST_OK, err);
  int fd = memfd_create("not-cuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CHECK(fd >= 0 && ftruncate(fd, (off_t)gran) == 0);
  OPEN_RC(c, srv.socket);
  msg_t m;
  CHECK(raw_put(&c, "lz/memfd", fd, gran, uuid, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_INVALID_ARGUMENT, "not an exported CUDA allocation");
  msg_free(&m);
  rc_close(&c);
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "lz/memfd", 0, 0, &r, NULL), ST_ERR_NOT_FOUND, cli);
}

/* Puts key = {w} of a fresh allocation (kept in *out): the put's status. */
static int put_fresh(const char *key, st_result_t **out) {
  *out = counting(1.0f);
  return *out ? put(cli, key, st_result_tensor(*out, 0)) : ST_ERR_INTERNAL;
}

TEST(releases_of_device_memory_leave_the_loop_and_info_is_settled) {
  /* info settles first, so the figures read after it are the server's. */
  hk_figures_t start = hk_figures(cli, srv.pid, "cuda:0");
  int64_t r0 = hk_info(cli, "arenas", "released_off_loop", NULL);
  CHECK(r0 >= 0);
  st_result_t *t[3] = {0};
  CHECK_EQ_INT(put_fresh("rl/w", &t[0]), ST_OK);
  /* The first version is read (so the server maps it) before it goes. */
  double x;
  CHECK_RC(keyread("rl/w", 3, 1, &x, NULL, 0), ST_OK, cli);
  CHECK(x == 3.0);
  CHECK_RC(st_client_invalidate_endpoint(cli, "keyread", NULL), ST_OK, cli);
  /* Freed: the argument cache forgets it with the next request, the key
   * holds the last reference. */
  st_result_free(t[0]);
  CHECK_EQ_INT(put_fresh("rl/w", &t[1]), ST_OK);
  CHECK_EQ_INT(put_fresh("rl/w", &t[2]), ST_OK);   /* pushes version 1 out */
  CHECK(hk_info(cli, "arenas", "released_off_loop", NULL) >= r0 + 1);
  st_result_free(t[1]);
  st_result_free(t[2]);
  CHECK_RC(st_client_delete(cli, "rl/w"), ST_OK, cli);   /* with the forgets */
  hk_figures_t now = hk_figures(cli, srv.pid, "cuda:0");
  fprintf(stderr, "   fds %lld (start %lld), arenas %lld (%lld), used %lld (%lld)\n",
          (long long)now.fds, (long long)start.fds, (long long)now.arenas,
          (long long)start.arenas, (long long)now.used, (long long)start.used);
  CHECK_EQ_INT(hk_info(cli, "arenas", "releasing", NULL), 0);
  CHECK_EQ_INT(now.fds, start.fds);
  CHECK_EQ_INT(now.arenas, start.arenas);
  CHECK_EQ_INT(now.used, start.used);
  CHECK(hk_info(cli, "arenas", "released_off_loop", NULL) >= r0 + 3);
}

#endif

int main(int argc, char **argv) {
#ifdef ST_HAVE_CUDA
  if (argc == 4 && strcmp(argv[1], "--child") == 0) return child(argv[2], argv[3]);
#else
  (void)argc;
  (void)argv;
#endif
  gk_require_device();
#ifdef ST_HAVE_CUDA
  cli = stt_one_worker_client(&srv, endpoints);
  if (!cli) return 1;
  RUN(a_put_of_device_memory_is_that_memory);
  RUN(a_readonly_get_refuses_device_writes);
  RUN(device_state_outlives_a_publisher_killed);
  RUN(an_endpoint_reads_and_writes_a_fresh_put_in_place);
  RUN(a_contiguous_view_of_a_fresh_put_holds_the_publishers_values);
  RUN(a_put_claiming_more_than_its_allocation_fails_when_read);
  RUN(a_descriptor_that_is_no_cuda_allocation_is_refused_at_put);
  RUN(releases_of_device_memory_leave_the_loop_and_info_is_settled);
  return stt_client_finish(cli, &srv);
#else
  return 77;
#endif
}

/* libstclient and a real stserver building CUDA tensors (endpoints with
 * device = "cuda"; the fixture's default device is the CPU):
 *   - values equal those of the same endpoint built on the CPU, byte for
 *     byte (rand, arange, full, ones in several dtypes, a module, a strided
 *     view), and the tensor fields name the device;
 *   - the open-cache maps a cached object's allocation once for two calls;
 *   - a second process (fork + exec) maps the same object and sees this
 *     process's writes, and this one sees its writes;
 *   - after release and free, device memory returns to its baseline;
 *   - a plain result stays readable and writable after SIGKILL of the
 *     server.
 *
 *   test_gpu_server               the test
 *   test_gpu_server child SOCKET  the second process
 * Exit 77 without a CUDA device. */
#include <errno.h>
#include <signal.h>
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"
#include "mem/cuda.h"

#ifdef ST_HAVE_CUDA

#define MiB (1024ull * 1024ull)

static const char ep_vals[] =
    "return st.endpoint { name = 'vals_$DEVICE', device = '$DEVICE',\n"
    "  params = { n = 100003 },\n"
    "  build = function(a)\n"
    "    local base = st.rand { 6, 8, seed = 3 }\n"
    "    return {\n"
    "      m = st.module { r = st.rand { a.n, seed = 7 },\n"
    "                      ar = st.arange { a.n, dtype = 'float32' },\n"
    "                      h = st.full { 3, 5, value = 1.5, dtype = 'bfloat16' },\n"
    "                      i = st.arange { 1000 },\n"
    "                      o = st.ones { 7, dtype = 'int8' } },\n"
    "      v = base:slice(1, 1, 8, 3),\n"
    "      d = st.rand { 257, seed = 9, dtype = 'float64' },\n"
    "    }\n"
    "  end }\n";
static const char ep_cached[] =
    "return st.endpoint { name = 'cached', device = 'cuda', cache = true,\n"
    "  build = function(a) return st.rand { 1048576, seed = 11 } end }\n";
static const char ep_managed[] =
    "return st.endpoint { name = 'managed', device = 'cuda', managed = true, params = { n = 1 },\n"
    "  build = function(a) return st.zeros { a.n } end }\n";
static const char ep_plain[] =
    "return st.endpoint { name = 'plain', device = 'cuda',\n"
    "  build = function(a) return st.arange { 1048576, dtype = 'float32' } end }\n";

static stt_server_t srv;
static st_client_t *client;

static st_result_t *call(st_client_t *c, const char *endpoint, const char *word) {
  st_args_t *a = st_args_new();
  char err[256];
  if (word) st_args_parse_kv(a, word, err, sizeof err);
  st_result_t *r = NULL;
  if (st_client_call(c, endpoint, a, &r) != ST_OK)
    fprintf(stderr, "   call %s: %s: %s\n", endpoint, st_client_error_name(c),
            st_client_error(c));
  st_args_free(a);
  return r;
}

/* A tensor's bytes on the host (malloc'ed), or NULL. */
static unsigned char *host_copy(const st_tensor_t *t) {
  unsigned char *h = malloc(t->nbytes ? t->nbytes : 1);
  if (h && st_tensor_copy_to_host(t, h, t->nbytes) != ST_OK) {
    free(h);
    h = NULL;
  }
  return h;
}

TEST(values_equal_the_cpu_backend) {
  st_result_t *g = call(client, "vals_cuda", NULL), *c = call(client, "vals_cpu", NULL);
  CHECK(g && c);
  CHECK_EQ_INT(st_result_tensor_count(g), st_result_tensor_count(c));
  CHECK_EQ_INT(st_result_tensor_count(g), 7);
  char err[256];
  for (size_t i = 0; i < st_result_tensor_count(g); i++) {
    const st_tensor_t *tg = st_result_tensor(g, i);
    const st_tensor_t *tc = st_result_find(c, tg->name);
    CHECK(tc);
    CHECK(tg->device == ST_DEVICE_CUDA && tc->device == ST_DEVICE_CPU);
    int ordinal = -1;
    CHECK_ERR_MSG(st__cuda_device_by_uuid(tg->device_uuid, &ordinal, err, sizeof err), ST_OK, err);
    CHECK_EQ_INT(tg->device_index, ordinal);
    CHECK_EQ_INT(tg->dtype, tc->dtype);
    CHECK_EQ_INT(tg->ndim, tc->ndim);
    CHECK_EQ_INT(tg->nbytes, tc->nbytes);
    for (int d = 0; d < tg->ndim; d++) CHECK_EQ_INT(tg->shape[d], tc->shape[d]);
    unsigned char *hg = host_copy(tg), *hc = host_copy(tc);
    int same = hg && hc && memcmp(hg, hc, tg->nbytes) == 0;
    free(hg);
    free(hc);
    if (!same) fprintf(stderr, "   tensor '%s' differs\n", tg->name);
    CHECK(same);
    int64_t last = tg->numel - 1;
    CHECK(st_tensor_get(tg, last) == st_tensor_get(tc, last));
  }
  const st_tensor_t *v = st_result_find(g, "v");
  CHECK(v && v->ndim == 2 && v->strides[1] == 3); /* gathered through the host */
  st_result_free(g);
  st_result_free(c);
}

static pid_t spawn_child(void) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  char *argv[] = {(char *)"test_gpu_server", (char *)"child", srv.socket, NULL};
  execv("/proc/self/exe", argv);
  _exit(127);
}

/* The second process: element 0 must be 777 (the parent's write); writes
 * element 1 = -2. */
static int run_child(const char *socket) {
  char err[256];
  st_client_t *c;
  if (st_client_connect(socket, &c, err, sizeof err) != ST_OK) {
    fprintf(stderr, "child: %s\n", err);
    return 1;
  }
  st_result_t *r = call(c, "cached", NULL);
  if (!r) return 1;
  const st_tensor_t *t = st_result_tensor(r, 0);
  double first = st_tensor_get(t, 0);
  float v = -2.0f;
  int rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data + 4, &v, 4, t->device_index, err,
                                   sizeof err);
  st_result_free(r);
  st_client_close(c);
  if (first != 777.0 || rc != ST_OK) {
    fprintf(stderr, "child: element 0 is %g, write: %d\n", first, rc);
    return 1;
  }
  return 0;
}

TEST(a_cached_object_is_mapped_once_and_shared) {
  size_t m0, m;
  uint64_t u0, u;
  st_open_cache_stats(&m0, &u0);
  st_result_t *a = call(client, "cached", NULL), *b = call(client, "cached", NULL);
  CHECK(a && b);
  /* The second call on the connection is the result it holds (objects
   * sent once): one mapping, no second look-up in the open-cache. */
  CHECK(a == b);
  st_open_cache_stats(&m, &u);
  CHECK_EQ_INT(m, m0 + 1);
  CHECK_EQ_INT(u, u0);
  const st_tensor_t *ta = st_result_tensor(a, 0), *tb = st_result_tensor(b, 0);
  CHECK(ta->device == ST_DEVICE_CUDA && ta->data == tb->data);
  char err[256];
  float v = 777.0f;
  CHECK_ERR_MSG(st__cuda_copy_to_device((uint64_t)(uintptr_t)ta->data, &v, 4, ta->device_index,
                                        err, sizeof err),
                ST_OK, err);
  pid_t pid = spawn_child();
  CHECK(pid > 0);
  int st = 0;
  double deadline = stt_now_ms() + 60000;
  while (waitpid(pid, &st, WNOHANG) == 0 && stt_now_ms() < deadline) {
    struct timespec ts = {0, 5 * 1000 * 1000}; /* polls the child's exit */
    nanosleep(&ts, NULL);
  }
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(st_tensor_get(tb, 1) == -2.0);
  st_result_free(a);
  st_open_cache_stats(&m, NULL);
  CHECK_EQ_INT(m, m0 + 1);
  st_result_free(b);
  st_open_cache_stats(&m, NULL);
  CHECK_EQ_INT(m, m0);
}

/* Free device memory once it has settled at or above `want` (the driver
 * frees asynchronously), polling for at most 10 s. */
static uint64_t free_memory_reaching(uint64_t want) {
  uint64_t f = 0;
  double deadline = stt_now_ms() + 10000;
  do {
    if (st__cuda_mem_info(0, &f, NULL, NULL, 0) != ST_OK) return 0;
    if (f >= want) break;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  } while (stt_now_ms() < deadline);
  return f;
}

TEST(memory_returns_after_release_and_free) {
  /* A first small build warms the server's worker (stream, context). */
  st_result_t *w = call(client, "managed", NULL);
  CHECK(w);
  st_object_info_t o;
  CHECK_ERR(st_result_object(w, &o), ST_OK);
  CHECK_RC(st_client_release(client, o.id, NULL, NULL, NULL), ST_OK, client);
  st_result_free(w);
  uint64_t base, during, after;
  char err[256];
  CHECK_ERR_MSG(st__cuda_mem_info(0, &base, NULL, err, sizeof err), ST_OK, err);
  st_result_t *r = call(client, "managed", "n=16777216"); /* 64 MiB */
  CHECK(r);
  CHECK_ERR_MSG(st__cuda_mem_info(0, &during, NULL, err, sizeof err), ST_OK, err);
  CHECK(during + 64 * MiB <= base);
  CHECK(st_tensor_get(st_result_tensor(r, 0), 16777215) == 0.0);
  CHECK_ERR(st_result_object(r, &o), ST_OK);
  CHECK(o.lease);
  int released = 0, destroyed = 0;
  CHECK_RC(st_client_release(client, o.id, &released, &destroyed, NULL), ST_OK, client);
  CHECK(released && destroyed);
  /* The server let go; this process still maps it. */
  CHECK_ERR_MSG(st__cuda_mem_info(0, &after, NULL, err, sizeof err), ST_OK, err);
  CHECK(after + 64 * MiB <= base);
  st_result_free(r);
  /* Kept for reuse (kept arenas) until the bound drops it. */
  st_open_cache_keep(0, 0);
  st_open_cache_keep(16, (uint64_t)256 * MiB);
  after = free_memory_reaching(base - 4 * MiB);
  fprintf(stderr, "   free: %llu MiB before, %llu MiB while mapped, %llu MiB after\n",
          (unsigned long long)(base / MiB), (unsigned long long)(during / MiB),
          (unsigned long long)(after / MiB));
  CHECK(after + 4 * MiB >= base);
}

TEST(plain_result_outlives_sigkill) {
  st_result_t *r = call(client, "plain", NULL);
  CHECK(r);
  CHECK_EQ_INT(kill(srv.pid, SIGKILL), 0);
  int status = 0;
  CHECK_EQ_INT(waitpid(srv.pid, &status, 0), srv.pid);
  srv.pid = -1;
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  const st_tensor_t *t = st_result_tensor(r, 0);
  float *h = malloc(t->nbytes);
  CHECK(h);
  CHECK_ERR(st_tensor_copy_to_host(t, h, t->nbytes), ST_OK);
  long bad = 0;
  for (int64_t i = 0; i < t->numel; i++)
    if (h[i] != (float)i) bad++;
  free(h);
  CHECK_EQ_INT(bad, 0);
  char err[256];
  float v = -9.5f;
  CHECK_ERR_MSG(st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data + 20, &v, 4, t->device_index,
                                        err, sizeof err),
                ST_OK, err);
  CHECK(st_tensor_get(t, 5) == -9.5);
  CHECK(st_tensor_get(t, 6) == 6.0);
  st_result_free(r);
}

#endif

int main(int argc, char **argv) {
  char err[512];
  if (st__cuda_available(err, sizeof err) != ST_OK) stt_skip(err);
#ifdef ST_HAVE_CUDA
  if (argc == 3 && strcmp(argv[1], "child") == 0) return run_child(argv[2]);
  /* This process's context first, so baselines do not count it. */
  uint64_t f;
  if (st__cuda_mem_info(0, &f, NULL, err, sizeof err) != ST_OK) stt_skip(err);
  stt_server_init(&srv);
  stt_write_endpoint_per_device(&srv, "vals", ep_vals);
  stt_write_endpoint(&srv, "cached.lua", ep_cached);
  stt_write_endpoint(&srv, "managed.lua", ep_managed);
  stt_write_endpoint(&srv, "plain.lua", ep_plain);
  stt_server_config(&srv, "workers = 1,");
  stt_server_start_or_exit(&srv);
  client = stt_client_open(srv.socket);
  if (!client) return 1;
  st_client_set_timeout(client, 60000);
  RUN(values_equal_the_cpu_backend);
  RUN(a_cached_object_is_mapped_once_and_shared);
  RUN(memory_returns_after_release_and_free);
  RUN(plain_result_outlives_sigkill);
  st_client_close(client);
  if (srv.pid > 0 && stt_server_stop(&srv) != 0)
    stt_fail_main(__FILE__, __LINE__, "stserver did not stop cleanly");
  stt_server_cleanup(&srv);
#endif
  return stt_summary();
}

/* libstclient against a hostile server (docs/protocol.md, "Arena"; "Who
 * the client talks to" in include/st/client.h): a descriptor that is not
 * what its arena says is refused with PROTOCOL before it is mapped, never
 * a signal later, and a socket whose listener runs as another uid than
 * expected is refused with AUTH before a byte is sent.
 *
 * The descriptors come from a scripted server on a real socket: CPU arenas
 * with a backend other than memfd, a CUDA backend that does not exist,
 * memfds that are unsealed, short, read-only, sealed against writing or on
 * hugetlbfs, and descriptors that are no file (a pipe, a socket). The
 * worst of them (an unsealed memfd named "file", truncated by the server
 * once the client holds it) runs in a child process that touches the
 * tensor, so that a SIGBUS shows as what it is. */
#include <signal.h>
#include <sys/wait.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"

static fake_server_t fs;

/* What the scripted "call" sends as the descriptor of arena 0. */
enum fd_kind { FD_MEMFD, FD_UNSEALED, FD_SHORT, FD_READ_ONLY, FD_WRITE_SEALED, FD_HUGETLB,
               FD_PIPE, FD_SOCKET };

static const float kData[4] = {1, 2, 3, 4};

/* A descriptor of that kind for a 4096-byte arena (FD_SHORT: 32 bytes);
 * -1 when this host cannot make one (hugetlbfs). */
static int make_fd(enum fd_kind k) {
  int p[2], fd;
  switch (k) {
  case FD_MEMFD: return fake_memfd(4096, kData, sizeof kData, 1);
  case FD_UNSEALED: return fake_memfd(4096, kData, sizeof kData, 0);
  case FD_SHORT: return fake_memfd(32, kData, sizeof kData, 1);
  case FD_READ_ONLY: {
    /* The same sealed memfd, opened again for reading only. */
    char path[64];
    int rw = fake_memfd(4096, kData, sizeof kData, 1);
    snprintf(path, sizeof path, "/proc/self/fd/%d", rw);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    close(rw);
    return fd;
  }
  case FD_WRITE_SEALED:
    fd = fake_memfd(4096, kData, sizeof kData, 1);
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0) abort();
    return fd;
  case FD_HUGETLB:
    /* Sealed like a memfd, but on hugetlbfs: its pages can be punched out
     * and not come back (SIGBUS). Hosts without huge pages cannot make it. */
    fd = memfd_create("fake-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
    if (fd < 0) return -1;
    if (ftruncate(fd, 2 << 20) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  case FD_PIPE:
    if (pipe2(p, O_CLOEXEC) != 0) abort();
    close(p[1]);
    return p[0];
  default: /* FD_SOCKET */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) abort();
    close(p[1]);
    return p[0];
  }
}

/* The replies, by endpoint name: the arena entry and the descriptor. */
static const struct reply {
  const char *endpoint;
  const char *arena;   /* stt_pack text of arenas[0] */
  enum fd_kind fd;
  int want;            /* what the call returns */
  const char *part;    /* of the message */
} replies[] = {
    {"good", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 1}", FD_MEMFD, ST_OK,
     ""},
    /* A backend without checks of its own got no seal check at all. */
    {"backend_file", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'file', id: 2}", FD_UNSEALED,
     ST_ERR_PROTOCOL, "backend 'file' is not one of device 'cpu' (memfd)"},
    {"backend_vmm_on_cpu", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'vmm', id: 3}",
     FD_MEMFD, ST_ERR_PROTOCOL, "backend 'vmm' is not one of device 'cpu'"},
    {"backend_cuda_ipc",
     "{fd: 0, bytes: 4096, device: 'cuda', uuid: 'GPU-00000000-0000-0000-0000-000000000000', "
     "backend: 'ipc', id: 4}",
     FD_MEMFD, ST_ERR_PROTOCOL, "backend 'ipc' is not one of device 'cuda' (vmm or legacy)"},
    {"unsealed", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 5}", FD_UNSEALED,
     ST_ERR_PROTOCOL, "arena 5: the memfd is not sealed against shrinking (F_SEAL_SHRINK)"},
    {"short", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 6}", FD_SHORT,
     ST_ERR_PROTOCOL, "arena 6: the descriptor says 4096 bytes but the file has 32"},
    {"read_only", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 7}", FD_READ_ONLY,
     ST_ERR_PROTOCOL, "arena 7: the memfd descriptor is not open for reading and writing"},
    {"write_sealed", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 8}",
     FD_WRITE_SEALED, ST_ERR_PROTOCOL, "arena 8: the memfd is sealed against writing"},
    {"hugetlb", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 9}", FD_HUGETLB,
     ST_ERR_PROTOCOL, "arena 9: backend memfd, but the descriptor is a file of another file "
                      "system"},
    {"pipe", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 10}", FD_PIPE,
     ST_ERR_PROTOCOL, "arena 10: backend memfd, but the descriptor is a pipe"},
    {"socket", "{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 11}", FD_SOCKET,
     ST_ERR_PROTOCOL, "arena 11: backend memfd, but the descriptor is a socket"},
};
#define NREPLIES (sizeof replies / sizeof replies[0])

/* The server's own copy of the last descriptor sent, for "truncate". */
static int last_fd = -1;
static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  if (strcmp(method, "truncate") == 0) {
    /* What a hostile holder of the file does to a client that mapped it. */
    pthread_mutex_lock(&last_lock);
    int rc = last_fd >= 0 ? ftruncate(last_fd, 0) : -1;
    pthread_mutex_unlock(&last_lock);
    return fake_replyf(conn, id, NULL, 0, "%s", rc == 0 ? "true" : "false");
  }
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  char ep[64];
  fake_param_str(params, "endpoint", ep, sizeof ep);
  size_t k = 0;
  while (k + 1 < NREPLIES && strcmp(ep, replies[k].endpoint) != 0) k++;
  int fd = make_fd(replies[k].fd);
  if (fd < 0) return fake_error(conn, id, 4, "CAPABILITY", "this host cannot make it");
  /* The previous reply's file goes before this reply is sent: once it is
   * out, the client counts this process's descriptors. */
  pthread_mutex_lock(&last_lock);
  if (last_fd >= 0) close(last_fd);
  last_fd = fd;
  pthread_mutex_unlock(&last_lock);
  return fake_replyf(conn, id, &fd, 1, "{value: tensor(0, 0, 'float32', [4], [1]), arenas: [%s]}",
                     replies[k].arena);
}

/* Every refusal is PROTOCOL with its reason, maps nothing, leaks no
 * descriptor and keeps the connection. */
TEST(descriptors_that_disagree_are_protocol_errors) {
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(c, "good", NULL, &r), ST_OK, c);
  CHECK_EQ_INT(st_tensor_get(st_result_find(r, ""), 3), 4);
  st_result_free(r);
  int fds0 = fake_count_fds();
  size_t mapped0, mapped;
  st_open_cache_stats(&mapped0, NULL);
  for (size_t i = 1; i < NREPLIES; i++) {
    r = NULL;
    int rc = st_client_call(c, replies[i].endpoint, NULL, &r);
    fprintf(stderr, "   %s: %s\n", replies[i].endpoint, st_client_error(c));
    if (rc == ST_ERR_CAPABILITY && replies[i].fd == FD_HUGETLB) continue; /* no huge pages */
    CHECK_RC(rc, replies[i].want, c);
    CHECK(r == NULL);
    CHECK_CONTAINS(st_client_error(c), replies[i].part);
    st_result_free(r);
    st_open_cache_stats(&mapped, NULL);
    CHECK_EQ_INT(mapped, mapped0);
    CHECK_EQ_INT(fake_count_fds(), fds0);
    CHECK_RC(st_client_ping(c, NULL), ST_OK, c);
  }
  st_client_close(c);
}

/* The client of the child process: calls `endpoint`, and when that maps
 * something, has the server truncate the file and reads the tensor.
 * Exits with 0 on the PROTOCOL refusal. */
static void child_reads_after_truncation(const char *endpoint) {
  st_client_t *c = stt_client_open(fs.path);
  if (!c) _exit(3);
  st_result_t *r = NULL, *t = NULL;
  int rc = st_client_call(c, endpoint, NULL, &r);
  if (rc == ST_OK) {
    st_client_rpc(c, "truncate", NULL, &t);
    volatile float x = *(const float *)st_result_find(r, "")->data; /* SIGBUS here */
    (void)x;
    _exit(2);
  }
  _exit(rc == ST_ERR_PROTOCOL && strstr(st_client_error(c), "backend 'file'") ? 0 : 1);
}

/* An unsealed memfd named "file" used to be mapped as it was: the server
 * then shrank it and the client died of SIGBUS on its next read. */
TEST(a_truncated_file_is_refused_not_a_signal) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) child_reads_after_truncation("backend_file");
  int status = 0;
  CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) fprintf(stderr, "   the client died of signal %d\n", WTERMSIG(status));
  CHECK(WIFEXITED(status));
  CHECK_EQ_INT(WEXITSTATUS(status), 0);
}

/* --- who listens ------------------------------------------------------ */

static int connect_as(const char *path, int64_t server_uid, char *err, size_t errlen) {
  st_client_options_t o;
  st_client_options_init(&o);
  o.server_uid = server_uid;
  st_client_t *c = (st_client_t *)1;
  int rc = st_client_connect_opts(path, &o, &c, err, errlen);
  if (rc == ST_OK) st_client_close(c);
  else if (c != NULL) return ST_ERR_INTERNAL; /* a failed connect must leave *out NULL */
  return rc;
}

/* The requests the fake server has seen, once its connections ended (-1:
 * they did not end). */
static int requests_seen(void) {
  return fake_wait_idle(&fs, 2000) == 0 ? fs.requests : -1;
}

TEST(the_server_uid_is_checked_before_anything_is_sent) {
  char err[512], want[160];
  unsigned me = (unsigned)geteuid();
  st_client_options_t o;
  st_client_options_init(&o);
  CHECK_EQ_INT(o.server_uid, ST_SERVER_UID_DEFAULT);
  /* The default (own uid or root) and this uid named exactly pass. */
  CHECK_ERR_MSG(connect_as(fs.path, ST_SERVER_UID_DEFAULT, err, sizeof err), ST_OK, err);
  CHECK_ERR_MSG(connect_as(fs.path, me, err, sizeof err), ST_OK, err);
  OPEN_CLIENT(c, fs.path);
  st_client_close(c);
  /* Another uid: refused before hello. */
  int seen = requests_seen();
  CHECK_ERR_MSG(connect_as(fs.path, (int64_t)me + 1, err, sizeof err), ST_ERR_AUTH, err);
  snprintf(want, sizeof want, "the server at %s runs as uid %u; this client expects uid %u",
           fs.path, me, me + 1);
  CHECK_CONTAINS(err, want);
  CHECK_EQ_INT(requests_seen(), seen);
  /* Out of range. */
  CHECK_ERR_MSG(connect_as(fs.path, -2, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "server_uid -2 is not a uid");
  CHECK_ERR_MSG(connect_as(fs.path, UINT32_MAX, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
}

TEST(the_environment_names_the_server_uid) {
  char err[512], v[32];
  unsigned me = (unsigned)geteuid();
  st_client_t *c = NULL;
  snprintf(v, sizeof v, "%u", me + 1);
  setenv(ST_ENV_SERVER_UID, v, 1);
  int seen = requests_seen();
  CHECK_ERR_MSG(st_client_connect(fs.path, &c, err, sizeof err), ST_ERR_AUTH, err);
  CHECK_CONTAINS(err, "expects uid");
  CHECK_EQ_INT(requests_seen(), seen);
  /* An explicit option wins over the environment. */
  CHECK_ERR_MSG(connect_as(fs.path, me, err, sizeof err), ST_OK, err);
  snprintf(v, sizeof v, "%u", me);
  setenv(ST_ENV_SERVER_UID, v, 1);
  CHECK_ERR_MSG(st_client_connect(fs.path, &c, err, sizeof err), ST_OK, err);
  st_client_close(c);
  setenv(ST_ENV_SERVER_UID, "root", 1);
  CHECK_ERR_MSG(st_client_connect(fs.path, &c, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "$SHARED_TENSOR_SERVER_UID is 'root', not a uid");
  setenv(ST_ENV_SERVER_UID, "", 1); /* empty: the default */
  CHECK_ERR_MSG(st_client_connect(fs.path, &c, err, sizeof err), ST_OK, err);
  st_client_close(c);
  unsetenv(ST_ENV_SERVER_UID);
}

int main(void) {
  fs.on_request = on_request;
  fake_start(&fs);
  RUN(descriptors_that_disagree_are_protocol_errors);
  RUN(a_truncated_file_is_refused_not_a_signal);
  RUN(the_server_uid_is_checked_before_anything_is_sent);
  RUN(the_environment_names_the_server_uid);
  fake_finish(&fs);
  if (last_fd >= 0) close(last_fd);
  return stt_summary();
}

/* Two servers in network namespaces of their own, joined by a veth pair
 * (docs/multihost.md, "Tested"): each has its own address and interface,
 * as two hosts do. A key pulled from one to the other over that link
 * with every byte compared; then the link cut (`ip link set ... down`)
 * while a transfer is open: the pull fails with the reason, nothing is
 * visible on the receiver, both serve on, and with the link back a pull
 * works again. Needs root and `ip netns` (iproute2): skips without them.
 * The namespaces are named after this process and deleted at the end. */
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "peer/tls.h"
#include "peer_kit.h"

#define MiB (1024u * 1024u)
#define ADDR_A "198.51.100.1"
#define ADDR_B "198.51.100.2"

static char ns_a[32], ns_b[32];
static stt_server_t A, B;
static char key[400];

/* Runs a shell command; 0 when it exited 0. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  return rc == 0 ? 0 : -1;
}

static void namespaces_down(void) {
  if (ns_a[0]) sh("ip netns del %s 2>/dev/null", ns_a);
  if (ns_b[0]) sh("ip netns del %s 2>/dev/null", ns_b);
}

/* Two namespaces, a veth pair between them (stva in a, stvb in b), an
 * address on each end. 0, or -1 when the host does not allow it. */
static int namespaces_up(void) {
  snprintf(ns_a, sizeof ns_a, "st%da", (int)getpid());
  snprintf(ns_b, sizeof ns_b, "st%db", (int)getpid());
  if (sh("ip netns add %s 2>/dev/null && ip netns add %s 2>/dev/null", ns_a, ns_b) != 0 ||
      sh("ip link add stv%d type veth peer name stw%d 2>/dev/null", (int)getpid() % 10000,
         (int)getpid() % 10000) != 0 ||
      sh("ip link set stv%d netns %s name stva && ip link set stw%d netns %s name stvb",
         (int)getpid() % 10000, ns_a, (int)getpid() % 10000, ns_b) != 0 ||
      sh("ip -n %s addr add %s/30 dev stva && ip -n %s link set stva up && "
         "ip -n %s link set lo up", ns_a, ADDR_A, ns_a, ns_a) != 0 ||
      sh("ip -n %s addr add %s/30 dev stvb && ip -n %s link set stvb up && "
         "ip -n %s link set lo up", ns_b, ADDR_B, ns_b, ns_b) != 0) {
    namespaces_down();
    return -1;
  }
  return 0;
}

/* Byte i of arena k of the test's key. */
static uint8_t pattern(size_t i, int k) { return (uint8_t)(i * 7 + (size_t)k); }

static int put_key(const char *name, size_t bytes) {
  int fds[2] = {pattern_memfd(bytes, 0, pattern), pattern_memfd(bytes, 1, pattern)};
  rc_t c;
  msg_t m;
  if (fds[0] < 0 || fds[1] < 0 || rc_open(&c, A.socket) != 0) return 0;
  int ok = rc_rpcf_fds(&c, &m, fds, 2,
                       "[0, 1, 'put', [{key: '%s', value: {a: tensor(0, 0, 'uint8', [%zu], [1]), "
                       "b: tensor(1, 0, 'uint8', [%zu], [1])}, arenas: ["
                       "{fd: 0, bytes: %zu, device: 'cpu', backend: 'memfd', id: 1}, "
                       "{fd: 1, bytes: %zu, device: 'cpu', backend: 'memfd', id: 2}]}]]",
                       name, bytes, bytes, bytes, bytes) == 1 &&
           !m.error;
  msg_free(&m);
  rc_close(&c);
  return ok;
}

/* Whether b holds key `name` with both tensors' bytes. */
static int b_holds(const char *name, size_t bytes) {
  rc_t c;
  msg_t m;
  if (rc_open(&c, B.socket) != 0) return 0;
  int ok = rc_rpcf(&c, &m, "[0, 1, 'get', [{key: '%s'}]]", name) == 1 && !m.error && c.nfds == 2;
  for (int k = 0; ok && k < 2; k++) {
    /* The arenas come in the order the value names them: a, then b. */
    uint8_t *p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, c.fds[k], 0);
    ok = p != MAP_FAILED;
    for (size_t i = 0; ok && i < bytes; i++) ok = p[i] == pattern(i, k);
    if (p != MAP_FAILED) munmap(p, bytes);
  }
  msg_free(&m);
  rc_close(&c);
  return ok;
}


TEST(a_key_crosses_between_namespaces_and_a_cut_link_fails_cleanly) {
  const size_t bytes = 4 * MiB;
  CHECK(put_key("w/model", bytes));
  OPEN_RC(c, B.socket);
  char status[600], err[600];
  uint64_t id = pull_task(&c, "key: 'w/model', from: 'a'");
  CHECK(id > 0);
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "completed");
  if (strcmp(status, "completed")) fprintf(stderr, "   %s\n", err);
  CHECK(b_holds("w/model", bytes));
  CHECK_RPC(&c, ST_OK, NULL, "[0, 3, 'delete', [{key: 'w/model'}]]");
  int64_t used0 = server_info_int(&B, "memory.cpu.used_bytes");
  /* The link cut while a transfer is open (a's helper held stopped). */
  pid_t ha = (pid_t)server_info_int(&A, "transfers.helper_pid");
  CHECK(ha > 0 && kill(ha, SIGSTOP) == 0);
  id = pull_task(&c, "key: 'w/model', from: 'a'");
  double end = stt_now_ms() + 20000;
  while (server_info_int(&A, "transfers.lends") != 1 && stt_now_ms() < end) stt_sleep_ms(20);
  CHECK_EQ_INT(server_info_int(&A, "transfers.lends"), 1);
  CHECK(sh("ip -n %s link set stvb down", ns_b) == 0);
  kill(ha, SIGCONT);
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK(err[0] != '\0');
  fprintf(stderr, "   with the link down: %s\n", err);
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "w/model", "[0, 4, 'get', [{key: 'w/model'}]]");
  CHECK_EQ_INT(server_info_int(&B, "memory.cpu.used_bytes"), used0);
  /* Back up: the link comes back and a pull works again. */
  CHECK(sh("ip -n %s link set stvb up", ns_b) == 0);
  CHECK(wait_peer(&B, "a", "up", NULL));
  id = pull_task(&c, "key: 'w/model', from: 'a'");
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "completed");
  CHECK(b_holds("w/model", bytes));
  CHECK(serves(&A) && serves(&B));
  rc_close(&c);
}

int main(void) {
  if (!getenv("ST_SERVER_BIN")) stt_skip("ST_SERVER_BIN is not set");
  char why[256];
  st__tls_conf_t none = {0};
  st__tls_ctx_t *ctx = NULL;
  none.secret = "/nonexistent";
  if (st__tls_ctx_new(&none, &ctx, why, sizeof why) == ST_ERR_CAPABILITY) stt_skip(why);
  if (geteuid() != 0) stt_skip("needs root to make network namespaces");
  if (namespaces_up() != 0) stt_skip("this host does not allow network namespaces (ip netns add)");
  signal(SIGPIPE, SIG_IGN);
  setenv("UCX_TLS", "tcp", 1);
  stt_server_init(&A);
  stt_server_init(&B);
  make_key(A.dir, "cluster.key", key, sizeof key);
  snprintf(A.netns, sizeof A.netns, "%s", ns_a);
  snprintf(B.netns, sizeof B.netns, "%s", ns_b);
  /* Each server's UCX uses its own end of the pair; a short transfer
   * limit bounds the cut link's wait. */
  setenv("UCX_NET_DEVICES", "stva", 1);
  peer_config(&A, "peer = { id = 'a', listen = '" ADDR_A ":0', secret = '%s', peers = { b = {} }, "
              "export = { 'w/*' }, transfer_timeout_s = 5, connect_timeout_s = 3 },", key);
  int started = stt_server_start(&A) == 0;
  char addr[128] = "";
  if (started) listen_addr(&A, addr, sizeof addr);
  setenv("UCX_NET_DEVICES", "stvb", 1);
  peer_config(&B, "peer = { id = 'b', secret = '%s', peers = { a = '%s' }, "
              "transfer_timeout_s = 5, connect_timeout_s = 3 },", key, addr);
  started = started && addr[0] && stt_server_start(&B) == 0 && wait_peer(&B, "a", "up", NULL);
  if (started) RUN(a_key_crosses_between_namespaces_and_a_cut_link_fails_cleanly);
  else fprintf(stderr, "the two servers did not start or link\n");
  int b = stt_server_stop(&B), a = stt_server_stop(&A);
  stt_server_cleanup(&B);
  stt_server_cleanup(&A);
  namespaces_down();
  if (!started || a != 0 || b != 0) return 1;
  return stt_summary();
}

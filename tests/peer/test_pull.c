/* Pulling a key from another server (docs/multihost.md, "Pulling a
 * key"): stservers on loopback acting as hosts, the bytes over UCX
 * (UCX_TLS=tcp on lo). A multi-tensor CPU key pulled with every byte
 * compared, its origin recorded, the receiver's memory no more than the
 * key's; then the refusals, each a clear error with nothing visible on
 * the receiver and both servers serving on: a key not exported, a peer
 * not listed, a receiver over its budget, a UCX version that differs
 * (one server loads a library that says 1.99.7), the receiver's helper
 * SIGKILLed mid-transfer, the source server SIGKILLed mid-transfer, a
 * cancel; descriptors and budgets back to their start values. */
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "peer/tls.h"
#include "peer_kit.h"

#define MiB (1024u * 1024u)

/* Byte i of arena k of the test's keys. */
static uint8_t pattern(size_t i, int k) { return (uint8_t)(i * 131u + (unsigned)k * 7u + (i >> 12)); }

/* Puts key `name` on the server at socket with one uint8 tensor t<k> over
 * each of the n arenas of sizes[]. 1 when it worked. */
static int put_key(const char *socket, const char *name, const size_t *sizes, int n) {
  char value[2048] = "", arenas[2048] = "";
  int fds[8];
  for (int k = 0; k < n; k++) {
    if ((fds[k] = pattern_memfd(sizes[k], k, pattern)) < 0) return 0;
    char one[256];
    snprintf(one, sizeof one, "%st%d: tensor(%d, 0, 'uint8', [%zu], [1])", k ? ", " : "", k, k,
             sizes[k]);
    strcat(value, one);
    snprintf(one, sizeof one, "%s{fd: %d, bytes: %zu, device: 'cpu', backend: 'memfd', id: %d}",
             k ? ", " : "", k, sizes[k], k + 1);
    strcat(arenas, one);
  }
  rc_t c;
  if (rc_open(&c, socket) != 0) return 0;
  msg_t m;
  int ok = rc_rpcf_fds(&c, &m, fds, n, "[0, 1, 'put', [{key: '%s', value: {%s}, arenas: [%s]}]]",
                       name, value, arenas) == 1 &&
           !m.error;
  if (!ok) fprintf(stderr, "   put %s: %s\n", name, m.error ? obj_str(obj_get(m.error, "message")) : "no reply");
  msg_free(&m);
  rc_close(&c);
  return ok;
}

/* Whether key `name` on the server at socket holds tensors t0..t<n-1>
 * with the bytes of the test's pattern: 1, or 0 (said). */
static int key_holds(const char *socket, const char *name, const size_t *sizes, int n) {
  rc_t c;
  if (rc_open(&c, socket) != 0) return 0;
  msg_t m;
  int ok = rc_rpcf(&c, &m, "[0, 1, 'get', [{key: '%s'}]]", name) == 1 && !m.error;
  const msgpack_object *value = ok ? obj_get(m.result, "value") : NULL;
  const msgpack_object *arenas = ok ? obj_get(m.result, "arenas") : NULL;
  for (int k = 0; ok && k < n; k++) {
    char t[16];
    snprintf(t, sizeof t, "t%d", k);
    const msgpack_object *o = obj_get(value, t);
    st__tensor_desc_t d;
    ok = o && o->type == MSGPACK_OBJECT_EXT && st__parse_tensor(o, &d, NULL, 0) == ST_OK &&
         d.shape[0] == (int64_t)sizes[k] && d.offset == 0 && arenas &&
         d.arena < arenas->via.array.size;
    if (!ok) break;
    int64_t fdi = obj_int(obj_get(&arenas->via.array.ptr[d.arena], "fd"));
    ok = fdi >= 0 && fdi < c.nfds;
    uint8_t *p = ok ? mmap(NULL, sizes[k], PROT_READ, MAP_SHARED, c.fds[fdi], 0) : MAP_FAILED;
    ok = p != MAP_FAILED;
    for (size_t i = 0; ok && i < sizes[k]; i++)
      if (p[i] != pattern(i, k)) {
        fprintf(stderr, "   %s: t%d byte %zu is %u, not %u\n", name, k, i, p[i], pattern(i, k));
        ok = 0;
      }
    if (p != MAP_FAILED) munmap(p, sizes[k]);
  }
  if (!ok) fprintf(stderr, "   key %s on %s does not hold its bytes\n", name, socket);
  msg_free(&m);
  rc_close(&c);
  return ok;
}

static stt_server_t A, B;
static char key[400];

static int start_two_ucx(const char *b_more, const char *ucx) {
  stt_server_init(&A);
  stt_server_init(&B);
  make_key(A.dir, "cluster.key", key, sizeof key);
  peer_config(&A, "memory_budget = { cpu = 1073741824 }, "
              "peer = { id = 'a', listen = '127.0.0.1:0', secret = '%s', peers = { b = {}, c = {} }, "
              "export = { 'w/*' } },", key);
  if (stt_server_start(&A) != 0) return -1;
  char addr[128];
  listen_addr(&A, addr, sizeof addr);
  char lib[400] = "";
  if (ucx) snprintf(lib, sizeof lib, "ucx_library = '%s', ", ucx);
  peer_config(&B, "%s peer = { id = 'b', secret = '%s', peers = { a = '%s' }, %s"
              "transfer_timeout_s = 60 },", b_more, key, addr, lib);
  if (stt_server_start(&B) != 0) return -1;
  return wait_peer(&B, "a", "up", NULL) && wait_peer(&A, "b", "up", NULL) ? 0 : -1;
}

static int start_two(const char *b_more) { return start_two_ucx(b_more, NULL); }

static int start_two_with_ucx(const char *ucx) {
  return start_two_ucx("memory_budget = { cpu = 1073741824 },", ucx);
}

static void stop_two(void) {
  stt_server_stop(&B);
  stt_server_stop(&A);
  stt_server_cleanup(&B);
  stt_server_cleanup(&A);
}

static const size_t SIZES[3] = {4096, MiB + 13, 24 * MiB};

TEST(a_pulled_key_holds_every_byte_and_its_origin) {
  CHECK(start_two("memory_budget = { cpu = 1073741824 },") == 0);
  CHECK(put_key(A.socket, "w/model", SIZES, 3));
  int64_t used0 = server_info_int(&B, "memory.cpu.used_bytes");
  OPEN_RC(c, B.socket);
  uint64_t id = pull_task(&c, "key: 'w/model', from: 'a'");
  CHECK(id > 0);
  char status[600], err[600];
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "completed");
  if (strcmp(status, "completed")) fprintf(stderr, "   %s\n", err);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 3, 'result', [{task_id: %llu}]]", (unsigned long long)id) == 1 &&
        !m.error);
  const msgpack_object *v = obj_get(m.result, "value");
  CHECK_STR_EQ(obj_str(obj_get(v, "key")), "w/model");
  CHECK_EQ_INT(obj_int(obj_get(v, "version")), 1);
  CHECK_STR_EQ(obj_str(obj_path(v, "origin.peer")), "a");
  CHECK_STR_EQ(obj_str(obj_path(v, "origin.key")), "w/model");
  CHECK_EQ_INT(obj_int(obj_path(v, "origin.version")), 1);
  CHECK_EQ_INT(obj_int(obj_get(v, "bytes")), (int64_t)(SIZES[0] + SIZES[1] + SIZES[2]));
  msg_free(&m);
  CHECK(key_holds(B.socket, "w/model", SIZES, 3));
  /* keys lists the replica's origin; the receiver holds the key's bytes
   * once (its arenas, charged at allocation). */
  CHECK(rc_rpcf(&c, &m, "[0, 4, 'keys', []]") == 1 && !m.error);
  CHECK(m.result->type == MSGPACK_OBJECT_ARRAY && m.result->via.array.size == 1);
  CHECK_STR_EQ(obj_str(obj_path(&m.result->via.array.ptr[0], "origin.peer")), "a");
  msg_free(&m);
  int64_t used = server_info_int(&B, "memory.cpu.used_bytes");
  CHECK(used - used0 >= (int64_t)(SIZES[0] + SIZES[1] + SIZES[2]));
  CHECK(used - used0 < (int64_t)(SIZES[0] + SIZES[1] + SIZES[2]) + 4 * MiB);
  /* `as` names the replica; a second pull makes version 2 of it. */
  uint64_t id2 = pull_task(&c, "key: 'w/model', from: 'a', as: 'copy/m'");
  wait_task(&c, id2, status, err, sizeof status);
  CHECK_STR_EQ(status, "completed");
  CHECK(key_holds(B.socket, "copy/m", SIZES, 3));
  CHECK_EQ_INT(server_info_int(&B, "transfers.pulls_done"), 2);
  CHECK_EQ_INT(server_info_int(&A, "transfers.lends_done"), 2);
  CHECK(server_wait_info(&A, "transfers.lends", 0));
  /* Deleted, the receiver's budget is back where it was. */
  CHECK_RPC(&c, ST_OK, NULL, "[0, 5, 'delete', [{key: 'w/model'}]]");
  CHECK_RPC(&c, ST_OK, NULL, "[0, 6, 'delete', [{key: 'copy/m'}]]");
  CHECK(server_wait_info(&B, "memory.cpu.used_bytes", used0));
  rc_close(&c);
  stop_two();
}

TEST(refusals_leave_nothing_behind) {
  CHECK(start_two("memory_budget = { cpu = 16777216 },") == 0);
  CHECK(put_key(A.socket, "w/big", SIZES, 3));         /* 25 MiB: past b's 16 MiB */
  CHECK(put_key(A.socket, "secret", SIZES, 1));
  int64_t used0 = server_info_int(&B, "memory.cpu.used_bytes");
  int fds0 = settled_fds(B.pid);
  OPEN_RC(c, B.socket);
  char status[600], err[600];
  /* Not exported. */
  uint64_t id = pull_task(&c, "key: 'secret', from: 'a'");
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK_CONTAINS(err, "key 'secret' is not exported to peers (peer.export of server 'a')");
  /* No such key there. */
  id = pull_task(&c, "key: 'w/none', from: 'a'");
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK_CONTAINS(err, "w/none");
  /* Not a peer. */
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "'z' is not a peer of this server (peer.peers)",
            "[0, 7, 'pull', [{key: 'w/big', from: 'z'}]]");
  /* Over the receiver's budget: refused before any byte moves. */
  id = pull_task(&c, "key: 'w/big', from: 'a'");
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK_CONTAINS(err, "nothing moved");
  CHECK_CONTAINS(err, "memory_budget");
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "w/big", "[0, 8, 'get', [{key: 'w/big'}]]");
  CHECK_EQ_INT(server_info_int(&A, "transfers.lends_done") + server_info_int(&A, "transfers.lends_failed"), 0);
  CHECK(server_wait_info(&B, "memory.cpu.used_bytes", used0));
  CHECK(server_wait_info(&B, "arenas.count", 0));
  rc_close(&c);
  CHECK_EQ_INT(settled_fds(B.pid), fds0);
  stop_two();
}

/* b's UCX says it is 1.99.7 (the real library behind another version
 * number): the link comes up, and a pull is refused naming both
 * versions, before anything is allocated. */
TEST(a_ucx_version_that_differs_is_refused) {
#ifndef ST_OTHER_UCP
  fprintf(stderr, "   skipped: no libucp to link a UCX of another version against\n");
  return;
#else
  CHECK(start_two_with_ucx(ST_OTHER_UCP) == 0);
  CHECK(put_key(A.socket, "w/model", SIZES, 3));
  int64_t used0 = server_info_int(&B, "memory.cpu.used_bytes");
  OPEN_RC(c, B.socket);
  uint64_t id = pull_task(&c, "key: 'w/model', from: 'a'");
  char status[600], err[600];
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK_CONTAINS(err, "1.99.7");
  CHECK_CONTAINS(err, "1.13");
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "w/model", "[0, 8, 'get', [{key: 'w/model'}]]");
  CHECK_EQ_INT(server_info_int(&B, "memory.cpu.used_bytes"), used0);
  CHECK_EQ_INT(server_info_int(&A, "transfers.lends_done") + server_info_int(&A, "transfers.lends_failed"), 0);
  rc_close(&c);
  stop_two();
#endif
}

/* replicate: a pushes to peers that take its pushes (as_uid), each a
 * pull of theirs; a peer whose config names no uid for a refuses. */
TEST(replicate_pushes_to_peers_that_take_pushes) {
  stt_server_t C;
  CHECK(start_two("memory_budget = { cpu = 1073741824 },") == 0);   /* b: no as_uid */
  stt_server_init(&C);
  char addr[128];
  listen_addr(&A, addr, sizeof addr);
  peer_config(&C, "memory_budget = { cpu = 1073741824 }, peer = { id = 'c', secret = '%s', "
              "peers = { a = { addr = '%s', as_uid = 65534 } } },", key, addr);
  CHECK(stt_server_start(&C) == 0);
  CHECK(wait_peer(&C, "a", "up", NULL) && wait_peer(&A, "c", "up", NULL));
  CHECK(put_key(A.socket, "w/model", SIZES, 3));
  OPEN_RC(c, A.socket);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 1, 'replicate', [{key: 'w/model', to: ['c', 'b']}]]") == 1 &&
        !m.error);
  uint64_t id = (uint64_t)obj_int(obj_get(m.result, "task_id"));
  msg_free(&m);
  char status[2000], err[2000];
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK_CONTAINS(err, "1 of 2 peers failed");
  CHECK_CONTAINS(err, "c: ok");
  CHECK_CONTAINS(err, "server 'b' takes no pushes from 'a'");
  /* c holds every byte, owned by the uid its config names for a. */
  CHECK(key_holds(C.socket, "w/model", SIZES, 3));
  OPEN_RC(cc, C.socket);
  CHECK(rc_rpcf(&cc, &m, "[0, 2, 'keys', [{all: true}]]") == 1 && !m.error);
  CHECK(m.result->type == MSGPACK_OBJECT_ARRAY && m.result->via.array.size == 1);
  CHECK_EQ_INT(obj_int(obj_get(&m.result->via.array.ptr[0], "uid")), 65534);
  CHECK_STR_EQ(obj_str(obj_path(&m.result->via.array.ptr[0], "origin.peer")), "a");
  msg_free(&m);
  rc_close(&cc);
  OPEN_RC(cb, B.socket);   /* b refused: nothing there */
  CHECK_RPC(&cb, ST_ERR_NOT_FOUND, "w/model", "[0, 3, 'get', [{key: 'w/model'}]]");
  rc_close(&cb);
  /* Once more to c alone: completed, version 2 there. */
  CHECK(rc_rpcf(&c, &m, "[0, 4, 'replicate', [{key: 'w/model', to: ['c'], as: 'w/copy'}]]") ==
            1 &&
        !m.error);
  id = (uint64_t)obj_int(obj_get(m.result, "task_id"));
  msg_free(&m);
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "completed");
  CHECK(rc_rpcf(&c, &m, "[0, 5, 'result', [{task_id: %llu}]]", (unsigned long long)id) == 1 &&
        !m.error);
  CHECK_EQ_INT(obj_int(obj_path(obj_get(m.result, "value"), "peers.c.version")), 1);
  msg_free(&m);
  CHECK(key_holds(C.socket, "w/copy", SIZES, 3));
  /* Not a peer; a key it cannot see. */
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "'z' is not a peer", "[0, 6, 'replicate', [{key: 'w/model', to: ['z']}]]");
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "w/none", "[0, 7, 'replicate', [{key: 'w/none', to: ['c']}]]");
  rc_close(&c);
  stt_server_stop(&C);
  stt_server_cleanup(&C);
  stop_two();
}

/* SIGSTOPs the helper of s (info.transfers.helper_pid): its transfers
 * hang. The pid, or 0. */
static pid_t helper_of(const stt_server_t *s) { return (pid_t)server_info_int(s, "transfers.helper_pid"); }

TEST(a_helper_killed_mid_transfer_fails_the_pull_cleanly) {
  CHECK(start_two("memory_budget = { cpu = 1073741824 },") == 0);
  CHECK(put_key(A.socket, "w/model", SIZES, 3));
  int64_t used0 = server_info_int(&B, "memory.cpu.used_bytes");
  /* a's helper stopped: the transfer opens on both sides and hangs. */
  pid_t ha = helper_of(&A), hb = helper_of(&B);
  CHECK(ha > 0 && hb > 0);
  CHECK(kill(ha, SIGSTOP) == 0);
  OPEN_RC(c, B.socket);
  uint64_t id = pull_task(&c, "key: 'w/model', from: 'a'");
  CHECK(server_wait_info(&A, "transfers.lends", 1));
  CHECK(kill(hb, SIGKILL) == 0);
  char status[600], err[600];
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK_CONTAINS(err, "the transfer helper exited (signal 9)");
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "w/model", "[0, 8, 'get', [{key: 'w/model'}]]");
  CHECK(server_wait_info(&B, "memory.cpu.used_bytes", used0));
  CHECK(kill(ha, SIGCONT) == 0);
  /* a lets its lend go (the receiver aborted it); b's new helper serves
   * the next pull. */
  CHECK(server_wait_info(&A, "transfers.lends", 0));
  CHECK(server_wait_info(&B, "transfers.helper_spawns", 2));
  CHECK(helper_of(&B) > 0 && helper_of(&B) != hb);
  id = pull_task(&c, "key: 'w/model', from: 'a'");
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "completed");
  CHECK(key_holds(B.socket, "w/model", SIZES, 3));
  rc_close(&c);
  stop_two();
}

TEST(the_source_killed_mid_transfer_fails_the_pull_cleanly) {
  CHECK(start_two("memory_budget = { cpu = 1073741824 },") == 0);
  CHECK(put_key(A.socket, "w/model", SIZES, 3));
  int64_t used0 = server_info_int(&B, "memory.cpu.used_bytes");
  int fds0 = settled_fds(B.pid);
  pid_t ha = helper_of(&A);
  CHECK(ha > 0 && kill(ha, SIGSTOP) == 0);
  OPEN_RC(c, B.socket);
  uint64_t id = pull_task(&c, "key: 'w/model', from: 'a'");
  CHECK(server_wait_info(&A, "transfers.lends", 1));
  kill(A.pid, SIGKILL);
  waitpid(A.pid, NULL, 0);
  A.pid = 0;
  kill(ha, SIGKILL);
  char status[600], err[600];
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK_CONTAINS(err, "peer 'a'");
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "w/model", "[0, 8, 'get', [{key: 'w/model'}]]");
  CHECK(serves(&B));
  CHECK(server_wait_info(&B, "memory.cpu.used_bytes", used0));
  CHECK(server_wait_info(&B, "transfers.pulls", 0));
  rc_close(&c);
  CHECK_EQ_INT(settled_fds(B.pid), fds0 - 1);   /* the link to a is gone */
  stop_two();
}

TEST(a_cancelled_pull_leaves_nothing) {
  CHECK(start_two("memory_budget = { cpu = 1073741824 },") == 0);
  CHECK(put_key(A.socket, "w/model", SIZES, 3));
  int64_t used0 = server_info_int(&B, "memory.cpu.used_bytes");
  pid_t ha = helper_of(&A);
  CHECK(ha > 0 && kill(ha, SIGSTOP) == 0);
  OPEN_RC(c, B.socket);
  uint64_t id = pull_task(&c, "key: 'w/model', from: 'a'");
  CHECK(server_wait_info(&A, "transfers.lends", 1));
  CHECK_RPC(&c, ST_OK, NULL, "[0, 9, 'cancel', [{task_id: %llu}]]", (unsigned long long)id);
  char status[600], err[600];
  wait_task(&c, id, status, err, sizeof status);
  CHECK_STR_EQ(status, "cancelled");
  CHECK(kill(ha, SIGCONT) == 0);
  CHECK_RPC(&c, ST_ERR_NOT_FOUND, "w/model", "[0, 8, 'get', [{key: 'w/model'}]]");
  CHECK(server_wait_info(&B, "memory.cpu.used_bytes", used0));
  CHECK(server_wait_info(&A, "transfers.lends", 0));
  CHECK(serves(&A));
  rc_close(&c);
  stop_two();
}

int main(void) {
  if (!getenv("ST_SERVER_BIN")) stt_skip("ST_SERVER_BIN is not set");
  char why[256];
  st__tls_conf_t none = {0};
  st__tls_ctx_t *ctx = NULL;
  none.secret = "/nonexistent";
  if (st__tls_ctx_new(&none, &ctx, why, sizeof why) == ST_ERR_CAPABILITY) stt_skip(why);
  /* UCX over TCP on loopback only (no shared memory: the engine's path
   * between hosts). */
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  signal(SIGPIPE, SIG_IGN);
  RUN(a_pulled_key_holds_every_byte_and_its_origin);
  RUN(refusals_leave_nothing_behind);
  RUN(a_ucx_version_that_differs_is_refused);
  RUN(replicate_pushes_to_peers_that_take_pushes);
  RUN(a_helper_killed_mid_transfer_fails_the_pull_cleanly);
  RUN(the_source_killed_mid_transfer_fails_the_pull_cleanly);
  RUN(a_cancelled_pull_leaves_nothing);
  return stt_summary();
}

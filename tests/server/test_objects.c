/* Objects, leases and the cache over the real socket: a cache hit returns
 * the same object and arena; cache = false builds every time; invalidation
 * makes the next call build a new object while mappings stay valid;
 * release is idempotent; ensure_live and object_info report gone objects
 * and foreign server ids as STALE_HANDLE; a client killed with SIGKILL
 * gives its leases back; plain endpoints produce no object. */
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

TEST(cache_hit_returns_the_same_object) {
  OPEN_RC(c, S.socket);
  int64_t hits0 = rc_info_int(&c, "counters.cache_hits");
  int64_t builds0 = rc_info_int(&c, "counters.builds");
  msg_t m1, m2, m3;
  CHECK(rk_call(&c, "lin", "n", 5, &m1) == 1 && !m1.error);
  CHECK(rk_call(&c, "lin", "n", 5, &m2) == 1 && !m2.error);
  CHECK(rk_call(&c, "lin", "n", 6, &m3) == 1 && !m3.error);
  CHECK(obj_field(&m1, "id") > 0);
  CHECK_EQ_INT(obj_field(&m2, "id"), obj_field(&m1, "id"));
  CHECK_EQ_INT(arena_id(&m2, 0), arena_id(&m1, 0));
  CHECK(obj_field(&m3, "id") != obj_field(&m1, "id"));
  CHECK_STR_EQ(obj_str(obj_get(obj_get(m1.result, "object"), "cache_key")), "lin:5");
  CHECK_STR_EQ(obj_str(obj_get(obj_get(m1.result, "object"), "server_id")),
               obj_str(obj_get(obj_get(m2.result, "object"), "server_id")));
  CHECK_EQ_INT(obj_field(&m1, "cached"), 1);
  CHECK_EQ_INT(obj_field(&m1, "refcount"), 1);
  CHECK_EQ_INT(obj_field(&m2, "refcount"), 2);   /* managed: one lease per reply */
  CHECK_EQ_INT(rc_info_int(&c, "counters.cache_hits"), hits0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "counters.builds"), builds0 + 2);
  uint64_t oid = (uint64_t)obj_field(&m1, "id");
  /* object_info, and objects lists it. */
  CHECK_EQ_INT(info_field(&c, oid, "refcount"), 2);
  CHECK_EQ_INT(info_field(&c, oid, "bytes"), 20);
  msg_t mi;
  CHECK(rk_id(&c, "object_info", "object_id", oid, &mi) == 1 && !mi.error);
  CHECK_STR_EQ(obj_str(obj_get(mi.result, "endpoint")), "lin");
  CHECK_STR_EQ(obj_str(obj_get(mi.result, "device")), "cpu");
  CHECK(obj_get(mi.result, "created_at")->via.f64 > 1e9);
  CHECK_EQ_INT(obj_int(&obj_get(mi.result, "arena_ids")->via.array.ptr[0]), arena_id(&m1, 0));
  msg_free(&mi);
  CHECK(rc_rpcf(&c, &mi, "[0, 9, 'objects', []]") == 1 && !mi.error);
  CHECK(mi.result->type == MSGPACK_OBJECT_ARRAY && mi.result->via.array.size >= 2);
  CHECK(obj_int(obj_get(&mi.result->via.array.ptr[0], "id")) <
        obj_int(obj_get(&mi.result->via.array.ptr[1], "id")));
  msg_free(&mi);
  msg_free(&m1);
  msg_free(&m2);
  msg_free(&m3);
  rc_close(&c);
}

TEST(cache_false_builds_every_time) {
  OPEN_RC(c, S.socket);
  int64_t builds0 = rc_info_int(&c, "counters.builds");
  msg_t m1, m2;
  CHECK(rk_call(&c, "fresh", "n", 3, &m1) == 1 && !m1.error);
  CHECK(rk_call(&c, "fresh", "n", 3, &m2) == 1 && !m2.error);
  CHECK(obj_field(&m1, "id") != obj_field(&m2, "id"));
  CHECK(arena_id(&m1, 0) != arena_id(&m2, 0));
  CHECK_EQ_INT(obj_field(&m1, "cached"), 0);
  CHECK_EQ_INT(obj_field(&m1, "refcount"), 1);
  CHECK(obj_get(obj_get(m1.result, "object"), "cache_key")->type == MSGPACK_OBJECT_NIL);
  CHECK_EQ_INT(rc_info_int(&c, "counters.builds"), builds0 + 2);
  msg_free(&m1);
  msg_free(&m2);
  rc_close(&c);
}

TEST(plain_and_cached_unmanaged_endpoints) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rk_call(&c, "plain", NULL, 0, &m) == 1 && !m.error);
  CHECK(obj_get(m.result, "object") == NULL);
  msg_free(&m);
  /* cache = true without a format key: the key is the canonical JSON of
   * every bound argument (defaults included); no lease. */
  CHECK(rk_call(&c, "keyed", "n", 2, &m) == 1 && !m.error);
  CHECK_STR_EQ(obj_str(obj_get(obj_get(m.result, "object"), "cache_key")),
               "{\"n\":2,\"scale\":0.5,\"tag\":\"t\"}");
  CHECK_EQ_INT(obj_field(&m, "lease"), 0);
  CHECK_EQ_INT(obj_field(&m, "refcount"), 0);
  CHECK_EQ_INT(obj_field(&m, "cached"), 1);
  int64_t id = obj_field(&m, "id");
  msg_free(&m);
  CHECK(rk_call(&c, "keyed", "n", 2, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_field(&m, "id"), id);
  msg_free(&m);
  /* release of an object this connection holds no lease on. */
  CHECK(rk_id(&c, "release", "object_id", (uint64_t)id, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "released")), 0);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "destroyed")), 0);
  msg_free(&m);
  rc_close(&c);
}

TEST(invalidate_then_call_rebuilds) {
  OPEN_RC(c, S.socket);
  msg_t m1, m2, mi;
  CHECK(rk_call(&c, "lin", "n", 7, &m1) == 1 && !m1.error);
  uint64_t old = (uint64_t)obj_field(&m1, "id");
  /* Map the object's arena: the mapping outlives the invalidation. */
  CHECK(rk_call(&c, "lin", "n", 7, &m2) == 1 && !m2.error);
  msg_free(&m2);
  CHECK(rc_rpcf(&c, &m2, "[0, 3, 'call', [{endpoint: 'lin', args: {n: 7}}]]") == 1 && !m2.error);
  CHECK_EQ_INT(c.nfds, 1);
  size_t bytes = (size_t)obj_int(obj_get(&obj_get(m2.result, "arenas")->via.array.ptr[0], "bytes"));
  float *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, c.fds[0], 0);
  CHECK(map != MAP_FAILED);
  rc_drop_fds(&c);
  msg_free(&m2);
  CHECK(rc_rpcf(&c, &mi,
                "[0, 4, 'invalidate_call', [{endpoint: 'lin', args: {n: 7}}]]") == 1 && !mi.error);
  CHECK(mi.result->type == MSGPACK_OBJECT_BOOLEAN && mi.result->via.boolean);
  msg_free(&mi);
  CHECK(rc_rpcf(&c, &mi,
                "[0, 5, 'invalidate_call', [{endpoint: 'lin', args: {n: 7}}]]") == 1 && !mi.error);
  CHECK(mi.result->type == MSGPACK_OBJECT_BOOLEAN && !mi.result->via.boolean);
  msg_free(&mi);
  /* Still leased by this connection: alive, no longer cached. */
  CHECK_EQ_INT(info_field(&c, old, "cached"), 0);
  CHECK_EQ_INT(info_field(&c, old, "refcount"), 3);
  CHECK(rk_call(&c, "lin", "n", 7, &m2) == 1 && !m2.error);
  CHECK(obj_field(&m2, "id") != (int64_t)old);
  CHECK(arena_id(&m2, 0) != arena_id(&m1, 0));
  msg_free(&m2);
  for (int i = 0; i < 7; i++) CHECK(map[i] == (float)i);
  munmap(map, bytes);
  /* invalidate_endpoint drops every entry of the endpoint. */
  CHECK(rk_call(&c, "lin", "n", 8, &m2) == 1 && !m2.error);
  msg_free(&m2);
  CHECK(rc_rpcf(&c, &mi, "[0, 6, 'invalidate_endpoint', [{endpoint: 'lin'}]]") == 1 && !mi.error);
  CHECK(obj_int(mi.result) >= 2);
  msg_free(&mi);
  CHECK_RPC(&c, ST_ERR_UNKNOWN_ENDPOINT, NULL,
            "[0, 7, 'invalidate_endpoint', [{endpoint: 'nosuch'}]]");
  msg_free(&m1);
  rc_close(&c);
}

TEST(release_is_idempotent_and_ensure_live_goes_stale) {
  rc_t c, d;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(rc_open(&d, S.socket) == 0);
  msg_t m;
  CHECK(rk_call(&c, "fresh", "n", 2, &m) == 1 && !m.error);
  uint64_t oid = (uint64_t)obj_field(&m, "id");
  char sid[64];
  snprintf(sid, sizeof sid, "%s", obj_str(obj_get(obj_get(m.result, "object"), "server_id")));
  msg_free(&m);
  CHECK(rk_id(&c, "ensure_live", "object_id", oid, &m) == 1 && !m.error);
  CHECK(m.result->type == MSGPACK_OBJECT_BOOLEAN && m.result->via.boolean);
  msg_free(&m);
  CHECK(rc_rpcf(&c, &m,
                "[0, 8, 'ensure_live', [{object_id: %lld, server_id: '%s'}]]",
                (long long)oid, sid) == 1 && !m.error);
  msg_free(&m);
  CHECK_RPC(&c, ST_ERR_STALE_HANDLE, "belongs to server 0123456789abcdef",
            "[0, 8, 'ensure_live', [{object_id: %lld, "
            "server_id: '0123456789abcdef0123456789abcdef'}]]",
            (long long)oid);
  /* Another connection holds no lease: nothing to release. */
  CHECK(rk_id(&d, "release", "object_id", oid, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "released")), 0);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "destroyed")), 0);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "refcount")), 1);
  msg_free(&m);
  CHECK(rk_id(&c, "release", "object_id", oid, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "released")), 1);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "destroyed")), 1);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "refcount")), 0);
  msg_free(&m);
  CHECK(rk_id(&c, "release", "object_id", oid, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "released")), 0);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "destroyed")), 1);
  msg_free(&m);
  CHECK(rk_id(&c, "ensure_live", "object_id", oid, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_STALE_HANDLE, NULL);
  msg_free(&m);
  CHECK(rk_id(&c, "object_info", "object_id", oid, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_STALE_HANDLE, NULL);
  msg_free(&m);
  /* Bad parameters. */
  CHECK_RPC(&c, ST_ERR_INVALID_ARGUMENT, NULL, "[0, 9, 'release', [{object_id: '7'}]]");
  CHECK(rc_rpcf(&c, &m, "[0, 10, 'release', []]") == 1);
  CHECK_CONTAINS(msg_errmsg(&m), "'object_id' is required");
  msg_free(&m);
  rc_close(&c);
  rc_close(&d);
}

/* A child process that takes two leases, reports the object id on `out`
 * and waits to be killed. */
static void leaser(int out) {
  rc_t c;
  if (rc_open(&c, S.socket) != 0) _exit(2);
  msg_t m;
  uint64_t oid = 0;
  for (int i = 0; i < 2; i++) {
    if (rk_call(&c, "lin", "n", 9, &m) != 1 || m.error) _exit(3);
    oid = (uint64_t)obj_field(&m, "id");
    msg_free(&m);
  }
  if (write(out, &oid, sizeof oid) != sizeof oid) _exit(4);
  for (;;) pause();
}

TEST(sigkill_gives_the_leases_back) {
  OPEN_RC(w, S.socket);
  int p[2];
  CHECK(pipe(p) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    leaser(p[1]);
  }
  close(p[1]);
  uint64_t oid = 0;
  CHECK(read(p[0], &oid, sizeof oid) == sizeof oid);
  close(p[0]);
  CHECK_EQ_INT(info_field(&w, oid, "refcount"), 2);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  double end = stt_now_ms() + 5000;
  while (info_field(&w, oid, "refcount") != 0 && stt_now_ms() < end) stt_sleep_ms(2);
  CHECK_EQ_INT(info_field(&w, oid, "refcount"), 0);
  CHECK_EQ_INT(info_field(&w, oid, "cached"), 1);   /* the cache keeps it */
  /* Uncached now: nothing holds it, it is destroyed. */
  msg_t m;
  CHECK(rc_rpcf(&w, &m,
                "[0, 4, 'invalidate_call', [{endpoint: 'lin', args: {n: 9}}]]") == 1 && !m.error);
  msg_free(&m);
  CHECK(rk_id(&w, "ensure_live", "object_id", oid, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_STALE_HANDLE, NULL);
  msg_free(&m);
  rc_close(&w);
}

TEST(disconnect_releases_uncached_objects) {
  rc_t c, w;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(rc_open(&w, S.socket) == 0);
  msg_t m;
  CHECK(rk_call(&c, "fresh", "n", 64, &m) == 1 && !m.error);
  uint64_t oid = (uint64_t)obj_field(&m, "id");
  msg_free(&m);
  CHECK_EQ_INT(info_field(&w, oid, "refcount"), 1);
  rc_close(&c);
  double end = stt_now_ms() + 5000;
  while (info_field(&w, oid, "refcount") != INT64_MIN && stt_now_ms() < end) stt_sleep_ms(2);
  CHECK_EQ_INT(info_field(&w, oid, "refcount"), INT64_MIN);   /* STALE_HANDLE */
  rc_close(&w);
}

static const stt_endpoint_t endpoints[] = {
    {"lin.lua",
     "return st.endpoint{ name = 'lin', managed = true,\n"
     "  cache_format_key = 'lin:{n}', params = { n = 4 },\n"
     "  build = function(a) return st.arange{a.n, dtype = 'float32'} end }\n"},
    {"fresh.lua",
     "return st.endpoint{ name = 'fresh', managed = true, cache = false,\n"
     "  params = { n = 4 },\n"
     "  build = function(a) return st.zeros{a.n} end }\n"},
    {"keyed.lua",
     "return st.endpoint{ name = 'keyed', cache = true,\n"
     "  params = { n = 4, tag = 't', scale = 0.5 },\n"
     "  build = function(a) return st.zeros{a.n} end }\n"},
    {"plain.lua",
     "return st.endpoint{ name = 'plain', build = function() return st.ones{3} end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 2,", endpoints);
  RUN(cache_hit_returns_the_same_object);
  RUN(cache_false_builds_every_time);
  RUN(plain_and_cached_unmanaged_endpoints);
  RUN(invalidate_then_call_rebuilds);
  RUN(release_is_idempotent_and_ensure_live_goes_stale);
  RUN(sigkill_gives_the_leases_back);
  RUN(disconnect_releases_uncached_objects);
  return stt_server_finish(&S);
}

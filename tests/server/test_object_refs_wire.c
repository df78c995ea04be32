/* Objects sent once per connection (docs/protocol.md, "Objects sent
 * once"), against a real stserver over raw sockets:
 *   - a client whose hello lists "object_refs" gets a cached object's
 *     result in full, marked `object_kept`, once; later calls of it on the
 *     same connection are answered {object, same: true}: no value, no
 *     arenas, no descriptor, the same object map;
 *   - `objects_freed` (on any method) makes the next reply full again;
 *   - a managed, cached object goes the same way, with a lease per reply:
 *     the `same` reply says `lease` and the refcount after it, and each
 *     `release` gives one back;
 *   - without the feature, for managed results that are not cached and
 *     for plain results, every reply is in full, unmarked, as before;
 *   - another connection, a new hello, and an invalidated (rebuilt)
 *     object start in full;
 *   - a malformed `objects_freed` is INVALID_ARGUMENT;
 *   - the server remembers at most 4096 objects per connection.
 */
#include "check.h"
#include "wire.h"

static stt_server_t S;

static const char EP_C16[] =
    "return st.endpoint{ name = 'c16', cache = true,\n"
    "  build = function() return st.arange{16, dtype = 'float32'} end }\n";
static const char EP_NUM[] =
    "return st.endpoint{ name = 'num', cache = true, params = { k = 0 },\n"
    "  build = function(a) return a.k end }\n";
static const char EP_M16[] =
    "return st.endpoint{ name = 'm16', managed = true,\n"
    "  build = function() return st.arange{16, dtype = 'float32'} end }\n";
static const char EP_MC16[] =
    "return st.endpoint{ name = 'mc16', managed = true, cache = true,\n"
    "  build = function() return st.arange{16, dtype = 'float32'} end }\n";
static const char EP_PLAIN[] =
    "return st.endpoint{ name = 'plain',\n"
    "  build = function() return st.arange{16, dtype = 'float32'} end }\n";

static uint32_t next_id = 100;

/* Connects and says hello with `features` (a list's items, may be ""). */
static int open_hello(rc_t *c, const char *features) {
  return rc_open_hello(c, S.socket, features);
}

/* What one call brought: descriptors, whether the result had a value and
 * arenas, `object_kept`, `same`, and the object's id, refcount and
 * cached flag. */
typedef struct {
  int fds, value, arenas, kept, same, nkeys;
  int64_t id, refcount;
  int cached, lease;
} got_t;

static int flag(const msgpack_object *o) {
  return o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean;
}

static int call(rc_t *c, const char *ep, const char *extra, got_t *g) {
  memset(g, 0, sizeof *g);
  msg_t m;
  if (rc_call_extra(c, next_id++, ep, extra, &m, &g->fds) != 0) return -1;
  g->nkeys = (int)m.result->via.map.size;
  g->value = obj_get(m.result, "value") != NULL;
  g->arenas = obj_get(m.result, "arenas") != NULL;
  g->kept = flag(obj_get(m.result, "object_kept"));
  g->same = flag(obj_get(m.result, "same"));
  const msgpack_object *o = obj_get(m.result, "object");
  g->id = obj_int(obj_get(o, "id"));
  g->refcount = obj_int(obj_get(o, "refcount"));
  g->cached = flag(obj_get(o, "cached"));
  g->lease = flag(obj_get(o, "lease"));
  msg_free(&m);
  rc_drop_fds(c);
  return 0;
}

/* A full reply that the server counts as held by the connection. */
#define CHECK_FULL_KEPT(g) CHECK((g).value && (g).arenas && (g).fds == 1 && (g).kept && !(g).same)
/* {object, same: true} and nothing else. */
#define CHECK_SAME(g) CHECK((g).same && (g).nkeys == 2 && !(g).value && !(g).arenas && (g).fds == 0)

TEST(a_cached_object_goes_in_full_once_then_as_the_same) {
  rc_t c;
  CHECK(open_hello(&c, "'object_refs'") == 0);
  got_t g1, g2, g3;
  CHECK(call(&c, "c16", NULL, &g1) == 0);
  CHECK_FULL_KEPT(g1);
  CHECK(g1.id > 0 && g1.cached && !g1.lease && g1.refcount == 0);
  CHECK(call(&c, "c16", NULL, &g2) == 0);
  CHECK(call(&c, "c16", NULL, &g3) == 0);
  CHECK_SAME(g2);
  CHECK_SAME(g3);
  /* The object map is the one sent in full. */
  CHECK(g2.id == g1.id && g2.cached && !g2.lease && g2.refcount == 0 && g3.id == g1.id);
  rc_close(&c);
}

TEST(objects_freed_sends_it_in_full_again) {
  rc_t c;
  CHECK(open_hello(&c, "'object_refs'") == 0);
  got_t g;
  CHECK(call(&c, "c16", NULL, &g) == 0);
  CHECK_FULL_KEPT(g);
  int64_t id = g.id;
  /* On another method: dropped before the request is handled (unknown ids
   * are ignored). */
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 7, 'ping', [{objects_freed: [%lld, 999999]}]]", (long long)id) == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  msg_free(&m);
  CHECK(call(&c, "c16", NULL, &g) == 0);
  CHECK_FULL_KEPT(g);
  CHECK(g.id == id);
  /* On the call itself: its own reply is full. */
  char extra[64];
  snprintf(extra, sizeof extra, ", objects_freed: [%lld]", (long long)id);
  CHECK(call(&c, "c16", extra, &g) == 0);
  CHECK_FULL_KEPT(g);
  CHECK(call(&c, "c16", NULL, &g) == 0);
  CHECK_SAME(g);
  rc_close(&c);
}

TEST(without_the_feature_every_reply_is_full) {
  rc_t c;
  CHECK(open_hello(&c, "'arena_refs'") == 0);
  for (int i = 0; i < 3; i++) {
    got_t g;
    CHECK(call(&c, "c16", NULL, &g) == 0);
    CHECK(g.value && g.arenas && !g.kept && !g.same);
  }
  rc_close(&c);
  OPEN_RC(d, S.socket);   /* no hello at all */
  got_t g;
  CHECK(call(&d, "c16", NULL, &g) == 0);
  CHECK(call(&d, "c16", NULL, &g) == 0);
  CHECK(g.value && g.fds == 1 && !g.kept && !g.same);
  rc_close(&d);
}

/* release {object_id: id}: the refcount left, or -1. */
static int64_t release(rc_t *c, int64_t id) {
  msg_t m;
  if (rc_rpcf(c, &m, "[0, %u, 'release', [{object_id: %lld}]]", next_id++, (long long)id) != 1)
    return -1;
  int64_t left = m.error ? -1 : obj_int(obj_get(m.result, "refcount"));
  msg_free(&m);
  return left;
}

TEST(a_managed_cached_object_goes_as_the_same_with_a_lease) {
  rc_t c;
  CHECK(open_hello(&c, "'object_refs'") == 0);
  got_t g1, g2, g3;
  CHECK(call(&c, "mc16", NULL, &g1) == 0);
  CHECK_FULL_KEPT(g1);
  CHECK(g1.id > 0 && g1.cached && g1.lease && g1.refcount == 1);
  CHECK(call(&c, "mc16", NULL, &g2) == 0);
  CHECK_SAME(g2);
  CHECK(g2.id == g1.id && g2.cached && g2.lease && g2.refcount == 2);
  /* Each reply gave a lease; each release gives one back. */
  CHECK_EQ_INT(release(&c, g1.id), 1);
  CHECK(call(&c, "mc16", NULL, &g3) == 0);
  CHECK_SAME(g3);
  CHECK(g3.lease && g3.refcount == 2);
  CHECK_EQ_INT(release(&c, g1.id), 1);
  CHECK_EQ_INT(release(&c, g1.id), 0);
  /* No lease left, still cached and still held by the client: the short
   * form again, with a new lease. */
  CHECK(call(&c, "mc16", NULL, &g3) == 0);
  CHECK_SAME(g3);
  CHECK(g3.lease && g3.refcount == 1);
  /* Another connection holds nothing: in full, with its own lease. */
  rc_t d;
  CHECK(open_hello(&d, "'object_refs'") == 0);
  got_t gd;
  CHECK(call(&d, "mc16", NULL, &gd) == 0);
  CHECK_FULL_KEPT(gd);
  CHECK(gd.id == g1.id && gd.refcount == 2);
  /* Freed by the client: in full again, marked again. */
  char extra[64];
  snprintf(extra, sizeof extra, ", objects_freed: [%lld]", (long long)g1.id);
  CHECK(call(&c, "mc16", extra, &g3) == 0);
  CHECK_FULL_KEPT(g3);
  CHECK(g3.lease && g3.refcount == 3);
  rc_close(&d);
  rc_close(&c);
}

TEST(managed_and_plain_results_are_always_full) {
  rc_t c;
  CHECK(open_hello(&c, "'object_refs'") == 0);
  for (int i = 0; i < 3; i++) {
    got_t g;
    CHECK(call(&c, "m16", NULL, &g) == 0);
    /* A lease each time: its refcount and lease are per call. */
    CHECK(g.value && g.fds == 1 && !g.kept && !g.same && g.lease && g.refcount >= 1);
    CHECK(call(&c, "plain", NULL, &g) == 0);
    CHECK(g.value && g.fds == 1 && !g.kept && !g.same && g.id <= 0);   /* no object */
  }
  rc_close(&c);
}

TEST(each_connection_hello_and_rebuilt_object_starts_in_full) {
  rc_t a, b;
  CHECK(open_hello(&a, "'object_refs'") == 0);
  CHECK(open_hello(&b, "'object_refs'") == 0);
  got_t g;
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK_FULL_KEPT(g);
  CHECK(call(&b, "c16", NULL, &g) == 0);
  CHECK_FULL_KEPT(g);
  /* A second hello on a: what was sent before it no longer counts. */
  msg_t m;
  CHECK(rc_rpcf(&a, &m, "[0, 9, 'hello', [{features: ['object_refs']}]]") == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  msg_free(&m);
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK_FULL_KEPT(g);
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK_SAME(g);
  /* Invalidated: the next call builds a new object (a new id), in full. */
  int64_t old = g.id;
  CHECK(rc_rpcf(&a, &m, "[0, 10, 'invalidate_endpoint', [{endpoint: 'c16'}]]") == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  msg_free(&m);
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK_FULL_KEPT(g);
  CHECK(g.id != old);
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK_SAME(g);
  /* A hello without the feature turns it off. */
  CHECK(rc_rpcf(&a, &m, "[0, 11, 'hello', []]") == 1);
  msg_free(&m);
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK(g.value && !g.kept && !g.same);
  rc_close(&a);
  rc_close(&b);
}

TEST(malformed_objects_freed_is_invalid_argument) {
  rc_t c;
  CHECK(open_hello(&c, "'object_refs'") == 0);
  static const frame_case_t bad[] = {
      {"[0, 11, 'ping', [{objects_freed: [0]}]]", ST_ERR_INVALID_ARGUMENT,
       "'objects_freed' must be an array of object ids"},
      {"[0, 12, 'call', [{endpoint: 'c16', objects_freed: 'x'}]]", ST_ERR_INVALID_ARGUMENT,
       "'objects_freed' must be an array"},
  };
  CHECK_RPC_TABLE(&c, bad, sizeof bad / sizeof bad[0]);
  rc_close(&c);
}

/* 4097 cached objects (values without tensors): the first 4096 are
 * remembered, the last goes in full each time. */
TEST(the_server_remembers_at_most_4096_objects_per_connection) {
  rc_t c;
  CHECK(open_hello(&c, "'object_refs'") == 0);
  got_t g;
  int marked = 0;
  char extra[32];
  for (int k = 1; k <= 4097; k++) {
    snprintf(extra, sizeof extra, ", args: {k: %d}", k);
    CHECK(call(&c, "num", extra, &g) == 0);
    CHECK(g.value && !g.same);
    marked += g.kept;
  }
  CHECK_EQ_INT(marked, 4096);
  CHECK(!g.kept);
  CHECK(call(&c, "num", ", args: {k: 4097}", &g) == 0);
  CHECK(g.value && !g.kept && !g.same);
  CHECK(call(&c, "num", ", args: {k: 1}", &g) == 0);
  CHECK(g.same);
  rc_close(&c);
}

int main(void) {
  stt_server_setup(&S, "workers = 1,",
                   (const stt_endpoint_t[]){{"c16.lua", EP_C16},
                                            {"num.lua", EP_NUM},
                                            {"m16.lua", EP_M16},
                                            {"mc16.lua", EP_MC16},
                                            {"plain.lua", EP_PLAIN},
                                            {NULL, NULL}});
  RUN(a_cached_object_goes_in_full_once_then_as_the_same);
  RUN(objects_freed_sends_it_in_full_again);
  RUN(without_the_feature_every_reply_is_full);
  RUN(a_managed_cached_object_goes_as_the_same_with_a_lease);
  RUN(managed_and_plain_results_are_always_full);
  RUN(each_connection_hello_and_rebuilt_object_starts_in_full);
  RUN(malformed_objects_freed_is_invalid_argument);
  RUN(the_server_remembers_at_most_4096_objects_per_connection);
  return stt_server_finish(&S);
}

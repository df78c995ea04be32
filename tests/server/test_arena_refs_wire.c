/* Arenas of objects sent once per connection (docs/protocol.md, "Arenas
 * sent once"), against a real stserver over raw sockets:
 *   - a client whose hello lists "arena_refs" gets an object's arena with
 *     a descriptor and `kept` once; later replies name it {ref: id} and
 *     carry no descriptor (the server's fds_sent stays);
 *   - `unmapped` (on any method) makes the next reply send it again;
 *   - without the feature, and for plain results, every reply carries its
 *     descriptors, as before;
 *   - another connection, and a new hello, start with nothing sent;
 *   - a malformed `unmapped` or `features` is INVALID_ARGUMENT;
 *   - a pipelined burst of calls gets every reply, in order.
 */
#include "check.h"
#include "wire.h"

static stt_server_t S;
static rc_t M;   /* the monitor connection: info */

static const char EP_C16[] =
    "return st.endpoint{ name = 'c16', cache = true,\n"
    "  build = function() return st.arange{16, dtype = 'float32'} end }\n";
static const char EP_PLAIN[] =
    "return st.endpoint{ name = 'plain',\n"
    "  build = function() return st.arange{16, dtype = 'float32'} end }\n";

static uint32_t next_id = 100;

/* Connects and says hello, with the feature or without. */
static int open_hello(rc_t *c, int refs) {
  return rc_open_hello(c, S.socket, refs ? "'arena_refs'" : "");
}

/* What one call of `ep` brought: the descriptors that came with it, its
 * first arena's id (from `id` or `ref`), whether that entry was a {ref}
 * and whether `kept` listed it. 0, or -1 on no reply or an error. */
typedef struct {
  int fds;
  int64_t id;
  int ref;
  int kept;
} got_t;

static int call(rc_t *c, const char *ep, const char *extra, got_t *g) {
  memset(g, 0, sizeof *g);
  msg_t m;
  if (rc_call_extra(c, next_id++, ep, extra, &m, &g->fds) != 0) return -1;
  const msgpack_object *a = obj_get(m.result, "arenas");
  const msgpack_object *e = a && a->via.array.size ? &a->via.array.ptr[0] : NULL;
  const msgpack_object *ref = obj_get(e, "ref");
  g->ref = ref != NULL;
  g->id = ref ? obj_int(ref) : obj_int(obj_get(e, "id"));
  const msgpack_object *k = obj_get(m.result, "kept");
  g->kept = k && k->type == MSGPACK_OBJECT_ARRAY && k->via.array.size == 1 &&
            obj_int(&k->via.array.ptr[0]) == 0;
  msg_free(&m);
  rc_drop_fds(c);
  return 0;
}

/* Names the client does not know are ignored; the reply lists ours. */
TEST(hello_lists_the_feature) {
  OPEN_RC(c, S.socket);
  msg_t m;
  int n = rc_rpcf(&c, &m, "[0, 1, 'hello', [{features: ['arena_refs', 'unknown_one']}]]");
  CHECK(n == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  const msgpack_object *f = obj_get(m.result, "features");
  int listed = 0, objects = 0;
  for (uint32_t i = 0; f && f->type == MSGPACK_OBJECT_ARRAY && i < f->via.array.size; i++) {
    listed |= strcmp(obj_str(&f->via.array.ptr[i]), "arena_refs") == 0;
    objects |= strcmp(obj_str(&f->via.array.ptr[i]), "object_refs") == 0;
  }
  CHECK(listed);
  CHECK(objects);
  msg_free(&m);
  rc_close(&c);
}

TEST(an_object_arena_goes_once_then_by_id) {
  rc_t c;
  CHECK(open_hello(&c, 1) == 0);
  got_t g1, g2, g3;
  CHECK(call(&c, "c16", NULL, &g1) == 0);
  CHECK(g1.fds == 1 && !g1.ref && g1.kept && g1.id > 0);
  int64_t sent = rc_info_int(&M, "counters.fds_sent");
  CHECK(call(&c, "c16", NULL, &g2) == 0);
  CHECK(call(&c, "c16", NULL, &g3) == 0);
  CHECK(g2.fds == 0 && g2.ref && !g2.kept && g2.id == g1.id);
  CHECK(g3.fds == 0 && g3.ref && g3.id == g1.id);
  CHECK(rc_info_int(&M, "counters.fds_sent") == sent);
  rc_close(&c);
}

TEST(unmapped_sends_the_descriptor_again) {
  rc_t c;
  CHECK(open_hello(&c, 1) == 0);
  got_t g;
  CHECK(call(&c, "c16", NULL, &g) == 0);
  int64_t id = g.id;
  CHECK(g.fds == 1 && g.kept);
  /* On another method: dropped before the request is handled. */
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 7, 'ping', [{unmapped: [%lld, 999999]}]]", (long long)id) == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  msg_free(&m);
  CHECK(call(&c, "c16", NULL, &g) == 0);
  CHECK(g.fds == 1 && !g.ref && g.kept && g.id == id);
  /* On the call itself: its own reply sends it again. */
  char extra[64];
  snprintf(extra, sizeof extra, ", unmapped: [%lld]", (long long)id);
  CHECK(call(&c, "c16", extra, &g) == 0);
  CHECK(g.fds == 1 && !g.ref && g.kept);
  CHECK(call(&c, "c16", NULL, &g) == 0);
  CHECK(g.fds == 0 && g.ref);
  rc_close(&c);
}

TEST(without_the_feature_every_reply_carries_descriptors) {
  rc_t c;
  CHECK(open_hello(&c, 0) == 0);
  for (int i = 0; i < 3; i++) {
    got_t g;
    CHECK(call(&c, "c16", NULL, &g) == 0);
    CHECK(g.fds == 1 && !g.ref && !g.kept);
  }
  rc_close(&c);
  /* No hello at all: the same. */
  OPEN_RC(d, S.socket);
  got_t g;
  CHECK(call(&d, "c16", NULL, &g) == 0);
  CHECK(call(&d, "c16", NULL, &g) == 0);
  CHECK(g.fds == 1 && !g.ref);
  rc_close(&d);
}

TEST(plain_results_are_never_kept) {
  rc_t c;
  CHECK(open_hello(&c, 1) == 0);
  got_t g1, g2;
  CHECK(call(&c, "plain", NULL, &g1) == 0);
  CHECK(call(&c, "plain", NULL, &g2) == 0);
  CHECK(g1.fds == 1 && !g1.kept && g2.fds == 1 && !g2.ref && !g2.kept);
  CHECK(g1.id != g2.id);
  rc_close(&c);
}

TEST(each_connection_and_each_hello_starts_with_nothing_sent) {
  rc_t a, b;
  CHECK(open_hello(&a, 1) == 0);
  CHECK(open_hello(&b, 1) == 0);
  got_t g;
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK(g.fds == 1 && g.kept);
  CHECK(call(&b, "c16", NULL, &g) == 0);
  CHECK(g.fds == 1 && !g.ref && g.kept);
  /* A second hello on a: what was sent before it no longer counts. */
  msg_t m;
  CHECK(rc_rpcf(&a, &m, "[0, 9, 'hello', [{features: ['arena_refs']}]]") == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  msg_free(&m);
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK(g.fds == 1 && !g.ref && g.kept);
  /* A hello without the feature turns it off. */
  CHECK(rc_rpcf(&a, &m, "[0, 10, 'hello', []]") == 1);
  msg_free(&m);
  CHECK(call(&a, "c16", NULL, &g) == 0);
  CHECK(g.fds == 1 && !g.ref && !g.kept);
  rc_close(&a);
  rc_close(&b);
}

TEST(malformed_unmapped_or_features_is_invalid_argument) {
  rc_t c;
  CHECK(open_hello(&c, 1) == 0);
  static const frame_case_t bad[] = {
      {"[0, 11, 'ping', [{unmapped: [0]}]]", ST_ERR_INVALID_ARGUMENT,
       "'unmapped' must be an array"},
      {"[0, 12, 'ping', [{unmapped: 'x'}]]", ST_ERR_INVALID_ARGUMENT,
       "'unmapped' must be an array"},
      {"[0, 13, 'hello', [{features: [1]}]]", ST_ERR_INVALID_ARGUMENT,
       "'features' must be an array of strings"},
  };
  CHECK_RPC_TABLE(&c, bad, sizeof bad / sizeof bad[0]);
  rc_close(&c);
}

/* 32 calls in one write: 32 replies in request order; the first sends
 * the arena, the others name it. */
TEST(a_pipelined_burst_gets_every_reply_in_order) {
  rc_t c;
  CHECK(open_hello(&c, 1) == 0);
  mpbuf_t all;
  mpbuf_init(&all);
  for (int i = 0; i < 32; i++) {
    mpbuf_t one;
    mpbuf_text(&one, "[0, %d, 'call', [{endpoint: 'c16'}]]", 1000 + i);
    msgpack_sbuffer_write(&all.sb, one.sb.data, one.sb.size);
    mpbuf_free(&one);
  }
  CHECK(rc_send(&c, all.sb.data, all.sb.size) == 0);
  mpbuf_free(&all);
  int refs = 0;
  for (int i = 0; i < 32; i++) {
    msg_t m;
    CHECK(rc_next(&c, &m, 10000) == 1);
    CHECK(m.id == (uint32_t)(1000 + i) && !m.error);
    const msgpack_object *a = obj_get(m.result, "arenas");
    refs += a && a->via.array.size == 1 && obj_get(&a->via.array.ptr[0], "ref") != NULL;
    msg_free(&m);
  }
  CHECK(refs == 31 && c.nfds == 1);
  rc_close(&c);
}

int main(void) {
  stt_server_setup(&S, "workers = 1,",
                   (const stt_endpoint_t[]){{"c16.lua", EP_C16}, {"plain.lua", EP_PLAIN},
                                            {NULL, NULL}});
  rc_open_or_exit(&M, S.socket);
  RUN(hello_lists_the_feature);
  RUN(an_object_arena_goes_once_then_by_id);
  RUN(unmapped_sends_the_descriptor_again);
  RUN(without_the_feature_every_reply_carries_descriptors);
  RUN(plain_results_are_never_kept);
  RUN(each_connection_and_each_hello_starts_with_nothing_sent);
  RUN(malformed_unmapped_or_features_is_invalid_argument);
  RUN(a_pipelined_burst_gets_every_reply_in_order);
  rc_close(&M);
  return stt_server_finish(&S);
}

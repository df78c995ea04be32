/* libstclient and objects sent once per connection (docs/protocol.md,
 * "Objects sent once"; docs/client.md, "Kept results"):
 *   against a real stserver:
 *   - a cached object called twice on one connection is one result: the
 *     same st_result_t, its tensors the same memory;
 *   - a managed, cached object called again while held is the same
 *     result too, with a lease per call: its object info says the lease
 *     and the refcount of the latest reply, and releases give them back;
 *   - a second connection, a rebuilt object (new id) and
 *     ST_CLIENT_KEEP_OBJECTS=0 give results of their own;
 *   - past ST_CLIENT_KEEP_OBJECTS the oldest kept result is let go (it
 *     stays valid for its user) and its object comes in full again;
 *   against a scripted server:
 *   - the request after the last free carries `objects_freed` with the
 *     id, and the next full reply decodes afresh;
 *   - a `same` to an object never sent with `object_kept`, or whose
 *     object map differs, is PROTOCOL;
 *   - st_client_call_summary says `same`; with ST_CALL_LEND_SAME the
 *     result of a `same` is lent: the caller's other reference is its
 *     last, the connection drops the lent one when its next request
 *     starts (which then says `objects_freed`), st_result_ref keeps it.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"
#include "fixture.h"

static stt_server_t S;
static fake_server_t fs;

static const stt_endpoint_t endpoints[] = {
    {"c16.lua",
     "return st.endpoint{ name = 'c16', cache = true,\n"
     "  build = function() return st.arange{16, dtype = 'float32'} end }\n"},
    {"mc16.lua",
     "return st.endpoint{ name = 'mc16', cache = true, managed = true,\n"
     "  build = function() return st.arange{16, dtype = 'float32'} end }\n"},
    {"num.lua",
     "return st.endpoint{ name = 'num', cache = true, params = { k = 0 },\n"
     "  build = function(a) return st.full{4, value = a.k} end }\n"},
    {NULL, NULL},
};

static st_result_t *call(st_client_t *c, const char *ep, int k) {
  st_result_t *r = NULL;
  st_args_t *a = NULL;
  if (k) {
    a = st_args_new();
    st_args_int(a, "k", k);
  }
  stt_client_report(c, ep, st_client_call(c, ep, a, &r));
  st_args_free(a);
  return r;
}

static uint64_t object_id(const st_result_t *r) {
  st_object_info_t o;
  return r && st_result_object(r, &o) == ST_OK ? o.id : 0;
}

TEST(a_cached_object_called_again_is_the_same_result) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *r1 = call(c, "c16", 0);
  st_result_t *r2 = call(c, "c16", 0);
  CHECK(r1 && r2);
  CHECK(r1 == r2);
  CHECK(st_result_tensor(r2, 0)->data == st_result_tensor(r1, 0)->data);
  CHECK(((const float *)st_result_tensor(r2, 0)->data)[15] == 15.0f);
  st_result_free(r1);
  /* Still one reference: readable. */
  CHECK(((const float *)st_result_tensor(r2, 0)->data)[3] == 3.0f);
  st_result_free(r2);
  /* Freed: the server is told, and the next call decodes in full. */
  st_result_t *r3 = call(c, "c16", 0);
  CHECK(r3 && ((const float *)st_result_tensor(r3, 0)->data)[15] == 15.0f);
  st_result_t *r4 = call(c, "c16", 0);
  CHECK(r4 == r3);
  st_result_free(r3);
  st_result_free(r4);
  st_client_close(c);
}

static int64_t released_refcount(st_client_t *c, uint64_t id) {
  int released = 0, destroyed = 0;
  int64_t left = -1;
  stt_client_report(c, "release", st_client_release(c, id, &released, &destroyed, &left));
  return released ? left : -1;
}

TEST(a_held_managed_object_called_again_is_the_same_result_with_a_lease) {
  OPEN_CLIENT(c, S.socket);
  st_result_t *r1 = call(c, "mc16", 0);
  st_object_info_t o1, o2;
  CHECK(r1 && st_result_object(r1, &o1) == ST_OK && o1.managed && o1.lease && o1.refcount == 1);
  st_result_t *r2 = call(c, "mc16", 0);
  CHECK(r2 == r1);
  CHECK(st_result_object(r2, &o2) == ST_OK && o2.id == o1.id && o2.lease && o2.refcount == 2);
  CHECK(((const float *)st_result_tensor(r2, 0)->data)[15] == 15.0f);
  CHECK_EQ_INT(released_refcount(c, o1.id), 1);
  CHECK_EQ_INT(released_refcount(c, o1.id), 0);
  CHECK_EQ_INT(released_refcount(c, o1.id), -1);   /* none left to give back */
  st_result_free(r1);
  st_result_free(r2);
  /* Let go: told, and the next call decodes in full, with its lease. */
  st_result_t *r3 = call(c, "mc16", 0);
  CHECK(r3 && st_result_object(r3, &o2) == ST_OK && o2.lease && o2.refcount == 1);
  CHECK_EQ_INT(released_refcount(c, o1.id), 0);
  st_result_free(r3);
  st_client_close(c);
}

TEST(other_connections_and_rebuilt_objects_get_their_own_results) {
  OPEN_CLIENT(a, S.socket);
  OPEN_CLIENT(b, S.socket);
  st_result_t *ra = call(a, "c16", 0), *rb = call(b, "c16", 0);
  CHECK(ra && rb && ra != rb && object_id(ra) == object_id(rb));
  /* Rebuilt: a new id, a new result. */
  st_args_t *args = st_args_new();
  st_args_string(args, "endpoint", "c16");
  st_result_t *inv = NULL;
  CHECK_RC(st_client_rpc(a, "invalidate_endpoint", args, &inv), ST_OK, a);
  st_args_free(args);
  st_result_free(inv);
  st_result_t *ra2 = call(a, "c16", 0);
  CHECK(ra2 && ra2 != ra && object_id(ra2) != object_id(ra));
  st_result_free(ra);
  st_result_free(rb);
  st_result_free(ra2);
  st_client_close(a);
  st_client_close(b);
  /* Turned off: every call decodes a result of its own. */
  setenv("ST_CLIENT_KEEP_OBJECTS", "0", 1);
  OPEN_CLIENT(d, S.socket);
  unsetenv("ST_CLIENT_KEEP_OBJECTS");
  st_result_t *d1 = call(d, "c16", 0), *d2 = call(d, "c16", 0);
  CHECK(d1 && d2 && d1 != d2);
  st_result_free(d1);
  st_result_free(d2);
  st_client_close(d);
}

TEST(past_the_bound_the_oldest_kept_result_is_let_go) {
  setenv("ST_CLIENT_KEEP_OBJECTS", "2", 1);
  OPEN_CLIENT(c, S.socket);
  unsetenv("ST_CLIENT_KEEP_OBJECTS");
  st_result_t *r1 = call(c, "num", 1), *r2 = call(c, "num", 2), *r3 = call(c, "num", 3);
  CHECK(r1 && r2 && r3);
  /* 1 was let go (still r1's) and the server told: in full again. */
  st_result_t *again1 = call(c, "num", 1);
  CHECK(again1 && again1 != r1 && object_id(again1) == object_id(r1));
  CHECK(((const float *)st_result_tensor(r1, 0)->data)[0] == 1.0f);
  /* 3 is kept: the same result. */
  st_result_t *again3 = call(c, "num", 3);
  CHECK(again3 == r3);
  st_result_free(r1);
  st_result_free(r2);
  st_result_free(r3);
  st_result_free(again1);
  st_result_free(again3);
  st_client_close(c);
}

/* ---------------------------------------------------------- scripted */

static const float kData[4] = {1, 2, 3, 4};
static int sent_in_full;        /* object 7 is held by the client     */
static char last_freed[64];     /* objects_freed of the last request  */

#define OBJECT7(refcount) \
  "object: {id: 7, cache_key: 'k', cached: true, managed: false, refcount: " refcount \
  ", bytes: 16, device: 'cpu', lease: false}"

/* params[key], or NULL. */
static const msgpack_object *param(const msgpack_object *map, const char *key) {
  for (uint32_t i = 0; map && map->type == MSGPACK_OBJECT_MAP && i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
        memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
      return &map->via.map.ptr[i].val;
  }
  return NULL;
}

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  const msgpack_object *freed = param(params, "objects_freed");
  last_freed[0] = '\0';
  for (uint32_t i = 0; freed && freed->type == MSGPACK_OBJECT_ARRAY && i < freed->via.array.size;
       i++) {
    size_t n = strlen(last_freed);
    snprintf(last_freed + n, sizeof last_freed - n, "%s%llu", i ? "," : "",
             (unsigned long long)freed->via.array.ptr[i].via.u64);
    if (freed->via.array.ptr[i].via.u64 == 7) sent_in_full = 0;
  }
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  char ep[64];
  fake_param_str(params, "endpoint", ep, sizeof ep);
  if (strcmp(ep, "obj") == 0 && !sent_in_full) {
    sent_in_full = 1;
    int fd = fake_memfd(4096, kData, sizeof kData, 1);
    int rc = fake_replyf(conn, id, &fd, 1,
                         "{value: tensor(0, 0, 'float32', [4], [1]), arenas: [{fd: 0, bytes: "
                         "4096, device: 'cpu', backend: 'memfd', id: 5}], " OBJECT7("0")
                         ", object_kept: true}");
    close(fd);
    return rc;
  }
  if (strcmp(ep, "obj") == 0) return fake_replyf(conn, id, NULL, 0, "{" OBJECT7("0") ", same: true}");
  if (strcmp(ep, "changed") == 0)
    return fake_replyf(conn, id, NULL, 0, "{" OBJECT7("3") ", same: true}");
  if (strcmp(ep, "never") == 0)
    return fake_replyf(conn, id, NULL, 0,
                       "{object: {id: 99, cached: true, managed: false, refcount: 0, bytes: 16, "
                       "device: 'cpu', lease: false}, same: true}");
  return fake_replyf(conn, id, NULL, 0, "{value: 1, arenas: []}");
}

TEST(the_request_after_the_last_free_says_objects_freed) {
  sent_in_full = 0;
  OPEN_CLIENT(c, fs.path);
  st_result_t *r1 = call(c, "obj", 0), *r2 = call(c, "obj", 0);
  CHECK(r1 && r1 == r2);
  CHECK(((const float *)st_result_tensor(r1, 0)->data)[3] == 4.0f);
  st_result_free(r1);
  st_result_t *other = call(c, "other", 0);
  CHECK_STR_EQ(last_freed, "");   /* r2 still holds it */
  st_result_free(other);
  st_result_free(r2);
  other = call(c, "other", 0);
  CHECK_STR_EQ(last_freed, "7");
  st_result_free(other);
  /* Told: the server sends it in full, decoded afresh. */
  st_result_t *r3 = call(c, "obj", 0);
  CHECK(r3 && ((const float *)st_result_tensor(r3, 0)->data)[0] == 1.0f);
  st_result_free(r3);
  st_client_close(c);
}

/* st_client_call_summary of "obj" with flags: the result (NULL when the
 * call failed or its summary is not object 7's), and in *same whether the
 * reply said `same`. */
static st_result_t *call_flags(st_client_t *c, int flags, int *same) {
  st_result_t *r = NULL;
  st_result_summary_t s;
  memset(&s, 0, sizeof s);
  stt_client_report(c, "obj", st_client_call_summary(c, "obj", NULL, flags, &r, &s));
  *same = s.same;
  return r && s.has_object && s.object.id == 7 && s.ntensors == 1 ? r : NULL;
}

/* A request that names no object; returns the `objects_freed` it said. */
static const char *next_request(st_client_t *c) {
  st_result_free(call(c, "other", 0));
  return last_freed;
}

TEST(a_lent_same_is_held_until_the_next_request) {
  sent_in_full = 0;
  OPEN_CLIENT(c, fs.path);
  int same;
  st_result_t *r1 = call_flags(c, ST_CALL_LEND_SAME, &same);
  CHECK(r1 && !same);   /* in full: the caller's */
  st_result_t *lent = call_flags(c, ST_CALL_LEND_SAME, &same);
  CHECK(lent && same && lent == r1);
  st_result_free(r1);   /* the caller's last reference */
  CHECK(((const float *)st_result_tensor(lent, 0)->data)[3] == 4.0f);
  CHECK_STR_EQ(next_request(c), "7");   /* the lent one went first */

  /* Without the flag a `same` is one more reference of the caller's. */
  r1 = call_flags(c, 0, &same);
  CHECK(r1 && !same);
  st_result_t *r2 = call_flags(c, 0, &same);
  CHECK(r2 && same && r2 == r1);
  st_result_free(r1);
  CHECK_STR_EQ(next_request(c), "");   /* r2 holds it */

  /* st_result_ref makes a lent result the caller's past the request. */
  lent = call_flags(c, ST_CALL_LEND_SAME, &same);
  CHECK(lent && same && lent == r2);
  st_result_ref(lent);
  st_result_free(r2);
  CHECK_STR_EQ(next_request(c), "");
  CHECK(((const float *)st_result_tensor(lent, 0)->data)[0] == 1.0f);
  st_result_free(lent);
  CHECK_STR_EQ(next_request(c), "7");
  st_client_close(c);
}

TEST(a_same_the_client_cannot_answer_is_protocol) {
  sent_in_full = 0;
  OPEN_CLIENT(c, fs.path);
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(c, "never", NULL, &r), ST_ERR_PROTOCOL, c);
  CHECK_CONTAINS(st_client_error(c), "object 99 is the same as before, but it was not sent");
  st_client_close(c);
  OPEN_CLIENT(d, fs.path);
  st_result_t *r1 = call(d, "obj", 0);
  CHECK(r1);
  CHECK_RC(st_client_call(d, "changed", NULL, &r), ST_ERR_PROTOCOL, d);
  CHECK_CONTAINS(st_client_error(d), "its object map differs");
  st_result_free(r1);
  st_client_close(d);
}

int main(void) {
  stt_server_setup(&S, "workers = 1,", endpoints);
  fs.on_request = on_request;
  fake_start(&fs);
  RUN(a_cached_object_called_again_is_the_same_result);
  RUN(a_held_managed_object_called_again_is_the_same_result_with_a_lease);
  RUN(other_connections_and_rebuilt_objects_get_their_own_results);
  RUN(past_the_bound_the_oldest_kept_result_is_let_go);
  RUN(the_request_after_the_last_free_says_objects_freed);
  RUN(a_same_the_client_cannot_answer_is_protocol);
  RUN(a_lent_same_is_held_until_the_next_request);
  fake_finish(&fs);
  return stt_server_finish(&S);
}

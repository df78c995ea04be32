/* `call {view}` on the wire (docs/protocol.md, "call"; docs/views.md,
 * section 1): a window's reply is the object's own arena with a new
 * descriptor (no new memory: same arena id, ledger unchanged); a
 * `contiguous` copy is made once into a derived object that every later
 * request of the same (object, spec) gets (same arena id), charged to the
 * budget; plain results too (a copy of their own, not kept); a managed
 * endpoint's lease comes with a view and goes back with a bad one; errors
 * are INVALID_ARGUMENT with the spec's message; a module that a view
 * copies in part is copied whole (its tensors share one arena). */
#include <signal.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

/* The tensor descriptor value.<name> of a reply (1) or 0. */
static int tensor_of(const msg_t *m, const char *name, st__tensor_desc_t *d) {
  const msgpack_object *t = obj_get(obj_get(m->result, "value"), name);
  char why[200];
  return t && st__parse_tensor(t, d, why, sizeof why) == ST_OK;
}

/* call ep {rows: 6, cols: 10} with `view` (a quoted spec, or NULL); the
 * descriptors are dropped. 1 with the reply in *m. */
static int call_view(rc_t *c, const char *ep, const char *view, msg_t *m) {
  char extra[300] = "";
  if (view) snprintf(extra, sizeof extra, ", view: '%s'", view);
  int rc = rc_rpcf(c, m, "[0, 7, 'call', [{endpoint: '%s', args: {}%s}]]", ep, extra);
  rc_drop_fds(c);
  return rc;
}

static int64_t derived_count(rc_t *c, const char *prefix) {
  msg_t m;
  if (rc_rpcf(c, &m, "[0, 9, 'objects', []]") != 1 || m.error) return -1;
  int64_t n = 0;
  for (uint32_t i = 0; i < m.result->via.array.size; i++)
    n += strncmp(obj_str(obj_get(&m.result->via.array.ptr[i], "endpoint")), prefix,
                 strlen(prefix)) == 0;
  msg_free(&m);
  return n;
}

TEST(a_window_is_the_same_arena) {
  OPEN_RC(c, S.socket);
  msg_t whole, view;
  CHECK(call_view(&c, "grid", NULL, &whole) == 1 && !whole.error);
  int64_t used = rc_info_int(&c, "memory.cpu.used_bytes");
  CHECK(call_view(&c, "grid", "m:shard(1,1,2)|transpose(0,1)", &view) == 1 && !view.error);
  st__tensor_desc_t d;
  CHECK(tensor_of(&view, "m", &d));
  CHECK(d.ndim == 2 && d.shape[0] == 5 && d.shape[1] == 6 && d.strides[0] == 1 &&
        d.strides[1] == 10 && d.offset == 5 * 8);   /* int64 */
  CHECK_EQ_INT(arena_id(&view, 0), arena_id(&whole, 0));
  CHECK_EQ_INT(obj_field(&view, "id"), obj_field(&whole, "id"));
  CHECK(obj_get(view.result, "same") == NULL && obj_get(view.result, "object_kept") == NULL);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.used_bytes"), used);
  CHECK_EQ_INT(derived_count(&c, "object:"), 0);
  msg_free(&whole);
  msg_free(&view);
  rc_close(&c);
}

TEST(contiguous_is_copied_once) {
  OPEN_RC(c, S.socket);
  OPEN_RC(c2, S.socket);
  const char *spec = "m:shard(1,0,2)|contiguous";
  msg_t whole, v1, v2;
  CHECK(call_view(&c, "grid", NULL, &whole) == 1 && !whole.error);
  int64_t used = rc_info_int(&c, "memory.cpu.used_bytes");
  CHECK(call_view(&c, "grid", spec, &v1) == 1 && !v1.error);
  CHECK(call_view(&c2, "grid", spec, &v2) == 1 && !v2.error);
  st__tensor_desc_t d;
  CHECK(tensor_of(&v1, "m", &d));
  CHECK(d.shape[0] == 6 && d.shape[1] == 5 && d.strides[0] == 5 && d.strides[1] == 1);
  CHECK(arena_id(&v1, 0) != arena_id(&whole, 0));
  CHECK_EQ_INT(arena_id(&v2, 0), arena_id(&v1, 0));     /* the same copy */
  CHECK_EQ_INT(derived_count(&c, "object:"), 1);
  CHECK(rc_info_int(&c, "memory.cpu.used_bytes") >= used + 6 * 5 * 8);
  char owner[40];
  snprintf(owner, sizeof owner, "object:%lld", (long long)obj_field(&whole, "id"));
  CHECK_EQ_INT(derived_count(&c, owner), 1);
  msg_free(&whole);
  msg_free(&v1);
  msg_free(&v2);
  /* Two requests at once, on a new spec: one copy serves both. */
  CHECK(rc_sendf(&c2, "[0, 11, 'call', [{endpoint: 'grid', view: 'm:shard(1,1,2)|contiguous'}]],"
                      "[0, 12, 'call', [{endpoint: 'grid', view: 'm:shard(1,1,2)|contiguous'}]]") == 0);
  CHECK(rc_next(&c2, &v1, 10000) == 1 && !v1.error);
  CHECK(rc_next(&c2, &v2, 10000) == 1 && !v2.error);
  rc_drop_fds(&c2);
  CHECK(arena_id(&v1, 0) != INT64_MIN && arena_id(&v1, 0) == arena_id(&v2, 0));
  CHECK_EQ_INT(derived_count(&c, "object:"), 2);
  msg_free(&v1);
  msg_free(&v2);
  /* A plain result's copy is its own and kept nowhere. */
  CHECK(call_view(&c, "plain_grid", spec, &v1) == 1 && !v1.error);
  CHECK(tensor_of(&v1, "m", &d) && d.strides[0] == 5);
  CHECK_EQ_INT(derived_count(&c, "object:"), 2);
  msg_free(&v1);
  rc_close(&c);
  rc_close(&c2);
}

TEST(leases_and_errors) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(call_view(&c, "managed_grid", "m:narrow(0,0,1)", &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_field(&m, "lease"), 1);
  int64_t oid = obj_field(&m, "id");
  CHECK_EQ_INT(info_field(&c, (uint64_t)oid, "refcount"), 1);
  msg_free(&m);
  /* A bound: the lease the reply would have given goes back. */
  CHECK(call_view(&c, "managed_grid", "m:shard(0,6,6)", &m) == 1);
  CHECK_EQ_INT(-msg_code(&m), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(msg_errmsg(&m), "shard(0,6,6): rank 6 is not below world 6 (tensor 'm')");
  msg_free(&m);
  CHECK_EQ_INT(info_field(&c, (uint64_t)oid, "refcount"), 1);
  static const frame_case_t cases[] = {
      {"[0, 1, 'call', [{endpoint: 'grid', view: 'm:nope(1)'}]]", ST_ERR_INVALID_ARGUMENT,
       "call: view: rule 1, step 1 at byte 2: unknown step 'nope'"},
      {"[0, 1, 'call', [{endpoint: 'grid', view: 3}]]", ST_ERR_INVALID_ARGUMENT,
       "call: 'view' must be a string"},
      {"[0, 1, 'call', [{endpoint: 'grid', view: 'w:narrow(0,0,1)'}]]", ST_ERR_INVALID_ARGUMENT,
       "view: rule 1 ('w') selects no tensor (tensors: m)"},
      {"[0, 1, 'call', [{endpoint: 'tasky', view: 'narrow(0,0,1)'}]]", ST_ERR_INVALID_ARGUMENT,
       "'view' is not available for an execution = \"task\" endpoint"},
  };
  CHECK_RPC_TABLE(&c, cases, sizeof cases / sizeof cases[0]);
  rc_close(&c);
}

static char mod_why[300];

/* The tensor `name` of the module that is a reply's value into *d: ST_OK,
 * or ST_ERR_PROTOCOL with mod_why[] set, also when the module does not
 * parse as a client parses it (one arena for all its tensors). */
static int module_tensor(const msg_t *m, const char *name, st__tensor_desc_t *d) {
  msgpack_unpacked payload;
  const msgpack_object *tensors = NULL, *meta = NULL;
  int rc = st__parse_module(obj_get(m->result, "value"), &payload, &tensors, &meta, mod_why,
                            sizeof mod_why);
  if (rc != ST_OK) return rc;
  rc = ST_ERR_PROTOCOL;
  snprintf(mod_why, sizeof mod_why, "no tensor '%s' in the module", name);
  for (uint32_t i = 0; i < tensors->via.array.size && rc != ST_OK; i++) {
    const msgpack_object *pair = tensors->via.array.ptr[i].via.array.ptr;
    if (st__str_eq(&pair[0], name)) rc = st__parse_tensor(&pair[1], d, mod_why, sizeof mod_why);
  }
  msgpack_unpacked_destroy(&payload);
  return rc;
}

#define CHECK_MODULE_TENSOR(m, name, d) \
  CHECK_ERR_MSG(module_tensor((m), (name), (d)), ST_OK, mod_why)

/* A module's tensors share one arena (protocol.md): a view that copies
 * some of them copies all of them, each its window, contiguous. */
TEST(a_module_is_copied_whole) {
  OPEN_RC(c, S.socket);
  msg_t whole, m;
  st__tensor_desc_t q, k, b;
  CHECK(call_view(&c, "mod", NULL, &whole) == 1 && !whole.error);
  /* Windows only: the module's own arena. */
  CHECK(call_view(&c, "mod", "q:transpose(0,1)", &m) == 1 && !m.error);
  CHECK_MODULE_TENSOR(&m, "q", &q);
  CHECK_MODULE_TENSOR(&m, "k", &k);
  CHECK(q.shape[0] == 4 && q.strides[0] == 1 && k.strides[0] == 4);
  CHECK_EQ_INT(arena_id(&m, 0), arena_id(&whole, 0));
  CHECK(arena_id(&m, 1) == INT64_MIN);
  msg_free(&m);
  /* One tensor copied: all of them go to the copy's arena. */
  CHECK(call_view(&c, "mod", "q:transpose(0,1)|contiguous;k:transpose(0,1)", &m) == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  CHECK_MODULE_TENSOR(&m, "q", &q);
  CHECK_MODULE_TENSOR(&m, "k", &k);
  CHECK_MODULE_TENSOR(&m, "b", &b);
  CHECK(q.ndim == 2 && q.shape[0] == 4 && q.shape[1] == 3 && q.strides[0] == 3 &&
        q.strides[1] == 1);
  CHECK(k.ndim == 2 && k.shape[0] == 4 && k.shape[1] == 2 && k.strides[0] == 2 &&
        k.strides[1] == 1);                      /* a window, copied contiguous */
  CHECK(b.ndim == 1 && b.shape[0] == 5 && b.strides[0] == 1);   /* untouched, copied */
  CHECK(q.arena == k.arena && k.arena == b.arena);
  CHECK(arena_id(&m, q.arena) != arena_id(&whole, 0));
  CHECK(arena_id(&m, 1) == INT64_MIN);            /* the source's arena is not sent */
  char owner[40];
  snprintf(owner, sizeof owner, "object:%lld", (long long)obj_field(&whole, "id"));
  CHECK_EQ_INT(derived_count(&c, owner), 1);
  msg_free(&m);
  msg_free(&whole);
  rc_close(&c);
}

static const stt_endpoint_t endpoints[] = {
    {"grid.lua",
     "return st.endpoint{ name = 'grid', cache = true,\n"
     "  build = function() return { m = st.arange{60}:view{6, 10} } end }\n"},
    {"plain_grid.lua",
     "return st.endpoint{ name = 'plain_grid',\n"
     "  build = function() return { m = st.arange{60}:view{6, 10} } end }\n"},
    {"managed_grid.lua",
     "return st.endpoint{ name = 'managed_grid', managed = true, cache = true,\n"
     "  build = function() return { m = st.arange{60}:view{6, 10} } end }\n"},
    {"mod.lua",
     "return st.endpoint{ name = 'mod', cache = true,\n"
     "  build = function() return st.module{ q = st.arange{12}:view{3, 4},\n"
     "    k = st.arange{8}:view{2, 4}, b = st.arange{5} } end }\n"},
    {"tasky.lua",
     "return st.endpoint{ name = 'tasky', execution = 'task',\n"
     "  build = function() return st.zeros{2} end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 2, memory_budget = { cpu = 16 * 1024 * 1024 },", endpoints);
  RUN(a_window_is_the_same_arena);
  RUN(contiguous_is_copied_once);
  RUN(leases_and_errors);
  RUN(a_module_is_copied_whole);
  return stt_server_finish(&S);
}

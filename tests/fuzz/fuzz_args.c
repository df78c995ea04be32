/* Fuzz target: a call's parameters as the server decodes them: the
 * request message (frame reader), its named-parameter map, the tensor
 * arguments' arena list (st__targs_take), the endpoint lookup by wire name
 * (st__generation_find), binding the arguments to the declaration with the
 * tensor checks (st__bind_args, st__targs_check) and the cache key of a
 * caching endpoint (st__cache_key). The per-method parameter rows of
 * src/server/rpc.c are not part of it (they need a connection).
 *
 * Input: one whole request message, e.g.
 *   [0, 7, "call", [{"endpoint": "scale", "args": {...}, "arenas": [...]}]]
 * The endpoints it can name are fixed below (every parameter type, a
 * tensor parameter, a cache with a format key, singleflight). Descriptors
 * are not real: the arena list is parsed and checked, never mapped.
 *
 * Properties: a bind that succeeds writes one map with exactly one entry
 * per parameter, in declaration order, each accepted by its type; a
 * cache key is computed for every bound call of a caching endpoint.
 */
#include <string.h>

#include "engine/bind.h"
#include "engine/cachekey.h"
#include "fuzz.h"

/* Defaults as msgpack bytes. */
#define NIL "\xc0"
#define FALSE "\xc2"
#define INT3 "\x03"
#define HALF "\xcb\x3f\xe0\x00\x00\x00\x00\x00\x00"
#define TWO "\xcb\x40\x00\x00\x00\x00\x00\x00\x00"
#define STR_X "\xa1x"
#define EMPTY_MAP "\x80"

#define P(n, t, req, def) \
  {.name = n, .required = req, .type = t, .default_mp = def, .default_len = sizeof(def) - 1, \
   .tensor_dtype = -1}

static st__param_t cached_params[] = {P("n", ST_PARAM_INTEGER, 0, INT3),
                                      P("s", ST_PARAM_STRING, 0, STR_X)};
static st__param_t echo_params[] = {
    {.name = "a", .required = 1, .type = ST_PARAM_ANY, .tensor_dtype = -1},
    P("b", ST_PARAM_BOOL, 0, FALSE),      P("i", ST_PARAM_INTEGER, 0, INT3),
    P("n", ST_PARAM_NUMBER, 0, HALF),     P("s", ST_PARAM_STRING, 0, STR_X),
    P("t", ST_PARAM_TABLE, 0, EMPTY_MAP),
};
static st__param_t join_params[] = {P("v", ST_PARAM_ANY, 0, NIL)};
static st__param_t scale_params[] = {
    P("factor", ST_PARAM_NUMBER, 0, TWO),
    {.name = "x", .required = 1, .type = ST_PARAM_TENSOR, .tensor_dtype = ST_DTYPE_FLOAT32,
     .tensor_device = ST_TDEV_CPU},
    {.name = "y", .type = ST_PARAM_TENSOR, .default_mp = NIL, .default_len = 1,
     .tensor_dtype = -1, .tensor_device = ST_TDEV_CUDA},
};

#define N(a) (sizeof(a) / sizeof((a)[0]))
static st__endpoint_decl_t endpoints[] = {   /* sorted by name */
    {.name = "cached", .cache = 1, .cache_format_key = "{n}/{s}", .nparams = N(cached_params),
     .params = cached_params},
    {.name = "echo", .nparams = N(echo_params), .params = echo_params},
    {.name = "join", .singleflight = 1, .nparams = N(join_params), .params = join_params},
    {.name = "none"},
    {.name = "scale", .nparams = N(scale_params), .params = scale_params},
};
static st__generation_t generation = {.nendpoints = N(endpoints), .endpoints = endpoints};

/* The bound map holds every parameter once, in order, with a value its
 * type accepts (or the declaration's default). */
static void check_bound(const st__endpoint_decl_t *ep, const msgpack_sbuffer *sb) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  FUZZ_CHECK(msgpack_unpack_next(&u, sb->data, sb->size, &off) == MSGPACK_UNPACK_SUCCESS);
  FUZZ_CHECK(off == sb->size && u.data.type == MSGPACK_OBJECT_MAP);
  FUZZ_CHECK(u.data.via.map.size == ep->nparams);
  for (size_t i = 0; i < ep->nparams; i++) {
    const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
    FUZZ_CHECK(st__str_eq(&kv->key, ep->params[i].name));
    if (ep->params[i].type == ST_PARAM_TENSOR && kv->val.type != MSGPACK_OBJECT_NIL)
      FUZZ_CHECK(kv->val.type == MSGPACK_OBJECT_EXT && kv->val.via.ext.type == ST_EXT_TENSOR);
  }
  msgpack_unpacked_destroy(&u);
}

static void call(const msgpack_object *params, const st__targs_t *targs) {
  const msgpack_object *name = st__map_get(params, "endpoint");
  if (!name || name->type != MSGPACK_OBJECT_STR) return;
  const st__endpoint_decl_t *ep =
      st__generation_find(&generation, name->via.str.ptr, name->via.str.size);
  if (!ep) return;
  FUZZ_CHECK(strlen(ep->name) == name->via.str.size &&
             memcmp(ep->name, name->via.str.ptr, name->via.str.size) == 0);
  const msgpack_object *args = st__map_get(params, "args");
  msgpack_sbuffer bound;
  msgpack_sbuffer_init(&bound);
  char err[1024];
  if (st__bind_args(ep, args, targs, &bound, err, sizeof err) == ST_OK) {
    check_bound(ep, &bound);
    if (ep->cache) {
      char *key = NULL;
      size_t keylen = 0;
      FUZZ_CHECK(st__cache_key(ep, bound.data, bound.size, &key, &keylen, err, sizeof err) ==
                 ST_OK);
      FUZZ_CHECK(key && strlen(key) <= keylen);
      free(key);
    }
  } else {
    FUZZ_CHECK(bound.size == 0);
  }
  msgpack_sbuffer_destroy(&bound);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  st__message_t m;
  if (!fuzz_one_message(data, size, &m)) return 0;
  const msgpack_object *params = NULL;
  char err[320];
  if (m.type == ST_MSG_REQUEST && st__params_map(&m.params, &params, err, sizeof err) == ST_OK &&
      params) {
    /* As the dispatcher takes them: at most 253 arenas, one descriptor
     * each but those named by arg_id alone (here -1: nothing is mapped),
     * with an empty argument cache. */
    const msgpack_object *list = st__map_get(params, "arenas");
    st__targs_t targs;
    memset(&targs, 0, sizeof targs);
    int ok = 1;
    if (list) {
      int fds[ST_MAX_FDS_PER_MESSAGE];
      uint32_t n = list->type == MSGPACK_OBJECT_ARRAY ? list->via.array.size : 0;
      ok = list->type == MSGPACK_OBJECT_ARRAY && n <= ST_MAX_FDS_PER_MESSAGE;
      size_t nfds = ok ? st__targs_count_fds(list) : 0;
      for (size_t i = 0; i < nfds; i++) fds[i] = -1;
      st__argcache_t cache;
      memset(&cache, 0, sizeof cache);
      uint64_t uncached[ST_MAX_FDS_PER_MESSAGE];
      size_t nuncached;
      if (ok && st__targs_take(&targs, list, fds, nfds, &cache, uncached, &nuncached, err,
                               sizeof err) != ST_OK)
        ok = 0;
      if (ok) FUZZ_CHECK(targs.n == n);
    }
    if (ok) call(params, &targs);
    st__targs_clear(&targs);
  }
  st__message_destroy(&m);
  return 0;
}

/* src/engine: argument binding (bind.h). */
#include "engine/bind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "st/errors.h"

/* Static name of a parameter type. Any thread. */
const char *st__param_type_name(st__param_type_t t) {
  switch (t) {
    case ST_PARAM_ANY: return "any";
    case ST_PARAM_BOOL: return "boolean";
    case ST_PARAM_INTEGER: return "integer";
    case ST_PARAM_NUMBER: return "number";
    case ST_PARAM_STRING: return "string";
    case ST_PARAM_TABLE: return "table";
    case ST_PARAM_TENSOR: return "tensor";
  }
  return "?";
}

/* How a received value is named in a type error. */
static const char *value_type_name(const msgpack_object *o) {
  switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "number";
    case MSGPACK_OBJECT_STR: return "string";
    case MSGPACK_OBJECT_BIN: return "binary";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_EXT: return o->via.ext.type == ST_EXT_TENSOR ? "tensor" : "ext";
  }
  return "?";
}

static int type_accepts(st__param_type_t t, const msgpack_object *o) {
  switch (t) {
    case ST_PARAM_ANY: return 1;
    case ST_PARAM_TENSOR: return o->type == MSGPACK_OBJECT_EXT;
    case ST_PARAM_BOOL: return o->type == MSGPACK_OBJECT_BOOLEAN;
    case ST_PARAM_INTEGER:
      return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
             o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
    case ST_PARAM_NUMBER:
      return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
             o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ||
             o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64;
    case ST_PARAM_STRING:
      return o->type == MSGPACK_OBJECT_STR || o->type == MSGPACK_OBJECT_BIN;
    case ST_PARAM_TABLE:
      return o->type == MSGPACK_OBJECT_ARRAY || o->type == MSGPACK_OBJECT_MAP;
  }
  return 0;
}

/* Index of the parameter named by a STR object, or -1 (params are sorted
 * by name: binary search with st__name_cmp). */
static long find_param(const st__endpoint_decl_t *ep, const char *name, size_t len) {
  size_t lo = 0, hi = ep->nparams;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = st__name_cmp(ep->params[mid].name, name, len);
    if (c == 0) return (long)mid;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

/* "a, b, c" or "no arguments" into buf. */
static void list_params(const st__endpoint_decl_t *ep, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  if (ep->nparams == 0) {
    snprintf(buf, cap, "no arguments");
    return;
  }
  for (size_t i = 0; i < ep->nparams && used < cap; i++) {
    int n = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", ep->params[i].name);
    if (n < 0) break;
    used += (size_t)n;
  }
}

/* Binds a call's args to ep's parameters; see bind.h. Any thread. */
int st__bind_args(const st__endpoint_decl_t *ep, const msgpack_object *args,
                  const st__targs_t *targs, msgpack_sbuffer *out, char *err, size_t errlen) {
  if (args && args->type == MSGPACK_OBJECT_NIL) args = NULL;
  if (args && args->type != MSGPACK_OBJECT_MAP) {
    snprintf(err, errlen, "args must be a map, got %s", value_type_name(args));
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (args) {
    char why[256];
    if (st__check_value(args, 1, why, sizeof why) != ST_OK) {
      snprintf(err, errlen, "args: %s", why);
      return ST_ERR_INVALID_ARGUMENT;
    }
  }
  /* seen[i]: the argument object for parameter i (NULL: take the default). */
  const msgpack_object *stack_seen[32];
  const msgpack_object **seen = stack_seen;
  if (ep->nparams > 32) {
    seen = calloc(ep->nparams, sizeof *seen);
    if (!seen) {
      snprintf(err, errlen, "out of memory");
      return ST_ERR_OUT_OF_MEMORY;
    }
  } else {
    memset(stack_seen, 0, sizeof stack_seen);
  }
  int rc = ST_OK;
  size_t ntensors = 0;
  uint32_t nargs = args ? args->via.map.size : 0;
  for (uint32_t i = 0; i < nargs && rc == ST_OK; i++) {
    const msgpack_object *k = &args->via.map.ptr[i].key;
    const msgpack_object *v = &args->via.map.ptr[i].val;
    /* st__check_value guarantees string keys. */
    long idx = find_param(ep, k->via.str.ptr, k->via.str.size);
    if (idx < 0) {
      char names[512], shown[300];
      list_params(ep, names, sizeof names);
      snprintf(err, errlen, "unknown argument '%s' (endpoint %s takes%s%s)",
               st__wire_shown(k->via.str.ptr, k->via.str.size, shown, sizeof shown), ep->name,
               ep->nparams ? ": " : " ", names);
      rc = ST_ERR_INVALID_ARGUMENT;
      break;
    }
    const st__param_t *p = &ep->params[idx];
    if (!type_accepts(p->type, v)) {
      snprintf(err, errlen, "argument '%s' must be %s, got %s", p->name,
               st__param_type_name(p->type), value_type_name(v));
      rc = ST_ERR_INVALID_ARGUMENT;
      break;
    }
    rc = st__targs_check(targs, p, v, &ntensors, err, errlen);
    if (rc != ST_OK) break;
    /* A key sent twice: the last value wins, as in a Lua table constructor. */
    seen[idx] = v;
  }
  if (rc == ST_OK && ntensors && (ep->cache || ep->singleflight)) {
    snprintf(err, errlen,
             "endpoint %s %s its results by argument, and a tensor argument cannot be part of a "
             "key: pass plain values, or drop %s from its declaration",
             ep->name, ep->cache ? "caches" : "joins calls", ep->cache ? "cache" : "singleflight");
    rc = ST_ERR_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < ep->nparams && rc == ST_OK; i++) {
    if (!seen[i] && (ep->params[i].required || !ep->params[i].default_mp)) {
      snprintf(err, errlen, "missing required argument '%s'", ep->params[i].name);
      rc = ST_ERR_INVALID_ARGUMENT;
    }
  }
  if (rc == ST_OK) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (uint32_t)ep->nparams);
    for (size_t i = 0; i < ep->nparams; i++) {
      const st__param_t *p = &ep->params[i];
      st__pack_cstr(&pk, p->name);
      if (seen[i]) msgpack_pack_object(&pk, *seen[i]);
      else msgpack_sbuffer_write(out, p->default_mp, p->default_len);
    }
  }
  if (seen != stack_seen) free(seen);
  return rc;
}

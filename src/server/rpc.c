/* src/server: the parameters of a request, checked against its method's
 * row (rpc.h), and what handlers read them with. Loop thread only. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/settings.h"
#include "server/rpc.h"
#include "server/server.h"
#include "st/errors.h"

/* "a, b, c" of "a|b|c". */
static const char *word_list(const char *choices, char *buf, size_t len) {
  size_t n = 0;
  for (const char *p = choices; *p && n + 3 < len; p++) {
    if (*p == '|') {
      buf[n++] = ',';
      buf[n++] = ' ';
    } else {
      buf[n++] = *p;
    }
  }
  buf[n] = '\0';
  return buf;
}

static double seconds_of(const msgpack_object *v) {
  if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (double)v->via.u64;
  if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (double)v->via.i64;
  return v->via.f64;
}

/* A required parameter is absent (or, for a string, not one). */
static void missing(st__rpc_req_t *r, const st__rpc_param_t *p) {
  st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: '%s' %sis required", r->method->name, p->name,
                p->type == ST_RPC_STR ? "(a string) " : "");
}

/* Whether v (not NULL) has the type of parameter p; else sends the
 * error and returns 0. */
static int check_type(st__rpc_req_t *r, const st__rpc_param_t *p, const msgpack_object *v) {
  const char *m = r->method->name;
  char words[160];
  double d;
  /* Wire strings are length-delimited; names and words never hold a NUL
   * (C code downstream would read them as shorter). */
  if ((p->type == ST_RPC_STR || p->type == ST_RPC_WORD) && v->type == MSGPACK_OBJECT_STR &&
      memchr(v->via.str.ptr, '\0', v->via.str.size)) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: '%s' holds a NUL byte", m, p->name);
    return 0;
  }
  switch (p->type) {
  case ST_RPC_ANY: return 1;
  case ST_RPC_U64:
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return 1;
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: '%s' must be an integer >= 0", m, p->name);
    return 0;
  case ST_RPC_STR:
    if (v->type == MSGPACK_OBJECT_STR) return 1;
    if (p->flags & ST_RPC_REQUIRED) missing(r, p);
    else st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: '%s' must be a string", m, p->name);
    return 0;
  case ST_RPC_SECONDS:
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER || v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ||
        v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64) {
      d = seconds_of(v);
      if (d >= p->lo && d <= p->hi) return 1;
    }
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: '%s' must be a number of seconds in %g..%g", m,
                  p->name, p->lo, p->hi);
    return 0;
  case ST_RPC_WORD:
    if (v->type == MSGPACK_OBJECT_STR) {
      char w[64];
      if (st__wire_cstr(v, w, sizeof w) >= 0 && st__choices_index(p->choices, w) >= 0) return 1;
    }
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: '%s' must be one of %s", m, p->name,
                  word_list(p->choices, words, sizeof words));
    return 0;
  case ST_RPC_BOOL:
    if (v->type == MSGPACK_OBJECT_BOOLEAN) return 1;
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: '%s' must be true or false", m, p->name);
    return 0;
  }
  return 0;
}

/* Unknown names, then each parameter of the row in order; see rpc.h. */
int st__rpc_check(st__rpc_req_t *r) {
  const st__rpc_param_t *ps = r->method->params;
  const char *names[ST_RPC_MAX_PARAMS + 4];
  size_t n = 0;
  while (n < ST_RPC_MAX_PARAMS && ps[n].name) {
    names[n] = ps[n].name;
    n++;
  }
  /* Every method takes `forget` (tensor arguments the client freed),
   * `unmapped` (arenas it let go) and `objects_freed` (objects it let go),
   * which st__dispatch applied already (server/argcache.c,
   * server/kept.c). */
  names[n] = "forget";
  names[n + 1] = "unmapped";
  names[n + 2] = "objects_freed";
  names[n + 3] = NULL;
  char err[256];
  if (st__params_check(r->params, names, err, sizeof err) != ST_OK) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: %s", r->method->name, err);
    return ST_ERR_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < n; i++) {
    const st__rpc_param_t *p = &ps[i];
    const msgpack_object *v = r->params ? st__map_get(r->params, p->name) : NULL;
    if (v && v->type == MSGPACK_OBJECT_NIL && !(p->flags & ST_RPC_NIL_IS_VALUE)) v = NULL;
    r->values[i] = v;
    if (!v && (p->flags & ST_RPC_REQUIRED)) {
      missing(r, p);
      return ST_ERR_INVALID_ARGUMENT;
    }
    if (v && !check_type(r, p, v)) return ST_ERR_INVALID_ARGUMENT;
  }
  return ST_OK;
}

/* The index of parameter `name` in the request's row; a name the row
 * does not have is a broken invariant. */
static size_t param_index(const st__rpc_req_t *r, const char *name) {
  const st__rpc_param_t *ps = r->method->params;
  for (size_t i = 0; i < ST_RPC_MAX_PARAMS && ps[i].name; i++)
    if (strcmp(ps[i].name, name) == 0) return i;
  ST_LOG_E("rpc", "method %s has no parameter '%s'", r->method->name, name);
  abort();
}

/* See rpc.h. */
const msgpack_object *st__rpc_arg(const st__rpc_req_t *r, const char *name) {
  return r->values[param_index(r, name)];
}

/* A checked U64 parameter, or dflt. */
uint64_t st__rpc_u64(const st__rpc_req_t *r, const char *name, uint64_t dflt) {
  const msgpack_object *v = st__rpc_arg(r, name);
  return v ? v->via.u64 : dflt;
}

/* A checked SECONDS parameter, or dflt. */
double st__rpc_seconds(const st__rpc_req_t *r, const char *name, double dflt) {
  const msgpack_object *v = st__rpc_arg(r, name);
  return v ? seconds_of(v) : dflt;
}

/* A checked BOOL parameter, 0 or 1, or dflt. */
int st__rpc_bool(const st__rpc_req_t *r, const char *name, int dflt) {
  const msgpack_object *v = st__rpc_arg(r, name);
  return v ? v->via.boolean != 0 : dflt;
}

/* A checked WORD parameter's index, or dflt. */
int st__rpc_word(const st__rpc_req_t *r, const char *name, int dflt) {
  size_t i = param_index(r, name);
  const msgpack_object *v = r->values[i];
  if (!v) return dflt;
  char w[64];
  if (st__wire_cstr(v, w, sizeof w) < 0) return dflt;   /* check_type refused it */
  return st__choices_index(r->method->params[i].choices, w);
}

/* See rpc.h. */
const st__endpoint_decl_t *st__rpc_endpoint(const st__rpc_req_t *r) {
  const msgpack_object *name = st__rpc_arg(r, "endpoint");
  const st__endpoint_decl_t *ep =
      st__generation_find(r->c->srv->gen, name->via.str.ptr, name->via.str.size);
  char shown[300];
  if (!ep)
    st__rpc_error(r, ST_ERR_UNKNOWN_ENDPOINT, "unknown endpoint '%s'",
                  st__wire_shown(name->via.str.ptr, name->via.str.size, shown, sizeof shown));
  return ep;
}

/* See rpc.h. */
int st__rpc_device(const st__rpc_req_t *r) {
  st__server_t *srv = r->c->srv;
  const msgpack_object *d = st__rpc_arg(r, "device");
  if (!d || st__str_eq(d, "cpu")) return -1;
  int ordinal = -1;
  if (st__str_eq(d, "cuda")) {
    ordinal = r->c->device;
  } else {
    /* "cuda:" and 1 to 4 digits, read whole: no sign, blank or tail, and
     * nothing cut off (a cut copy of "cuda:00...01" would read as 0). */
    char text[16];
    long n = st__wire_cstr(d, text, sizeof text);
    unsigned long v = n > 5 && n <= 9 && strncmp(text, "cuda:", 5) == 0 &&
                              strspn(text + 5, "0123456789") == (size_t)(n - 5)
                          ? strtoul(text + 5, NULL, 10)
                          : 4096;
    if (v > 4095) {
      st__rpc_error(r, ST_ERR_INVALID_ARGUMENT, "%s: 'device' must be cpu, cuda or cuda:N",
                    r->method->name);
      return -2;
    }
    ordinal = (int)v;
  }
  if (!st__devices_cuda(&srv->devices, ordinal)) {
    st__rpc_error(r, ST_ERR_CAPABILITY, "%s: no CUDA device: cuda:%d is unavailable%s%s",
                  r->method->name, ordinal, srv->devices.cuda_reason[0] ? ": " : "",
                  srv->devices.cuda_reason);
    return -2;
  }
  return ordinal;
}

/* See rpc.h. */
void st__rpc_error(const st__rpc_req_t *r, int code, const char *fmt, ...) {
  char m[1400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  st__conn_send_error(r->c, r->id, code, m);
}

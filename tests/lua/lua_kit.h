/* Helpers shared by the tests of src/lua: endpoint files in a temp dir, a
 * generation and a vm over them, and decoding of build results. Header
 * only (each test program includes it once). */
#ifndef STT_LUA_KIT_H
#define STT_LUA_KIT_H

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "engine/generation.h"
#include "engine/result.h"
#include "lua/st_lua.h"
#include "proto/proto.h"

static char kit_dir[256];

/* A fresh, empty temp dir for endpoint files (the previous one removed). */
static inline void kit_rmdir(void) {
  if (!kit_dir[0]) return;
  stt_remove_tree(kit_dir);
  kit_dir[0] = '\0';
}

static inline void kit_fresh(void) {
  kit_rmdir();
  snprintf(kit_dir, sizeof kit_dir, "/tmp/st-lua-test-XXXXXX");
  if (!mkdtemp(kit_dir)) {
    perror("mkdtemp");
    exit(2);
  }
}

static inline void kit_write(const char *name, const char *fmt, ...) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", kit_dir, name);
  FILE *f = fopen(p, "w");
  if (!f) {
    perror(p);
    exit(2);
  }
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fclose(f);
}

/* Loads kit_dir; *errs receives the joined errors (owned) or NULL. */
static inline int kit_load(st__generation_t **g, char **errs) {
  st__errlist_t l = {0};
  int rc = st__generation_load(kit_dir, 1, NULL, g, &l);
  *errs = st__errlist_join(&l);
  if (*errs) fprintf(stderr, "   load errors:\n%s\n", *errs);
  st__errlist_clear(&l);
  return rc;
}

/* A generation and a vm over kit_dir with one file `text` (e.g. an
 * endpoint named "t"). Returns NULL on failure (printed). */
typedef struct kit_vm {
  st__generation_t *gen;
  st__vm_t *vm;
} kit_vm_t;

/* The same under `limits` (NULL: none); vm_new's message in err. */
static inline int kit_vm_open_limited(kit_vm_t *k, const st__vm_limits_t *limits, char *err,
                                      size_t errlen) {
  char *errs = NULL;
  memset(k, 0, sizeof *k);
  if (kit_load(&k->gen, &errs) != ST_OK) {
    free(errs);
    return -1;
  }
  int rc = st__vm_new(k->gen, 0, limits, &k->vm, err, errlen);
  if (rc != ST_OK) fprintf(stderr, "   vm_new: %s\n", err);
  return rc;
}

static inline int kit_vm_open(kit_vm_t *k) {
  char err[1024];
  return kit_vm_open_limited(k, NULL, err, sizeof err);
}

static inline void kit_vm_close(kit_vm_t *k) {
  st__vm_free(k->vm);
  st__generation_unref(k->gen);
  memset(k, 0, sizeof *k);
}

/* A build that could not run: `why` in err, an empty result, -1000. */
static inline int kit_no_build(st__build_result_t *res, char *err, size_t errlen,
                               const char *why) {
  snprintf(err, errlen, "%s", why);
  st__build_result_init(res);
  return -1000;
}

/* Runs endpoint `name` with the msgpack args (NULL: none); what the body
 * reports with st.progress goes to `progress` (may be NULL). */
static inline int kit_build_p(kit_vm_t *k, const char *name, const msgpack_sbuffer *args,
                              const volatile int *cancel, st__progress_t *progress,
                              st__build_result_t *res, char *err, size_t errlen) {
  const st__endpoint_decl_t *ep = st__generation_find(k->gen, name, strlen(name));
  if (!ep) {
    char why[300];
    snprintf(why, sizeof why, "no endpoint %s", name);
    return kit_no_build(res, err, errlen, why);
  }
  int rc = st__vm_build(k->vm, ep, args ? args->data : NULL, args ? args->size : 0, cancel,
                        progress, res, err, errlen);
  if (rc != ST_OK) fprintf(stderr, "   build %s: %s (%s)\n", name, err, st_err_name(rc));
  return rc;
}

static inline int kit_build(kit_vm_t *k, const char *name, const msgpack_sbuffer *args,
                            const volatile int *cancel, st__build_result_t *res, char *err,
                            size_t errlen) {
  return kit_build_p(k, name, args, cancel, NULL, res, err, errlen);
}

/* Endpoint `name` of kit_dir built once with no arguments in a vm of its
 * own (closed before it returns; the result stays). */
static inline int kit_build_once(const char *name, st__build_result_t *res, char *err,
                                 size_t errlen) {
  kit_vm_t k;
  if (kit_vm_open(&k) != ST_OK) return kit_no_build(res, err, errlen, "vm did not open");
  int rc = kit_build(&k, name, NULL, NULL, res, err, errlen);
  kit_vm_close(&k);
  return rc;
}

/* A fresh kit_dir with one endpoint `t` whose build function has the
 * body `body`, built once with no arguments in a vm of its own. */
static inline int kit_run_body(const char *body, st__build_result_t *res, char *err,
                               size_t errlen) {
  kit_fresh();
  kit_write("t.lua", "return st.endpoint{ name = 't', build = function(a)\n%s\nend }\n", body);
  return kit_build_once("t", res, err, errlen);
}

/* The decoded value of a result (caller destroys `up`). */
static inline const msgpack_object *kit_value(const st__build_result_t *res, msgpack_unpacked *up) {
  size_t off = 0;
  msgpack_unpacked_init(up);
  if (msgpack_unpack_next(up, res->value.data, res->value.size, &off) != MSGPACK_UNPACK_SUCCESS)
    return NULL;
  if (off != res->value.size) return NULL;
  return &up->data;
}

/* Element i (in elements from the tensor's first element) of a tensor
 * descriptor, read from the result's arena. */
static inline double kit_elem(const st__build_result_t *res, const st__tensor_desc_t *d, int64_t i) {
  const char *base = (const char *)st__arena_base(res->arenas[d->arena]) + d->offset;
  return st_dtype_load(d->dtype, base, (size_t)i);
}

static inline int64_t kit_int(const msgpack_object *o) {
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (int64_t)o->via.u64;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return o->via.i64;
  return -999999;
}

#endif

/* src/client: loading into caller-owned tensors (include/st/client.h,
 * "loading into caller-owned tensors"; docs/views.md, section 2).
 *
 * st_result_copy_into copies each tensor of a result into the caller's
 * tensor of the same name; st_get_into does it from a published key,
 * which it maps read-only. Both check every destination against the
 * source first (names both ways, dtype, shape, contiguity, device) and
 * copy nothing when anything differs: the error lists what does.
 *
 * Copies: CPU to CPU is memcpy; the copies with a CUDA side go on the
 * caller's stream of the one device the call copies on, through
 * copies.c's st__client_cuda_copies (merged where they follow each other,
 * device to device ranges batched into one kernel launch, the others one
 * cuMemcpyAsync each, the driver inferring the direction).
 *
 * The mapping of a key's source is kept per client and (key, view) (at
 * most INTO_KEEP_KEYS, the least recently used let go), with its version:
 * the next st_get_into of that key asks with `have` (st_client_get_since)
 * and, while the version has not moved, gets a `same` reply: one round
 * trip, nothing mapped or decoded. A new version replaces the kept source
 * once its copy is done.
 *
 * Threads: st_get_into on the client's thread; st_result_copy_into on any
 * thread while its result lives.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "common/fail.h"
#include "common/geometry.h"

/* Keys whose last source a client keeps mapped. */
#define INTO_KEEP_KEYS 16
/* Differences a refusal lists by name; the rest are counted. */
#define INTO_LIST_MAX 8

struct st__into_kept {
  char *key;       /* the key, or "key\x1fview" */
  st_result_t *src;
  uint64_t version; /* src's version: asked for as `have` next time */
  uint64_t used;   /* the client's st_get_into count when last used */
};

/* What a check found: the text of the first differences and their count. */
typedef struct diffs {
  st__text_t text;
  size_t count;
} diffs_t;

static void diff_add(diffs_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void diff_add(diffs_t *d, const char *fmt, ...) {
  if (d->count++ >= INTO_LIST_MAX) return;
  char line[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (d->text.len) st__client_text_puts(&d->text, "; ");
  st__client_text_puts(&d->text, line);
}

/* "[4, 8]" of a shape into buf. */
static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (at < len) snprintf(buf + at, len - at, "]");
  return buf;
}

static const char *device_text(const st_tensor_t *t, char *buf, size_t len) {
  if (t->device == ST_DEVICE_CUDA) snprintf(buf, len, "cuda:%d", t->device_index);
  else snprintf(buf, len, "cpu");
  return buf;
}

/* Elements of a destination's shape, or -1 when a size is negative or
 * the product overflows. */
static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] && n > INT64_MAX / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

/* A destination that cannot be copied into whatever the source is: NULL
 * name, ndim, shape, dtype, device, data. ST_OK or INVALID_ARGUMENT. */
static int check_destination(const st_tensor_t *t, size_t i, char *err, size_t errlen) {
  const char *name = t->name && *t->name ? t->name : NULL;
  if (!name) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "destination %zu has no name", i);
  if (t->ndim < 0 || t->ndim > ST_MAX_NDIM || (t->ndim && !t->shape))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "destination '%s': ndim %d (0 to %d, with a shape)", name, t->ndim,
                    ST_MAX_NDIM);
  int64_t n = numel_of(t->ndim, t->shape);
  if (n < 0 || st_dtype_size(t->dtype) == 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "destination '%s': a negative size, or an unknown dtype %d", name,
                    (int)t->dtype);
  if (t->device != ST_DEVICE_CPU && t->device != ST_DEVICE_CUDA)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "destination '%s': unknown device %d",
                    name, (int)t->device);
  if (t->device == ST_DEVICE_CUDA && t->device_index < 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "destination '%s': a CUDA tensor needs its device_index", name);
  if (n > 0 && !t->data)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "destination '%s': NULL data", name);
  /* NULL strides are row-major; others as the geometry's one rule says */
  if (t->strides && !st__geom_contiguous_of(t->ndim, t->shape, t->strides))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "destination '%s' is not contiguous: st_get_into copies into contiguous "
                    "tensors (Python's get_into copies into any)",
                    name);
  return ST_OK;
}

/* The one CUDA ordinal a (source, destination) pair copies on, or -1 for
 * CPU to CPU. */
static int pair_ordinal(const st_tensor_t *s, const st_tensor_t *d) {
  if (d->device == ST_DEVICE_CUDA) return d->device_index;
  return s->device == ST_DEVICE_CUDA ? s->device_index : -1;
}

/* A name and where it is (a destination's index, a source tensor's). */
typedef struct named {
  const char *name;
  size_t at;
} named_t;

static int named_order(const void *a, const void *b) {
  const named_t *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->at > y->at) - (x->at < y->at);
}

static int named_is(const void *key, const void *elem) {
  return strcmp(key, ((const named_t *)elem)->name);
}

/* The first entry of sorted v[n] named `name`, or NULL. */
static const named_t *named_find(const named_t *v, size_t n, const char *name) {
  const named_t *e = bsearch(name, v, n, sizeof *v, named_is);
  while (e && e > v && strcmp(e[-1].name, name) == 0) e--;
  return e;
}

/* Every difference between the destinations and the source's tensors into
 * *df; match[i] the source tensor of dst[i] (NULL: none); *ordinal the
 * CUDA device the copies use (-1: none). Names are looked up in sorted
 * indexes, so that a model of thousands of tensors checks in n log n.
 * ST_OK or ST_ERR_OUT_OF_MEMORY. */
static int compare(const st_result_t *src, const st_tensor_t *dst, size_t n,
                   const st_tensor_t **match, diffs_t *df, int *ordinal) {
  char a[160], b[160];
  *ordinal = -1;
  size_t m = st_result_tensor_count(src);
  named_t *sx = malloc((m + 1) * sizeof *sx), *dx = malloc((n + 1) * sizeof *dx);
  char *twice = calloc(n + 1, 1);
  if (!sx || !dx || !twice) {
    free(sx);
    free(dx);
    free(twice);
    return ST_ERR_OUT_OF_MEMORY;
  }
  for (size_t j = 0; j < m; j++) sx[j] = (named_t){st_result_tensor(src, j)->name, j};
  for (size_t i = 0; i < n; i++) dx[i] = (named_t){dst[i].name, i};
  qsort(sx, m, sizeof *sx, named_order);
  qsort(dx, n, sizeof *dx, named_order);
  for (size_t k = 1; k < n; k++)
    if (strcmp(dx[k - 1].name, dx[k].name) == 0) twice[dx[k].at] = 1;
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *d = &dst[i];
    if (twice[i]) diff_add(df, "'%s' is given twice", d->name);
    const named_t *f = named_find(sx, m, d->name);
    const st_tensor_t *s = match[i] = f ? st_result_tensor(src, f->at) : NULL;
    if (!s) {
      diff_add(df, "missing '%s' (the source has no such tensor)", d->name);
      continue;
    }
    if (s->dtype != d->dtype)
      diff_add(df, "'%s': dtype %s here, %s in the source", d->name, st_dtype_name(d->dtype),
               st_dtype_name(s->dtype));
    if (s->ndim != d->ndim || (d->ndim && memcmp(s->shape, d->shape, (size_t)d->ndim * sizeof *d->shape)))
      diff_add(df, "'%s': shape %s here, %s in the source", d->name,
               shape_text(d->ndim, d->shape, a, sizeof a),
               shape_text(s->ndim, s->shape, b, sizeof b));
    if (!st_tensor_is_contiguous(s))
      diff_add(df, "'%s': the source is not contiguous (ask for a view ending in `contiguous`)",
               d->name);
    if (s->device == ST_DEVICE_CUDA && d->device == ST_DEVICE_CUDA &&
        s->device_index != d->device_index)
      diff_add(df, "'%s': on %s here, %s in the source (copies stay on one device)", d->name,
               device_text(d, a, sizeof a), device_text(s, b, sizeof b));
    int o = pair_ordinal(s, d);
    if (o >= 0 && *ordinal >= 0 && o != *ordinal)
      diff_add(df, "'%s' copies on cuda:%d, others on cuda:%d (one device per call)", d->name, o,
               *ordinal);
    else if (o >= 0)
      *ordinal = o;
  }
  for (size_t j = 0; j < m; j++) {
    const st_tensor_t *s = st_result_tensor(src, j);
    if (!named_find(dx, n, s->name))
      diff_add(df, "extra '%s' (no destination of that name)", s->name);
  }
  free(sx);
  free(dx);
  free(twice);
  return ST_OK;
}

/* Checks, then copies: see st_result_copy_into. `sync` forces a wait for
 * the stream. `what` names the source in messages. */
static int copy_into(const st_result_t *src, const st_tensor_t *dst, size_t n, void *stream,
                     int sync, const char *what, char *err, size_t errlen) {
  if (!src || (n && !dst))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "%s: NULL source or destinations",
                    what);
  for (size_t i = 0; i < n; i++) {
    int rc = check_destination(&dst[i], i, err, errlen);
    if (rc != ST_OK) return rc;
  }
  const st_tensor_t **match = calloc(n + 1, sizeof *match);
  st__client_copy_t *plan = calloc(n + 1, sizeof *plan);
  diffs_t df = {{0}, 0};
  int ordinal = -1;
  if (!match || !plan || compare(src, dst, n, match, &df, &ordinal) != ST_OK) {
    free(match);
    free(plan);
    free(df.text.ptr);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "%s: out of memory", what);
  }
  if (df.count) {
    int rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "%s: %zu difference%s, nothing copied: %s%s", what, df.count,
                      df.count == 1 ? "" : "s", df.text.oom ? "(out of memory)" : df.text.ptr,
                      df.count > INTO_LIST_MAX ? "; ..." : "");
    free(df.text.ptr);
    free(match);
    free(plan);
    return rc;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *s = match[i];
    if (pair_ordinal(s, &dst[i]) < 0) {
      if (s->nbytes) memcpy(dst[i].data, s->data, s->nbytes);
    } else {
      plan[k++] = (st__client_copy_t){.dst = dst[i].data, .src = s->data, .bytes = s->nbytes};
    }
  }
  int rc = ST_OK;
  if (k) {
    char why[400];
    rc = st__client_cuda_copies(plan, k, ordinal, stream, sync || !stream ? ST_COPY_SYNC : 0,
                                why, sizeof why);
    if (rc != ST_OK) st__fail(rc, err, errlen, "%s: %s", what, why);
  }
  free(match);
  free(plan);
  return rc;
}

/* See client.h. Any thread. */
ST_API int st_copy_ranges(int ordinal, const uint64_t *dst, const uint64_t *src,
                          const uint64_t *bytes, size_t n, void *stream, int flags, char *err,
                          size_t errlen) {
  if (n && (!dst || !src || !bytes))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "copy_ranges: NULL ranges");
  if (flags & ~(ST_COPY_SYNC | ST_COPY_DEVICE))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "copy_ranges: unknown flags 0x%x",
                    (unsigned)flags);
  if ((flags & ST_COPY_DEVICE) && ordinal < 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "copy_ranges: ST_COPY_DEVICE names device memory, but ordinal is -1 (host)");
  if (ordinal < 0) {
    for (size_t i = 0; i < n; i++)
      if (bytes[i]) memcpy((void *)(uintptr_t)dst[i], (const void *)(uintptr_t)src[i], bytes[i]);
    return ST_OK;
  }
  st__client_copy_t *plan = calloc(n + 1, sizeof *plan);
  if (!plan) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "copy_ranges: out of memory");
  for (size_t i = 0; i < n; i++)
    plan[i] = (st__client_copy_t){.dst = (void *)(uintptr_t)dst[i],
                                  .src = (const void *)(uintptr_t)src[i], .bytes = bytes[i]};
  int rc = st__client_cuda_copies(plan, n, ordinal, stream, flags, err, errlen);
  free(plan);
  return rc;
}

/* See client.h. Any thread while src lives. */
ST_API int st_result_copy_into(const st_result_t *src, const st_tensor_t *dst, size_t n,
                               void *stream, char *err, size_t errlen) {
  return copy_into(src, dst, n, stream, 0, "copy_into", err, errlen);
}

/* The kept entry of key, or NULL. */
static struct st__into_kept *kept_find(st_client_t *c, const char *key) {
  for (size_t i = 0; i < c->into_n; i++)
    if (strcmp(c->into[i].key, key) == 0) return &c->into[i];
  return NULL;
}

/* Keeps r (the reference passes to c) as key's source, letting go of the
 * one it replaces, or of the least recently used key's when all
 * INTO_KEEP_KEYS are taken. Out of memory: r is freed, nothing kept. */
static void into_reset(st_client_t *c);

static void kept_put(st_client_t *c, const char *key, st_result_t *r, uint64_t version) {
  struct st__into_kept *e = kept_find(c, key);
  if (!e) {
    if (!c->into) c->into = calloc(INTO_KEEP_KEYS, sizeof *c->into);
    c->into_reset = into_reset;
    char *name = c->into ? strdup(key) : NULL;
    if (!name) {
      st_result_free(r);
      return;
    }
    if (c->into_n < INTO_KEEP_KEYS) {
      e = &c->into[c->into_n++];
    } else {
      e = &c->into[0];
      for (size_t i = 1; i < c->into_n; i++)
        if (c->into[i].used < e->used) e = &c->into[i];
      free(e->key);
      st_result_free(e->src);
      e->src = NULL;
    }
    e->key = name;
  }
  st_result_free(e->src);   /* the same arenas stay mapped: r holds them */
  e->src = r;
  e->version = version;
  e->used = ++c->into_uses;
}

/* Lets go of every kept source (st_client_close, through c->into_reset).
 * Thread of the client. */
static void into_reset(st_client_t *c) {
  for (size_t i = 0; i < c->into_n; i++) {
    free(c->into[i].key);
    st_result_free(c->into[i].src);
  }
  free(c->into);
  c->into = NULL;
  c->into_n = 0;
}

/* See client.h. Thread of the client. */
ST_API int st_get_into(st_client_t *c, const char *key, uint64_t version, const char *view,
                       const st_tensor_t *dst, size_t n, void *stream, uint64_t *got_version) {
  if (got_version) *got_version = 0;
  if (!c) return ST_ERR_INVALID_ARGUMENT;
  if (!key || !*key) return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "get_into: no key given");
  char err[512];
  for (size_t i = 0; i < n && dst; i++) {
    int rc = check_destination(&dst[i], i, err, sizeof err);
    if (rc != ST_OK) return st__client_fail(c, rc, "get_into '%s': %s", key, err);
  }
  /* Kept per (key, view): another view of the key is another source. */
  char *name = NULL;
  if (view && *view ? asprintf(&name, "%s\x1f%s", key, view) < 0 : !(name = strdup(key)))
    return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "get_into '%s': out of memory", key);
  struct st__into_kept *e = kept_find(c, name);
  st_result_t *r = NULL;
  uint64_t got = 0;
  /* The kept version, if still the one asked for, comes back as `same`:
   * one round trip, nothing mapped or decoded. */
  int rc = st_client_get_since(c, key, version, ST_GET_READONLY, view, e ? e->version : 0, &r,
                               &got);
  if (rc != ST_OK) {
    free(name);
    return rc;
  }
  char what[200];
  snprintf(what, sizeof what, "get_into '%.128s' version %llu", key, (unsigned long long)got);
  rc = copy_into(r ? r : e->src, dst, n, stream, 1, what, err, sizeof err);
  if (rc != ST_OK) {
    st_result_free(r);
    free(name);
    return st__client_fail(c, rc, "%s", err);
  }
  if (r) kept_put(c, name, r, got);
  else e->used = ++c->into_uses;
  free(name);
  if (got_version) *got_version = got;
  return ST_OK;
}

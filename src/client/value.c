/* src/client: read-only accessors of results and values. All of
 * them only read what a result owns, so any thread may call them while the
 * result lives. */
#include <string.h>

#include "client/result.h"

/* Value of a MAP under a string key, or NULL (not a map, absent). */
ST_API const st_value_t *st_value_get(const st_value_t *map, const char *key) {
  if (!map || !key || map->kind != ST_VALUE_MAP) return NULL;
  size_t n = strlen(key);
  for (size_t i = 0; i < map->as.map.len; i++) {
    const st_value_t *k = &map->as.map.keys[i];
    if (k->kind == ST_VALUE_STRING && k->as.str.len == n && memcmp(k->as.str.ptr, key, n) == 0)
      return &map->as.map.values[i];
  }
  return NULL;
}

/* The reply value of r (borrowed), NULL for a NULL result. */
ST_API const st_value_t *st_result_value(const st_result_t *r) { return r ? r->value : NULL; }

/* The object a call/task result names; see client.h. Any thread. */
ST_API int st_result_object(const st_result_t *r, st_object_info_t *out) {
  if (!r || !out) return ST_ERR_INVALID_ARGUMENT;
  if (!r->has_object) return ST_ERR_NOT_FOUND;
  *out = r->object;
  /* A `same` reply of a managed object updates it (kept_objects.c). */
  out->refcount = __atomic_load_n(&r->object.refcount, __ATOMIC_RELAXED);
  return ST_OK;
}

/* Number of tensors in r (module tensors included). */
ST_API size_t st_result_tensor_count(const st_result_t *r) { return r ? r->ntensors : 0; }

/* Tensor i in depth-first reply order, or NULL past the end. Borrowed. */
ST_API const st_tensor_t *st_result_tensor(const st_result_t *r, size_t i) {
  return r && i < r->ntensors ? r->tensors[i] : NULL;
}

/* First tensor named `name` ("" is a bare tensor), or NULL. Borrowed. */
ST_API const st_tensor_t *st_result_find(const st_result_t *r, const char *name) {
  if (!r || !name) return NULL;
  for (size_t i = 0; i < r->ntensors; i++)
    if (strcmp(r->tensors[i]->name, name) == 0) return r->tensors[i];
  return NULL;
}

/* src/engine: build results (result.h). */
#include "engine/result.h"

#include <stdlib.h>
#include <string.h>

/* An empty result: no value bytes, no arenas. Any thread. */
void st__build_result_init(st__build_result_t *r) {
  memset(r, 0, sizeof *r);
  msgpack_sbuffer_init(&r->value);
}

/* Drops the arena references and frees the buffers; r is empty after it
 * and may be destroyed again. Any thread that owns r. */
void st__build_result_destroy(st__build_result_t *r) {
  for (size_t i = 0; i < r->narenas; i++) st__arena_unref(r->arenas[i]);
  free(r->arenas);
  msgpack_sbuffer_destroy(&r->value);
  st__build_result_init(r);
}

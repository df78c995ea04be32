/* src/engine: what a build produces, handed from a worker to the loop
 * thread (ownership moves with the struct).
 */
#ifndef ST_ENGINE_RESULT_H
#define ST_ENGINE_RESULT_H

#include <msgpack.h>
#include <stdint.h>

#include "mem/arena.h"

typedef struct st__build_result {
  msgpack_sbuffer value;      /* owned: the msgpack value; tensor ext values
                                 name arenas by index into `arenas` */
  st__arena_t **arenas;       /* owned references, distinct, in first-use order */
  size_t narenas;
  uint64_t bytes;             /* sum of arena sizes */
} st__build_result_t;

void st__build_result_init(st__build_result_t *r);
/* Drops the arena references and frees the buffers. Any thread. */
void st__build_result_destroy(st__build_result_t *r);

#endif

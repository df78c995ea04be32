/* src/mem: arenas, the allocations that hold tensor data and travel to
 * clients as file descriptors (DESIGN §3).
 *
 * An arena is one allocation: for the CPU backend a sealed memfd mapped
 * read-write in the server. Tensors live in an arena at byte offsets; an
 * object (a module, a result tensor) is one arena. The server's reference
 * and each client's mapping are independent: the kernel keeps the memory
 * while any fd or mapping exists, so unref'ing the last server reference
 * never invalidates what a client mapped.
 *
 * Threads: arenas are created and filled on worker threads and handed to the
 * loop thread; the reference count is atomic, so ref/unref may be called
 * from any thread. The data itself is not locked.
 */
#ifndef ST_MEM_ARENA_H
#define ST_MEM_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

typedef struct st__arena st__arena_t;

/* Offsets of tensors inside an arena are multiples of this. */
#define ST_ARENA_ALIGN 256u

/* Creates a CPU arena of `bytes` (0 is allowed and still yields a valid,
 * mappable arena of one page), zero-filled: a memfd named
 * "st-arena-<id>", sized, sealed against shrinking and growing (a client
 * cannot truncate it under the server), and mapped read-write.
 * On success *out holds one reference owned by the caller.
 * Errors: ST_ERR_OUT_OF_MEMORY, ST_ERR_LIMIT (bytes above the process-wide
 * cap set by st__arena_set_limit), with a reason in err. Any thread. */
int st__arena_new_cpu(uint64_t bytes, st__arena_t **out, char *err, size_t errlen);

/* Caps the size of one arena (config max_object_bytes). Call once at start
 * before any worker runs. 0 means no cap. */
void st__arena_set_limit(uint64_t max_bytes);

/* Reference counting; unref of the last reference unmaps and closes. NULL
 * is a no-op for unref. Any thread. */
void st__arena_ref(st__arena_t *a);
void st__arena_unref(st__arena_t *a);

/* Base address in the server (borrowed, valid while a reference is held),
 * usable size (what was asked for), and the process-unique id. */
void *st__arena_base(const st__arena_t *a);
uint64_t st__arena_bytes(const st__arena_t *a);
uint64_t st__arena_id(const st__arena_t *a);

/* A new descriptor for the allocation, to send to one client (the caller
 * owns it and closes it after sendmsg). Returns the fd, or a negative
 * ST_ERR_* (ST_ERR_LIMIT when the process is out of descriptors). */
int st__arena_dup_fd(const st__arena_t *a);

/* Fills everything of *d except d->fd (the message-local index). */
void st__arena_describe(const st__arena_t *a, st__arena_desc_t *d);

/* Live arenas and their bytes in this process (for info and leak checks). */
void st__arena_stats(uint64_t *count, uint64_t *bytes);

#endif

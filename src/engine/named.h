/* src/engine: what named shared things (hand-offs, buffers) have in
 * common: the name rules, who may use one, the table they live in, and
 * their memory (a data arena and a control page).
 *
 * Names are 1 to ST__NAME_MAX bytes of [A-Za-z0-9._-], one namespace per
 * kind and server process; only the uid that created a named thing may
 * open or remove it. A thing embeds st__named_t as its first member, so
 * a table (st__named_list_t) holds hand-offs or buffers alike. The data
 * arena is a memfd arena on the CPU or a VMM arena on CUDA, the page a
 * memfd arena; both are charged to their device's memory budget like any
 * arena. Loop thread only.
 */
#ifndef ST_ENGINE_NAMED_H
#define ST_ENGINE_NAMED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem/arena.h"

#define ST__NAME_MAX 64

typedef struct st__named {
  struct st__named *next;
  char name[ST__NAME_MAX + 1];
  uid_t uid;                    /* the creator's: only it may open it     */
  int device;                   /* -1: the CPU; else a CUDA ordinal        */
  st__arena_t *data;            /* owned reference                        */
  st__arena_t *page_arena;      /* owned reference                        */
  void *page;                   /* the server's mapping of page_arena     */
  uint64_t page_bytes;
} st__named_t;

typedef struct st__named_list {
  st__named_t *head;
  size_t count;
} st__named_list_t;

/* ST_OK when s (n bytes) is a valid name, else ST_ERR_INVALID_ARGUMENT
 * with "a <kind> name is 1 to 64 characters of A-Z a-z 0-9 . _ -" in
 * err. */
int st__named_check(const char *kind, const char *s, size_t n, char *err, size_t errlen);

/* The entry of l named s (n bytes), or NULL. */
st__named_t *st__named_find(const st__named_list_t *l, const char *s, size_t n);

/* ST_OK when no entry of l is named s, else INVALID_ARGUMENT "a <kind>
 * named 'x' exists". */
int st__named_unused(const st__named_list_t *l, const char *kind, const char *s, size_t n,
                     char *err, size_t errlen);

/* The entry of l named s for uid `uid` that wants to `what` (open,
 * delete, ...) it: ST_OK with *out, NOT_FOUND ("no <kind> named 'x'"), or
 * AUTH for another uid than its creator's (the message names both). */
int st__named_lookup(const st__named_list_t *l, const char *kind, const char *s, size_t n,
                     uid_t uid, const char *what, st__named_t **out, char *err, size_t errlen);

/* ST_OK when a connection that uses `n` <things> may use one more (n <
 * max), else ST_ERR_LIMIT naming limits.<key> and its value. */
int st__named_room(int n, int max, const char *things, const char *key, char *err,
                   size_t errlen);

/* Fills e (zeroed by the caller) with name s of uid `uid` and allocates
 * its data arena (`data_bytes` on `device`) and its page (`page_bytes`,
 * zero-filled, mapped at e->page). Errors of the arenas (OUT_OF_MEMORY,
 * LIMIT, CAPABILITY) with nothing left allocated. */
int st__named_init(st__named_t *e, const char *s, size_t n, uid_t uid, int device,
                   uint64_t data_bytes, uint64_t page_bytes, char *err, size_t errlen);

/* Puts e at the head of l. */
void st__named_add(st__named_list_t *l, st__named_t *e);

/* Takes e out of l (NULL, or e not in it: nothing). */
void st__named_remove(st__named_list_t *l, st__named_t *e);

/* Takes e out of l (as st__named_remove) and drops its arenas; the caller
 * frees e. Clients' mappings keep the memory. */
void st__named_release(st__named_list_t *l, st__named_t *e);

#endif

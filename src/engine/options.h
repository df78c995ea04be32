/* src/engine: the endpoint options as rows (one per X(...) entry of
 * endpoint_options.h), and what every reader of a declaration does with
 * an option by its type alone: default, pack (the `endpoints` method),
 * show (`stserver --check`), free. Code that lists options iterates
 * st__endpoint_options and never names one.
 *
 * Threads: the rows are read-only data; the functions touch only the
 * declaration they are given.
 */
#ifndef ST_ENGINE_OPTIONS_H
#define ST_ENGINE_OPTIONS_H

#include <msgpack.h>
#include <stddef.h>

#include "engine/generation.h"

typedef enum {
  ST_OPT_ENUM = 0,
  ST_OPT_BOOL,
  ST_OPT_SECONDS,
  ST_OPT_STRING,
  ST_OPT_DEVICE,
  ST_OPT_KEY_FORMAT
} st__option_type_t;

typedef struct st__option {
  const char *name;
  st__option_type_t type;
  size_t offset;              /* the st__endpoint_decl_t member */
  double dflt;                /* ENUM index, BOOL 0/1, SECONDS (0 = none) */
  const char *choices;        /* ENUM: "a|b" */
  const char *implies;        /* a BOOL option set true by a value of this one */
  const char *description;
} st__option_t;

/* Every option, in the order of endpoint_options.h. */
#define ST__OPTION_COUNT(...) +1
enum { ST__ENDPOINT_NOPTIONS = 0 ST__ENDPOINT_OPTIONS(ST__OPTION_COUNT) };
extern const st__option_t st__endpoint_options[ST__ENDPOINT_NOPTIONS];

/* The option named `name`, or NULL. Borrowed. */
const st__option_t *st__option_find(const char *name);

/* Sets every option of d to its default (strings to NULL, not freed). */
void st__options_defaults(st__endpoint_decl_t *d);

/* Frees the strings of d's options and sets them to NULL. */
void st__options_free(st__endpoint_decl_t *d);

/* The value of an ENUM or BOOL option (index, 0/1); of a string option
 * (borrowed, NULL: unset). */
int st__option_int(const st__option_t *o, const st__endpoint_decl_t *d);
const char *st__option_text(const st__option_t *o, const st__endpoint_decl_t *d);

/* Stores a value (the string is taken: owned by d, the old one freed). */
void st__option_set_int(const st__option_t *o, st__endpoint_decl_t *d, int v);
void st__option_set_seconds(const st__option_t *o, st__endpoint_decl_t *d, double v);
void st__option_set_text(const st__option_t *o, st__endpoint_decl_t *d, char *s);

/* Nonzero when d's value of o is its default. */
int st__option_is_default(const st__option_t *o, const st__endpoint_decl_t *d);

/* Packs d's value of o as the `endpoints` method sends it: ENUM its word,
 * BOOL a boolean, SECONDS a number (nil when none), strings a string (nil
 * when unset). */
void st__option_pack(msgpack_packer *pk, const st__option_t *o, const st__endpoint_decl_t *d);

/* d's value of o as text into buf ("task", "yes", "2.5", "-" when unset),
 * as `stserver --check` shows it. Returns buf. */
const char *st__option_show(const st__option_t *o, const st__endpoint_decl_t *d, char *buf,
                            size_t len);

/* Nonzero for "cpu" and "cuda:N" (N: 1 to 4 digits), and for a bare
 * "cuda" when bare_cuda (the device option; budgets need an index). */
int st__device_name_ok(const char *s, int bare_cuda);

#endif

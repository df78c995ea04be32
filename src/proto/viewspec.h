/* src/proto/viewspec.h: the view spec of docs/views.md, section 1: its
 * text parsed once into a bounded, normalized form, selectors matched
 * against tensor names, and steps applied to one tensor descriptor.
 *
 *   spec     := rule (";" rule)*
 *   rule     := [selector ":"] step ("|" step)*
 *   selector := a glob over tensor names ("*" any run, "?" one byte;
 *               default "*"); any bytes but ; : | and blanks
 *   step     := narrow(dim, start, length) | slice(dim, start, stop[, step])
 *             | shard(dim, rank, world) | transpose(d0, d1)
 *             | permute(d0, d1, ...) | contiguous   (contiguous: last only)
 *
 * Blanks between tokens are allowed. A tensor takes the first rule whose
 * selector matches its name; every rule must take at least one tensor.
 * Every step but `contiguous` is a strided window (geometry.h); the
 * caller decides what `contiguous` on a window that is not contiguous
 * means (the server materializes it). The normalized text (selectors
 * explicit, no blanks, slice's step written out) names the view in
 * caches: two specs that mean the same rules in the same order have the
 * same text.
 *
 * No I/O, no state: any thread, on objects it owns.
 */
#ifndef ST_PROTO_VIEWSPEC_H
#define ST_PROTO_VIEWSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/* Bounds of a spec: its text, its rules, the steps of one rule, the bytes
 * of one selector. */
#define ST__VIEW_TEXT_MAX 4096
#define ST__VIEW_RULES_MAX 64
#define ST__VIEW_STEPS_MAX 16
#define ST__VIEW_SELECTOR_MAX 256

typedef enum {
  ST__VIEW_NARROW = 0,
  ST__VIEW_SLICE,
  ST__VIEW_SHARD,
  ST__VIEW_TRANSPOSE,
  ST__VIEW_PERMUTE,
  ST__VIEW_CONTIGUOUS
} st__view_kind_t;

typedef struct st__view_step {
  st__view_kind_t kind;
  int nargs;
  int64_t args[ST_MAX_NDIM];
} st__view_step_t;

/* A selector compiled once per spec (viewspec.c, "matching"): the
 * glob's nondeterministic automaton as bit masks. State i (0..nitems)
 * means "the first i bytes-or-? of the glob matched"; a `*` before item i
 * is a self-loop on state i. Matching a name of n bytes costs n * words
 * word operations: linear in the name, with at most
 * ST__VIEW_GLOB_WORDS_MAX words at the selector bound. */
#define ST__VIEW_GLOB_WORDS_MAX ((ST__VIEW_SELECTOR_MAX + 1 + 63) / 64)

typedef struct st__view_glob {
  int nitems;                 /* bytes and ? of the glob (no *) */
  int words;                  /* 64-bit words per state set */
  uint8_t cls[256];           /* byte -> class (0: no literal of the glob) */
  int nclasses;
  uint64_t *masks;            /* owned: nclasses * words; bit i+1: item i
                               * takes a byte of the class */
  uint64_t loops[ST__VIEW_GLOB_WORDS_MAX];   /* bit i: state i self-loops */
} st__view_glob_t;

typedef struct st__view_rule {
  char selector[ST__VIEW_SELECTOR_MAX + 1];   /* NUL-terminated glob */
  st__view_glob_t glob;       /* the selector compiled */
  int nsteps;
  st__view_step_t steps[ST__VIEW_STEPS_MAX];
  int contiguous;                   /* the last step is `contiguous` */
} st__view_rule_t;

typedef struct st__viewspec {
  int nrules;
  st__view_rule_t *rules;           /* owned, nrules */
  char *text;                       /* owned: the normalized text */
  size_t text_len;
  int contiguous;                   /* some rule ends with `contiguous` */
} st__viewspec_t;

/* Parses (text, len) into a new spec (*out, freed with
 * st__viewspec_free). ST_OK, ST_ERR_INVALID_ARGUMENT with a message that
 * names the rule, the step and the byte where it went wrong ("view: rule
 * 1, step 2 at byte 9: unknown step 'foo' (...)"), or OUT_OF_MEMORY. */
int st__viewspec_parse(const char *text, size_t len, st__viewspec_t **out, char *err,
                       size_t errlen);

/* Frees a spec; NULL is a no-op. */
void st__viewspec_free(st__viewspec_t *v);

/* Compiles glob `pat` (NUL-terminated, at most ST__VIEW_SELECTOR_MAX
 * bytes) into *g (st__viewspec_glob_free frees it). ST_OK,
 * INVALID_ARGUMENT (too long) or OUT_OF_MEMORY. */
int st__viewspec_glob_compile(const char *pat, st__view_glob_t *g);

/* Frees what *g owns. */
void st__viewspec_glob_free(st__view_glob_t *g);

/* 1 when compiled glob g matches all of (name, len). Adds the word
 * operations it made to *steps (may be NULL): at most len * g->words, so
 * matching is linear in the name whatever the glob (no backtracking). */
int st__viewspec_glob_match(const st__view_glob_t *g, const char *name, size_t len,
                            uint64_t *steps);

/* 1 when glob `pat` (NUL-terminated) matches all of (name, len): compiles
 * and matches (tests, one-off uses). 0 also for a glob too long or out of
 * memory. */
int st__viewspec_glob(const char *pat, const char *name, size_t len);

/* The index of the first rule whose selector matches (name, len), or -1.
 * Adds the word operations to *steps (may be NULL). */
int st__viewspec_match(const st__viewspec_t *v, const char *name, size_t len, uint64_t *steps);

/* Applies the window steps of rule `rule` to *d (its `contiguous` step
 * is not applied: *materialize (may be NULL) says whether the rule asks
 * for it and the window is not contiguous). On failure *d is untouched
 * and err holds "shard(0,5,4): rank 5 is not below world 4 (tensor
 * 'w')": the step as written normalized, the bound, the tensor. */
int st__viewspec_apply(const st__viewspec_t *v, int rule, const char *name, size_t name_len,
                       st__tensor_desc_t *d, int *materialize, char *err, size_t errlen);

/* ------------------------------------------------------------ values
 * (viewvalue.c) */

/* Longest tensor name (dotted path) a value may give a tensor. */
#define ST__VIEW_NAME_MAX 2048

/* Called for each tensor of a value, in order (`index` counts them from
 * 0), after its rule's windows: `rule` is the rule that took it (-1:
 * none, *d is the tensor as it was), `materialize` whether that rule asks
 * for `contiguous` and the window is not, or the tensor is in a module
 * another tensor of which is materialized: a module's tensors share one
 * arena (docs/protocol.md, "Module"), so a module's tensors are all
 * materialized or none is. It may change *d (the descriptor packed).
 * ST_OK or an error with err set, which stops the walk. */
typedef int (*st__view_tensor_fn)(void *ud, size_t index, int rule, int materialize,
                                  st__tensor_desc_t *d, char *err, size_t errlen);

/* Packs (value, len), the msgpack value of a result, into *out (an
 * initialized buffer the caller owns) with every tensor seen through v.
 * A tensor's name is the one clients give it (docs/views.md): map keys
 * and array indices joined by '.', a module's tensors "<path>.<name>", a
 * value that is one tensor "". Module metadata is packed as it is. fn
 * (may be NULL) sees every tensor. Errors (out then holds a partial
 * value): INVALID_ARGUMENT for a step past a bound (st__viewspec_apply's
 * message) and for a rule that takes no tensor ("view: rule 2 ('x*')
 * selects no tensor (tensors: a, b)"), PROTOCOL for a value that is not
 * what a server packs, or fn's error. */
int st__viewspec_value(const st__viewspec_t *v, const char *value, size_t len,
                       msgpack_sbuffer *out, st__view_tensor_fn fn, void *ud, char *err,
                       size_t errlen);

/* What a walk may cost before it stops (st__viewspec_value_bounded). A
 * step is one word operation of a glob (st__viewspec_glob_match) or one
 * value object visited (ST__VIEW_OBJECT_STEPS). */
#define ST__VIEW_OBJECT_STEPS 32

/* Returned by st__viewspec_value_bounded when the walk would pass its
 * budget: nothing was handed out but to fn (out holds a partial value). */
#define ST__VIEW_OVER_BUDGET 1

/* st__viewspec_value that stops once its steps pass max_steps (0: no
 * bound) and returns ST__VIEW_OVER_BUDGET then; *steps (may be NULL)
 * receives the steps it took. The server walks on its loop thread with a
 * bound and hands a walk past it to a worker (server/views.c). */
int st__viewspec_value_bounded(const st__viewspec_t *v, const char *value, size_t len,
                               msgpack_sbuffer *out, st__view_tensor_fn fn, void *ud,
                               uint64_t max_steps, uint64_t *steps, char *err, size_t errlen);

#endif

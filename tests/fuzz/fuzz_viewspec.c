/* Fuzz target: the view spec (src/proto/viewspec.c) and a value seen
 * through it (src/proto/viewvalue.c), as the server runs them for `get
 * {view}` and `call {view}`.
 *
 * Input: two bytes (little endian) giving the spec's length n (cut to
 * what is there), n bytes of spec text, and the rest: one msgpack value,
 * the result the view sees (bounded by the framing scan, as a stored
 * value is).
 *
 * Properties: a spec parses or fails with INVALID_ARGUMENT and a message
 * that starts with "view:"; its normalized text parses to itself; every
 * rule's compiled selector agrees with a reference glob on the names
 * tried, in at most len * words steps (linear in the name); a walk of the
 * value through the spec gives the same code, bytes and callbacks with a
 * step bound it stays under as without one, and past the bound it says
 * so; a walk that succeeds packs one msgpack value whose tensors have
 * windows inside the tensors they view.
 */
#include <string.h>

#include "fuzz.h"
#include "proto/scan.h"
#include "proto/viewspec.h"
#include "../proto/ref_glob.h"

static void check_glob(const st__view_rule_t *r, const char *name, size_t len) {
  int want = ref_glob(r->selector, name, len);
  if (want < 0) return;
  uint64_t steps = 0;
  int got = st__viewspec_glob_match(&r->glob, name, len, &steps);
  FUZZ_CHECK(got == want);
  FUZZ_CHECK(steps <= (uint64_t)len * (uint64_t)r->glob.words);
  FUZZ_CHECK(r->glob.words <= ST__VIEW_GLOB_WORDS_MAX);
}

/* What a walk handed to its callback, in order (a hash of it). */
typedef struct seen {
  uint64_t hash;
  size_t n;
} seen_t;

static int record(void *ud, size_t index, int rule, int materialize, st__tensor_desc_t *d,
                  char *err, size_t errlen) {
  seen_t *s = ud;
  FUZZ_CHECK(index == s->n);
  s->n++;
  const unsigned char *b = (const unsigned char *)d;
  uint64_t h = s->hash ^ (uint64_t)(rule + 2) * 1099511628211ull ^ (uint64_t)materialize;
  for (size_t i = 0; i < sizeof *d; i++) h = (h ^ b[i]) * 1099511628211ull;
  s->hash = h;
  return ST_OK;
}

static void walk(const st__viewspec_t *v, const uint8_t *value, size_t len) {
  msgpack_sbuffer a, b;
  msgpack_sbuffer_init(&a);
  msgpack_sbuffer_init(&b);
  char ea[700] = "", eb[700] = "";
  seen_t sa = {0, 0}, sb = {0, 0};
  uint64_t steps = 0, steps_b = 0;
  int ra = st__viewspec_value_bounded(v, (const char *)value, len, &a, record, &sa, 0, &steps,
                                      ea, sizeof ea);
  FUZZ_CHECK(ra == ST_OK || ra == ST_ERR_INVALID_ARGUMENT || ra == ST_ERR_PROTOCOL ||
             ra == ST_ERR_OUT_OF_MEMORY);
  /* A bound above what it took changes nothing. */
  int rb = st__viewspec_value_bounded(v, (const char *)value, len, &b, record, &sb, steps + 1,
                                      &steps_b, eb, sizeof eb);
  FUZZ_CHECK(rb == ra && steps_b == steps && sa.hash == sb.hash && sa.n == sb.n);
  FUZZ_CHECK(a.size == b.size && (a.size == 0 || memcmp(a.data, b.data, a.size) == 0));
  FUZZ_CHECK(strcmp(ea, eb) == 0);
  /* A bound below it stops the walk and says so. */
  if (steps > 1) {
    msgpack_sbuffer c;
    msgpack_sbuffer_init(&c);
    seen_t sc = {0, 0};
    int rc = st__viewspec_value_bounded(v, (const char *)value, len, &c, NULL, &sc, steps / 2,
                                        NULL, eb, sizeof eb);
    FUZZ_CHECK(rc == ST__VIEW_OVER_BUDGET || (rc != ST_OK && ra != ST_OK));
    msgpack_sbuffer_destroy(&c);
  }
  if (ra == ST_OK) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    FUZZ_CHECK(msgpack_unpack_next(&u, a.data, a.size, &off) == MSGPACK_UNPACK_SUCCESS);
    FUZZ_CHECK(off == a.size);
    msgpack_unpacked_destroy(&u);
  }
  msgpack_sbuffer_destroy(&a);
  msgpack_sbuffer_destroy(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  size_t n = (size_t)data[0] | (size_t)data[1] << 8;
  if (n > size - 2) n = size - 2;
  const char *text = (const char *)data + 2;
  const uint8_t *value = data + 2 + n;
  size_t vlen = size - 2 - n;
  st__viewspec_t *v = NULL;
  char err[700] = "";
  int rc = st__viewspec_parse(text, n, &v, err, sizeof err);
  if (rc != ST_OK) {
    FUZZ_CHECK(v == NULL);
    FUZZ_CHECK(rc == ST_ERR_INVALID_ARGUMENT || rc == ST_ERR_OUT_OF_MEMORY);
    if (rc == ST_ERR_INVALID_ARGUMENT) FUZZ_CHECK(strncmp(err, "view:", 5) == 0);
    return 0;
  }
  FUZZ_CHECK(v->nrules >= 1 && v->nrules <= ST__VIEW_RULES_MAX);
  /* The normalized text names the same spec. */
  st__viewspec_t *again = NULL;
  FUZZ_CHECK(st__viewspec_parse(v->text, v->text_len, &again, err, sizeof err) == ST_OK);
  FUZZ_CHECK(again->text_len == v->text_len && memcmp(again->text, v->text, v->text_len) == 0);
  FUZZ_CHECK(again->nrules == v->nrules && again->contiguous == v->contiguous);
  st__viewspec_free(again);
  /* Each selector against the value's bytes as a name, and against the
   * other selectors' text. */
  size_t name_len = vlen < 512 ? vlen : 512;
  for (int i = 0; i < v->nrules; i++) {
    check_glob(&v->rules[i], (const char *)value, name_len);
    check_glob(&v->rules[i], v->rules[(i + 1) % v->nrules].selector,
               strlen(v->rules[(i + 1) % v->nrules].selector));
  }
  if (vlen && st__scan_bounded(value, vlen) == ST_OK) walk(v, value, vlen);
  st__viewspec_free(v);
  return 0;
}

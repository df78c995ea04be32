/* The view spec (src/proto/viewspec.c, viewvalue.c; docs/views.md,
 * section 1): parsing and its errors, selectors, each step on a
 * descriptor, compositions, the shard rule, and values walked by name. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "desc.h"
#include "mpbuf.h"
#include "proto/viewspec.h"
#include "ref_glob.h"

static char why[600];

static st__viewspec_t *parse(const char *text) {
  st__viewspec_t *v = NULL;
  why[0] = '\0';
  if (st__viewspec_parse(text, strlen(text), &v, why, sizeof why) != ST_OK) return NULL;
  return v;
}

/* The normalized text of a spec that must parse. */
static void check_normal(const char *text, const char *want) {
  st__viewspec_t *v = parse(text);
  if (!v) {
    STT_FAIL("'%s' does not parse: %s", text, why);
    return;
  }
  CHECK_STR_EQ(v->text, want);
  st__viewspec_free(v);
}

/* A spec that must fail with a message containing `part`. */
static void check_bad(const char *text, const char *part) {
  st__viewspec_t *v = parse(text);
  if (v) {
    STT_FAIL("'%s' parses as '%s'", text, v->text);
    st__viewspec_free(v);
    return;
  }
  CHECK_CONTAINS(why, part);
}

/* A 4 x 6 float32 tensor at byte 64 of arena 0. */
static st__tensor_desc_t base46(void) {
  st__tensor_desc_t d;
  memset(&d, 0, sizeof d);
  d.offset = 64;
  d.dtype = ST_DTYPE_FLOAT32;
  d.ndim = 2;
  d.shape[0] = 4;
  d.shape[1] = 6;
  d.strides[0] = 6;
  d.strides[1] = 1;
  return d;
}

/* Applies one-rule spec `text` to d; the rc (why holds the message). */
static int apply(const char *text, st__tensor_desc_t *d, int *materialize) {
  st__viewspec_t *v = parse(text);
  if (!v) return -1000;
  int rc = st__viewspec_apply(v, 0, "w", 1, d, materialize, why, sizeof why);
  st__viewspec_free(v);
  return rc;
}

TEST(normalized_text) {
  check_normal("narrow(0,1,2)", "*:narrow(0,1,2)");
  check_normal(" w : narrow( 0 , 1, 2 ) | transpose(0,-1) ; slice(1,0,4)",
               "w:narrow(0,1,2)|transpose(0,-1);*:slice(1,0,4,1)");
  check_normal("*.q_proj.weight:shard(0,1,4);*.o_proj.weight:shard(1,1,4)",
               "*.q_proj.weight:shard(0,1,4);*.o_proj.weight:shard(1,1,4)");
  check_normal("a?:permute(2,0,1)|contiguous", "a?:permute(2,0,1)|contiguous");
  check_normal("contiguous()", "*:contiguous");
  check_normal("slice(0,-3,9223372036854775807,2)", "*:slice(0,-3,9223372036854775807,2)");
  st__viewspec_t *v = parse("x:contiguous;narrow(0,0,1)");
  CHECK(v && v->contiguous && v->rules[0].contiguous && !v->rules[1].contiguous);
  st__viewspec_free(v);
  v = parse("narrow(0,0,1)");
  CHECK(v && !v->contiguous && v->nrules == 1 && strcmp(v->rules[0].selector, "*") == 0);
  st__viewspec_free(v);
}

TEST(parse_errors) {
  check_bad("", "view: the spec is empty");
  check_bad("   ", "the spec is empty");
  check_bad("foo(1)", "view: rule 1, step 1 at byte 0: unknown step 'foo' (narrow, slice,");
  check_bad("narrow(0,1,2)|bar", "rule 1, step 2 at byte 14: unknown step 'bar'");
  check_bad("narrow(0,1)", "narrow takes 3 arguments, not 2");
  check_bad("slice(0,1)", "slice takes 3 to 4 arguments, not 2");
  check_bad("transpose(0,1,2)", "transpose takes 2 arguments, not 3");
  check_bad("permute()", "permute takes 1 to 16 arguments, not 0");
  check_bad("contiguous(1)", "contiguous takes 0 arguments, not 1");
  check_bad("narrow(0,1,2", "expected ',' or ')'");
  check_bad("narrow(0,x,2)", "rule 1, step 1 at byte 9: expected an integer");
  check_bad("narrow(0,99999999999999999999,2)", "integer out of range");
  check_bad("narrow(0,1,2);", "view: rule 2, step 1 at byte 14: expected a step");
  check_bad("narrow(0,1,2) narrow(0,1,2)", "expected '|', ';' or the end of the spec");
  check_bad("contiguous|narrow(0,1,2)", "rule 1, step 2 at byte 11: contiguous must be the last");
  check_bad(":narrow(0,1,2)", "empty selector before ':'");
  check_bad("a|b:narrow(0,1,2)", "a selector holds no '|', blank or NUL byte");
  check_bad("a b:narrow(0,1,2)", "a selector holds no '|'");
  check_bad("w:", "rule 1, step 1 at byte 2: expected a step");
  char long_sel[400];
  memset(long_sel, 'a', 300);
  strcpy(long_sel + 300, ":narrow(0,0,1)");
  check_bad(long_sel, "selector longer than 256 bytes");
  char *many = malloc(65 * 16 + 1);
  many[0] = '\0';
  for (int i = 0; i < 65; i++) strcat(many, i ? ";transpose(0,1)" : "transpose(0,1)");
  check_bad(many, "more than 64 rules");
  free(many);
  char steps[17 * 16 + 1] = "";
  for (int i = 0; i < 17; i++) strcat(steps, i ? "|transpose(0,1)" : "transpose(0,1)");
  check_bad(steps, "rule 1, step 17");
  check_bad(steps, "more than 16 steps in one rule");
  char *huge = malloc(5000);
  memset(huge, ' ', 4999);
  huge[4999] = '\0';
  check_bad(huge, "view: the spec is 4999 bytes; at most 4096");
  free(huge);
  st__viewspec_t *v = NULL;
  CHECK_ERR_MSG(st__viewspec_parse("narrow(0,0,1)\0x", 15, &v, why, sizeof why),
                ST_ERR_INVALID_ARGUMENT, why);
  CHECK_CONTAINS(why, "NUL byte");
  CHECK(v == NULL);
}

TEST(globs) {
  CHECK(st__viewspec_glob("*", "", 0));
  CHECK(st__viewspec_glob("*", "a.b.c", 5));
  CHECK(st__viewspec_glob("a*", "a.b", 3));
  CHECK(!st__viewspec_glob("a*", "ba", 2));
  CHECK(st__viewspec_glob("*.weight", "l0.q.weight", 11));
  CHECK(!st__viewspec_glob("*.weight", "l0.q.bias", 9));
  CHECK(st__viewspec_glob("l?.w", "l1.w", 4));
  CHECK(!st__viewspec_glob("l?.w", "l12.w", 5));
  CHECK(st__viewspec_glob("a*b*c", "axxbyyc", 7));
  CHECK(!st__viewspec_glob("a*b*c", "axxbyy", 6));
  CHECK(st__viewspec_glob("w", "w", 1));
  CHECK(!st__viewspec_glob("w", "w2", 2));
  CHECK(!st__viewspec_glob("", "w", 1));
  st__viewspec_t *v = parse("b*:narrow(0,0,1);a*:narrow(0,0,1);*:narrow(0,0,1)");
  CHECK(v && st__viewspec_match(v, "ab", 2, NULL) == 1);
  CHECK(v && st__viewspec_match(v, "ba", 2, NULL) == 0);
  CHECK(v && st__viewspec_match(v, "c", 1, NULL) == 2);
  st__viewspec_free(v);
}

/* Globs that make a backtracking matcher take len * pattern steps (or
 * worse) match correctly, and the matcher's steps stay at most len *
 * words: linear in the name. Steps are counted, not timed. */
TEST(globs_are_linear) {
  char pat[ST__VIEW_SELECTOR_MAX + 1], name[ST__VIEW_NAME_MAX + 1];
  /* "*a*a*...*a*b" (256 bytes) against "aaa...a" (2048 bytes): no match,
   * and against "aaa...ab": a match. */
  size_t np = 0;
  while (np + 4 <= ST__VIEW_SELECTOR_MAX) pat[np++] = '*', pat[np++] = 'a';
  pat[np++] = '*';
  pat[np++] = 'b';
  pat[np] = '\0';
  memset(name, 'a', ST__VIEW_NAME_MAX);
  st__view_glob_t g;
  CHECK_EQ_INT(st__viewspec_glob_compile(pat, &g), ST_OK);
  CHECK(g.words <= ST__VIEW_GLOB_WORDS_MAX);
  uint64_t steps = 0;
  CHECK(!st__viewspec_glob_match(&g, name, ST__VIEW_NAME_MAX, &steps));
  CHECK(steps <= (uint64_t)ST__VIEW_NAME_MAX * ST__VIEW_GLOB_WORDS_MAX);
  name[ST__VIEW_NAME_MAX - 1] = 'b';
  steps = 0;
  CHECK(st__viewspec_glob_match(&g, name, ST__VIEW_NAME_MAX, &steps));
  CHECK(steps <= (uint64_t)ST__VIEW_NAME_MAX * ST__VIEW_GLOB_WORDS_MAX);
  st__viewspec_glob_free(&g);
  /* "a?a?...?" and "*?*?...": every state live at once. */
  const char *more[] = {"*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?c",
                        "a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a",
                        "*aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab*"};
  for (size_t k = 0; k < sizeof more / sizeof more[0]; k++) {
    CHECK_EQ_INT(st__viewspec_glob_compile(more[k], &g), ST_OK);
    steps = 0;
    int got = st__viewspec_glob_match(&g, name, ST__VIEW_NAME_MAX, &steps);
    CHECK_EQ_INT(got, ref_glob(more[k], name, ST__VIEW_NAME_MAX));
    CHECK(steps <= (uint64_t)ST__VIEW_NAME_MAX * (uint64_t)g.words);
    st__viewspec_glob_free(&g);
  }
  /* Random globs over {a, b, ?, *} against random names over {a, b}
   * agree with the reference, across the word boundaries (64, 128). */
  unsigned seed = 12345;
  for (int round = 0; round < 3000; round++) {
    seed = seed * 1103515245u + 12345u;
    size_t pl = (seed >> 8) % 140, nl = (seed >> 4) % 160;
    for (size_t i = 0; i < pl; i++) {
      seed = seed * 1103515245u + 12345u;
      pat[i] = "ab?*a*"[(seed >> 16) % 6];
    }
    pat[pl] = '\0';
    for (size_t i = 0; i < nl; i++) {
      seed = seed * 1103515245u + 12345u;
      name[i] = (seed >> 16) % 7 ? 'a' : 'b';
    }
    if (st__viewspec_glob(pat, name, nl) != ref_glob(pat, name, nl)) {
      CHECK(!"glob disagrees with the reference");
      fprintf(stderr, "  pattern '%s' name '%.*s'\n", pat, (int)nl, name);
      break;
    }
  }
}

/* One spec on the 4 x 6 tensor: the geometry it gives and whether its
 * `contiguous` needs a copy. */
typedef struct step_case {
  const char *spec;
  uint64_t offset;
  int64_t shape[2], strides[2];
  int materialize;
} step_case_t;

static void check_cases(const step_case_t *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const step_case_t *k = &cases[i];
    st__tensor_desc_t d = base46();
    int m = -1;
    int rc = apply(k->spec, &d, &m);
    if (rc != ST_OK) {
      STT_FAIL("%s: %s", k->spec, why);
      continue;
    }
    if (d.offset != k->offset || d.ndim != 2 || d.shape[0] != k->shape[0] ||
        d.shape[1] != k->shape[1] || d.strides[0] != k->strides[0] ||
        d.strides[1] != k->strides[1] || m != k->materialize)
      STT_FAIL("%s: offset %llu shape [%lld, %lld] strides [%lld, %lld] copy %d", k->spec,
               (unsigned long long)d.offset, (long long)d.shape[0], (long long)d.shape[1],
               (long long)d.strides[0], (long long)d.strides[1], m);
  }
}

TEST(each_step) {
  static const step_case_t cases[] = {
      {"narrow(0,1,2)", 64 + 24, {2, 6}, {6, 1}, 0},
      {"narrow(-1,-2,2)", 64 + 16, {4, 2}, {6, 1}, 0},     /* negative dim and start */
      {"slice(1,1,6,2)", 64 + 4, {4, 3}, {6, 2}, 0},
      {"slice(0,-3,100)", 64 + 24, {3, 6}, {6, 1}, 0},     /* clamped, as Python */
      {"slice(1,0,6,1000)", 64, {4, 1}, {6, 6}, 0},        /* one element */
      {"transpose(0,-1)", 64, {6, 4}, {1, 6}, 0},
      {"permute(-1,0)", 64, {6, 4}, {1, 6}, 0},
      {"shard(1,1,2)", 64 + 12, {4, 3}, {6, 1}, 0},
  };
  check_cases(cases, sizeof cases / sizeof cases[0]);
}

TEST(compositions_and_contiguous) {
  static const step_case_t cases[] = {
      {"narrow(0,1,2)|transpose(0,1)|slice(0,0,6,3)", 64 + 24, {2, 2}, {3, 6}, 0},
      {"shard(1,0,2)|contiguous", 64, {4, 3}, {6, 1}, 1},   /* a column shard is not contiguous */
      {"shard(0,1,2)|contiguous", 64 + 48, {2, 6}, {6, 1}, 0},   /* a row shard is */
      {"transpose(0,1)|transpose(1,0)|contiguous", 64, {4, 6}, {6, 1}, 0},
      {"transpose(0,1)|contiguous", 64, {6, 4}, {1, 6}, 1},
  };
  check_cases(cases, sizeof cases / sizeof cases[0]);
}

TEST(shard_rule) {
  /* torch.tensor_split: the first n % world shards get one row more;
   * all ranks cover [0, n) once, in order, for every n and world. */
  for (int64_t n = 0; n <= 9; n++)
    for (int64_t world = 1; world <= 12; world++) {
      int64_t next = 0;
      for (int64_t rank = 0; rank < world; rank++) {
        st__tensor_desc_t d = stt_desc_1d(ST_DTYPE_INT8, n);
        char spec[64];
        snprintf(spec, sizeof spec, "shard(0,%lld,%lld)", (long long)rank, (long long)world);
        CHECK_ERR_MSG(apply(spec, &d, NULL), ST_OK, why);
        int64_t want = n / world + (rank < n % world ? 1 : 0);
        CHECK_EQ_INT(d.shape[0], want);
        if (d.shape[0]) CHECK_EQ_INT(d.offset, next);
        else CHECK_EQ_INT(d.offset, 0);   /* an empty shard keeps the offset */
        next += d.shape[0];
      }
      CHECK_EQ_INT(next, n);
    }
  /* 10 rows in 4: 3, 3, 2, 2. */
  int64_t sizes[4];
  for (int r = 0; r < 4; r++) {
    st__tensor_desc_t d = base46();
    d.shape[0] = 10;
    char spec[40];
    snprintf(spec, sizeof spec, "shard(0,%d,4)", r);
    CHECK_ERR_MSG(apply(spec, &d, NULL), ST_OK, why);
    sizes[r] = d.shape[0];
  }
  CHECK(sizes[0] == 3 && sizes[1] == 3 && sizes[2] == 2 && sizes[3] == 2);
}

TEST(apply_errors) {
  /* Each spec fails on the 4 x 6 tensor 'w' with a message holding its
   * text; the descriptor stays as it was. */
  static const char *const cases[][2] = {
      {"shard(0,5,4)", "shard(0,5,4): rank 5 is not below world 4 (tensor 'w')"},
      {"shard(0,-1,4)", "shard(0,-1,4): rank -1 is negative (tensor 'w')"},
      {"shard(0,0,0)", "shard(0,0,0): world 0 is not >= 1 (tensor 'w')"},
      {"narrow(0,3,2)", "narrow(0,3,2): start 3 + length 2 exceeds size 4 of dim 0 (tensor 'w')"},
      {"narrow(2,0,1)", "narrow(2,0,1): "},
      {"slice(0,0,4,0)", "slice(0,0,4,0): step 0 is not >= 1 (tensor 'w')"},
      {"permute(0)", "permute(0): expected 2 dims, got 1 (tensor 'w')"},
      {"permute(0,0)", "permute(0,0): dim 0 is repeated (tensor 'w')"},
      {"transpose(0,-3)", "transpose(0,-3): "},
      /* the failing step of a composition is the one named */
      {"narrow(0,0,2)|shard(0,1,1)|narrow(0,0,3)", "shard(0,1,1): rank 1 is not below world 1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st__tensor_desc_t d = base46(), orig = d;
    CHECK_ERR(apply(cases[i][0], &d, NULL), ST_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS_ALL(why, cases[i][1], "(tensor 'w')");
    CHECK(memcmp(&d, &orig, sizeof d) == 0);
  }
}

/* ------------------------------------------------------------ values */

typedef struct seen {
  size_t n;
  int rules[8], mats[8];
} seen_t;

static int record(void *ud, size_t index, int rule, int materialize, st__tensor_desc_t *d,
                  char *err, size_t errlen) {
  (void)d, (void)err, (void)errlen;
  seen_t *s = ud;
  if (index < 8) s->rules[index] = rule, s->mats[index] = materialize;
  s->n = index + 1;
  return ST_OK;
}

/* {a: t, b: {c: t}, l: [t], m: module{x: t}} with t 4 x 6 float32. */
#define T46 "tensor(0, 0, 'float32', [4, 6], [6, 1])"
static void pack_value(mpbuf_t *b) {
  mpbuf_init(b);
  stt_pack(&b->pk,
           "{a: " T46 ", b: {c: " T46 ", n: 3}, l: [" T46 "],"
           " m: ext(2, {tensors: [['x', " T46 "]], metadata: {k: 'v'}})}");
}

static int walk(const char *spec, mpbuf_t *in, msgpack_sbuffer *out, seen_t *s) {
  st__viewspec_t *v = parse(spec);
  if (!v) return -1000;
  memset(s, 0, sizeof *s);
  int rc = st__viewspec_value(v, in->sb.data, in->sb.size, out, record, s, why, sizeof why);
  st__viewspec_free(v);
  return rc;
}

static const msgpack_object *at(const msgpack_object *o, const char *key) {
  return st__map_get(o, key);
}

static void check_tensor(const msgpack_object *o, int64_t s0, int64_t s1, int64_t st0,
                         int64_t st1) {
  st__tensor_desc_t d;
  if (!o || st__parse_tensor(o, &d, why, sizeof why) != ST_OK) {
    STT_FAIL("not a tensor: %s", why);
    return;
  }
  CHECK(d.ndim == 2 && d.shape[0] == s0 && d.shape[1] == s1 && d.strides[0] == st0 &&
        d.strides[1] == st1);
}

TEST(values_by_name) {
  mpbuf_t in;
  pack_value(&in);
  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  seen_t s;
  CHECK_ERR_MSG(walk("b.c:narrow(0,0,1);l.0:transpose(0,1);m.x:shard(1,1,3)|contiguous;"
                     "a:slice(0,0,4,2)",
                     &in, &out, &s),
                ST_OK, why);
  CHECK_EQ_INT(s.n, 4);
  CHECK(s.rules[0] == 3 && s.rules[1] == 0 && s.rules[2] == 1 && s.rules[3] == 2);
  CHECK(s.mats[3] == 1 && s.mats[0] == 0);
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  CHECK(msgpack_unpack_next(&up, out.data, out.size, NULL) == MSGPACK_UNPACK_SUCCESS);
  const msgpack_object *o = &up.data;
  check_tensor(at(o, "a"), 2, 6, 12, 1);
  check_tensor(at(at(o, "b"), "c"), 1, 6, 6, 1);
  CHECK(at(at(o, "b"), "n") && at(at(o, "b"), "n")->via.u64 == 3);
  const msgpack_object *l = at(o, "l");
  CHECK(l && l->type == MSGPACK_OBJECT_ARRAY && l->via.array.size == 1);
  if (l) check_tensor(&l->via.array.ptr[0], 6, 4, 1, 6);
  msgpack_unpacked mod;
  const msgpack_object *tensors = NULL, *meta = NULL;
  CHECK_ERR_MSG(st__parse_module(at(o, "m"), &mod, &tensors, &meta, why, sizeof why), ST_OK, why);
  CHECK(tensors->via.array.size == 1 && st__str_eq(&tensors->via.array.ptr[0].via.array.ptr[0], "x"));
  check_tensor(&tensors->via.array.ptr[0].via.array.ptr[1], 4, 2, 6, 1);
  CHECK(st__str_eq(st__map_get(meta, "k"), "v"));
  msgpack_unpacked_destroy(&mod);
  msgpack_unpacked_destroy(&up);
  msgpack_sbuffer_destroy(&out);
  mpbuf_free(&in);
}

TEST(values_errors) {
  mpbuf_t in;
  pack_value(&in);
  msgpack_sbuffer out;
  seen_t s;
  msgpack_sbuffer_init(&out);
  CHECK_ERR(walk("a:narrow(0,0,1);q*:narrow(0,0,1)", &in, &out, &s), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(why, "view: rule 2 ('q*') selects no tensor (tensors: a, b.c, l.0, m.x)");
  msgpack_sbuffer_destroy(&out);
  msgpack_sbuffer_init(&out);
  CHECK_ERR(walk("*:narrow(0,0,1);a:narrow(0,0,1)", &in, &out, &s), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(why, "rule 2 ('a') takes no tensor: earlier rules take every tensor it selects");
  msgpack_sbuffer_destroy(&out);
  msgpack_sbuffer_init(&out);
  CHECK_ERR(walk("m.*:shard(0,4,4)", &in, &out, &s), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(why, "shard(0,4,4): rank 4 is not below world 4 (tensor 'm.x')");
  msgpack_sbuffer_destroy(&out);
  mpbuf_free(&in);

  /* A value that is one tensor is named "". */
  mpbuf_init(&in);
  stt_pack(&in.pk, T46);
  msgpack_sbuffer_init(&out);
  CHECK_ERR(walk("w:narrow(0,0,1)", &in, &out, &s), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(why, "view: rule 1 ('w') selects no tensor (tensors: '')");
  msgpack_sbuffer_destroy(&out);
  msgpack_sbuffer_init(&out);
  CHECK_ERR_MSG(walk("narrow(0,0,1)", &in, &out, &s), ST_OK, why);
  CHECK_EQ_INT(s.n, 1);
  msgpack_sbuffer_destroy(&out);
  mpbuf_free(&in);

  /* No tensor at all. */
  mpbuf_init(&in);
  stt_pack(&in.pk, "{n: 1}");
  msgpack_sbuffer_init(&out);
  CHECK_ERR(walk("narrow(0,0,1)", &in, &out, &s), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(why, "selects no tensor (tensors: none)");
  msgpack_sbuffer_destroy(&out);
  mpbuf_free(&in);
}

int main(void) {
  RUN(normalized_text);
  RUN(parse_errors);
  RUN(globs);
  RUN(globs_are_linear);
  RUN(each_step);
  RUN(compositions_and_contiguous);
  RUN(shard_rule);
  RUN(apply_errors);
  RUN(values_by_name);
  RUN(values_errors);
  return stt_summary();
}

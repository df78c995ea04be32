/* src/proto/viewspec.c: the view spec (viewspec.h; docs/views.md,
 * section 1). No state; any thread. */
#include "proto/viewspec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "common/geometry.h"

#define bad(err, errlen, ...) st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, __VA_ARGS__)

typedef struct step_name {
  const char *name;
  st__view_kind_t kind;
  int min_args, max_args;
} step_name_t;

static const step_name_t steps[] = {
    {"narrow", ST__VIEW_NARROW, 3, 3},         {"slice", ST__VIEW_SLICE, 3, 4},
    {"shard", ST__VIEW_SHARD, 3, 3},           {"transpose", ST__VIEW_TRANSPOSE, 2, 2},
    {"permute", ST__VIEW_PERMUTE, 1, ST_MAX_NDIM}, {"contiguous", ST__VIEW_CONTIGUOUS, 0, 0},
};
#define NSTEPS (sizeof steps / sizeof steps[0])
#define STEP_LIST "narrow, slice, shard, transpose, permute, contiguous"

/* ------------------------------------------------------------ parsing */

typedef struct cursor {
  const char *s;
  size_t len, at;
  int rule, step;             /* 1-based, for messages */
  char *err;
  size_t errlen;
} cursor_t;

static int is_blank(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static void skip_blanks(cursor_t *c) {
  while (c->at < c->len && is_blank(c->s[c->at])) c->at++;
}

static int peek(const cursor_t *c) {
  return c->at < c->len ? (unsigned char)c->s[c->at] : -1;
}

/* A message about the current rule and step at byte `at`. */
static int fail_at(cursor_t *c, size_t at, const char *what) {
  if (c->step)
    return bad(c->err, c->errlen, "view: rule %d, step %d at byte %zu: %s", c->rule, c->step, at,
               what);
  return bad(c->err, c->errlen, "view: rule %d at byte %zu: %s", c->rule, at, what);
}

/* An integer literal ([-]digits) that fits int64. */
static int parse_int(cursor_t *c, int64_t *out) {
  skip_blanks(c);
  size_t start = c->at;
  int neg = 0;
  if (peek(c) == '-') neg = 1, c->at++;
  uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  size_t digits = 0;
  while (peek(c) >= '0' && peek(c) <= '9') {
    unsigned d = (unsigned)(peek(c) - '0');
    if (v > (limit - d) / 10) return fail_at(c, start, "integer out of range");
    v = v * 10 + d;
    c->at++;
    digits++;
  }
  if (!digits) return fail_at(c, start, "expected an integer");
  *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
  return ST_OK;
}

/* name [ "(" int ("," int)* ")" ] */
static int parse_step(cursor_t *c, st__view_step_t *s) {
  skip_blanks(c);
  size_t start = c->at, n = 0;
  while (c->at + n < c->len && c->s[c->at + n] >= 'a' && c->s[c->at + n] <= 'z') n++;
  const step_name_t *sn = NULL;
  for (size_t i = 0; i < NSTEPS && n; i++)
    if (strlen(steps[i].name) == n && memcmp(steps[i].name, c->s + c->at, n) == 0) sn = &steps[i];
  if (!sn) {
    char m[120];
    size_t shown = 0;
    while (c->at + shown < c->len && shown < 24 && !strchr(";|()", c->s[c->at + shown]) &&
           !is_blank(c->s[c->at + shown]))
      shown++;
    if (!shown) snprintf(m, sizeof m, "expected a step (" STEP_LIST ")");
    else snprintf(m, sizeof m, "unknown step '%.*s' (" STEP_LIST ")", (int)shown, c->s + c->at);
    return fail_at(c, start, m);
  }
  c->at += n;
  memset(s, 0, sizeof *s);
  s->kind = sn->kind;
  skip_blanks(c);
  if (peek(c) == '(') {
    c->at++;
    skip_blanks(c);
    if (peek(c) != ')') {
      for (;;) {
        if (s->nargs == ST_MAX_NDIM) {
          char m[80];
          snprintf(m, sizeof m, "%s takes at most %d arguments", sn->name, sn->max_args);
          return fail_at(c, c->at, m);
        }
        int rc = parse_int(c, &s->args[s->nargs]);
        if (rc != ST_OK) return rc;
        s->nargs++;
        skip_blanks(c);
        if (peek(c) == ',') {
          c->at++;
          continue;
        }
        break;
      }
    }
    if (peek(c) != ')') return fail_at(c, c->at, "expected ',' or ')'");
    c->at++;
  }
  if (s->nargs < sn->min_args || s->nargs > sn->max_args) {
    char m[120];
    if (sn->min_args == sn->max_args)
      snprintf(m, sizeof m, "%s takes %d arguments, not %d", sn->name, sn->min_args, s->nargs);
    else
      snprintf(m, sizeof m, "%s takes %d to %d arguments, not %d", sn->name, sn->min_args,
               sn->max_args, s->nargs);
    return fail_at(c, start, m);
  }
  if (s->kind == ST__VIEW_SLICE && s->nargs == 3) s->args[s->nargs++] = 1;
  return ST_OK;
}

/* The selector of the rule at c->at, when the rule has one (a ':' before
 * the next ';'), copied into r->selector; else "*". */
static int parse_selector(cursor_t *c, st__view_rule_t *r) {
  skip_blanks(c);
  size_t end = c->at;
  while (end < c->len && c->s[end] != ';' && c->s[end] != ':') end++;
  if (end == c->len || c->s[end] != ':') {
    memcpy(r->selector, "*", 2);
    return ST_OK;
  }
  size_t n = end;
  while (n > c->at && is_blank(c->s[n - 1])) n--;
  n -= c->at;
  if (!n) return fail_at(c, c->at, "empty selector before ':'");
  if (n > ST__VIEW_SELECTOR_MAX) {
    char m[80];
    snprintf(m, sizeof m, "selector longer than %d bytes", ST__VIEW_SELECTOR_MAX);
    return fail_at(c, c->at, m);
  }
  for (size_t i = 0; i < n; i++) {
    char ch = c->s[c->at + i];
    if (ch == '|' || ch == '\0' || is_blank(ch))
      return fail_at(c, c->at + i, "a selector holds no '|', blank or NUL byte");
  }
  memcpy(r->selector, c->s + c->at, n);
  r->selector[n] = '\0';
  c->at = end + 1;
  return ST_OK;
}

static int parse_rule(cursor_t *c, st__view_rule_t *r) {
  memset(r, 0, sizeof *r);
  c->step = 0;
  int rc = parse_selector(c, r);
  if (rc != ST_OK) return rc;
  for (;;) {
    c->step = r->nsteps + 1;
    if (r->nsteps == ST__VIEW_STEPS_MAX) {
      char m[80];
      snprintf(m, sizeof m, "more than %d steps in one rule", ST__VIEW_STEPS_MAX);
      return fail_at(c, c->at, m);
    }
    if (r->contiguous) return fail_at(c, c->at, "contiguous must be the last step of its rule");
    rc = parse_step(c, &r->steps[r->nsteps]);
    if (rc != ST_OK) return rc;
    r->contiguous = r->steps[r->nsteps].kind == ST__VIEW_CONTIGUOUS;
    r->nsteps++;
    skip_blanks(c);
    if (peek(c) != '|') break;
    c->at++;
  }
  c->step = 0;
  return ST_OK;
}

/* The steps of a rule as normalized text ("narrow(0,1,2)|contiguous")
 * into buf; the length written (cut to len-1). */
static size_t step_text(const st__view_step_t *s, char *buf, size_t len) {
  const char *name = "?";
  for (size_t i = 0; i < NSTEPS; i++)
    if (steps[i].kind == s->kind) name = steps[i].name;
  size_t n = 0;
  int k = snprintf(buf, len, "%s", name);
  n = k > 0 ? (size_t)k : 0;
  for (int i = 0; i < s->nargs && n < len; i++) {
    k = snprintf(buf + n, len - n, "%s%lld", i ? "," : "(", (long long)s->args[i]);
    if (k > 0) n += (size_t)k;
  }
  if (s->nargs && n < len) {
    k = snprintf(buf + n, len - n, ")");
    if (k > 0) n += (size_t)k;
  }
  return n < len ? n : (len ? len - 1 : 0);
}

/* The normalized text of the parsed rules (owned by v). */
static int normalize(st__viewspec_t *v, char *err, size_t errlen) {
  size_t cap = 64;
  for (int i = 0; i < v->nrules; i++)
    cap += strlen(v->rules[i].selector) + 2 + (size_t)v->rules[i].nsteps * (16 + 21 * ST_MAX_NDIM);
  v->text = malloc(cap);
  if (!v->text) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  size_t n = 0;
  for (int i = 0; i < v->nrules; i++) {
    const st__view_rule_t *r = &v->rules[i];
    n += (size_t)snprintf(v->text + n, cap - n, "%s%s:", i ? ";" : "", r->selector);
    for (int k = 0; k < r->nsteps; k++) {
      if (k) v->text[n++] = '|';
      n += step_text(&r->steps[k], v->text + n, cap - n);
    }
  }
  v->text[n] = '\0';
  v->text_len = n;
  return ST_OK;
}

int st__viewspec_parse(const char *text, size_t len, st__viewspec_t **out, char *err,
                       size_t errlen) {
  *out = NULL;
  if (len > ST__VIEW_TEXT_MAX)
    return bad(err, errlen, "view: the spec is %zu bytes; at most %d", len, ST__VIEW_TEXT_MAX);
  if (memchr(text, '\0', len)) return bad(err, errlen, "view: the spec holds a NUL byte");
  st__viewspec_t *v = calloc(1, sizeof *v);
  cursor_t c = {.s = text, .len = len, .rule = 1, .err = err, .errlen = errlen};
  if (!v) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  skip_blanks(&c);
  if (c.at == len) {
    free(v);
    return bad(err, errlen, "view: the spec is empty");
  }
  int rc = ST_OK;
  for (;;) {
    if (v->nrules == ST__VIEW_RULES_MAX) {
      char m[60];
      snprintf(m, sizeof m, "more than %d rules", ST__VIEW_RULES_MAX);
      rc = fail_at(&c, c.at, m);
      break;
    }
    st__view_rule_t *grown = realloc(v->rules, sizeof *grown * (size_t)(v->nrules + 1));
    if (!grown) {
      rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
      break;
    }
    v->rules = grown;
    c.rule = v->nrules + 1;
    rc = parse_rule(&c, &v->rules[v->nrules]);
    if (rc == ST_OK && st__viewspec_glob_compile(v->rules[v->nrules].selector,
                                                 &v->rules[v->nrules].glob) != ST_OK) {
      st__viewspec_glob_free(&v->rules[v->nrules].glob);
      rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    }
    if (rc != ST_OK) break;
    v->contiguous |= v->rules[v->nrules].contiguous;
    v->nrules++;
    skip_blanks(&c);
    if (c.at == len) break;
    if (peek(&c) != ';') {
      rc = fail_at(&c, c.at, "expected '|', ';' or the end of the spec");
      break;
    }
    c.at++;
  }
  if (rc == ST_OK) rc = normalize(v, err, errlen);
  if (rc != ST_OK) {
    st__viewspec_free(v);
    return rc;
  }
  *out = v;
  return ST_OK;
}

void st__viewspec_free(st__viewspec_t *v) {
  if (!v) return;
  for (int i = 0; i < v->nrules; i++) st__viewspec_glob_free(&v->rules[i].glob);
  free(v->rules);
  free(v->text);
  free(v);
}

/* ------------------------------------------------------------ matching
 *
 * A glob of `*` and `?` is run as its automaton, all states at once
 * (bit-parallel, as Shift-And): items are the glob's bytes and `?`s, state
 * i says "items 0..i-1 matched", and a `*` before item i lets state i take
 * any byte and stay. For each byte c of the name, with D the set of live
 * states:
 *
 *   D' = ((D << 1) & masks[cls[c]]) | (D & loops)
 *
 * The name matches when state nitems is live after its last byte. This
 * costs len * words word operations (words <= ST__VIEW_GLOB_WORDS_MAX at
 * the selector bound), for every glob: there is no backtracking, so a
 * glob like `*a*a*a*b` against `aaaa...` is as cheap as `*`. A walk
 * stops early once no state is live. */

int st__viewspec_glob_compile(const char *pat, st__view_glob_t *g) {
  memset(g, 0, sizeof *g);
  size_t n = strlen(pat);
  if (n > ST__VIEW_SELECTOR_MAX) return ST_ERR_INVALID_ARGUMENT;
  int items = 0;
  for (size_t i = 0; i < n; i++) items += pat[i] != '*';
  g->nitems = items;
  g->words = (items + 1 + 63) / 64;
  /* Classes: one per distinct literal byte, and class 0 for the rest. */
  g->nclasses = 1;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)pat[i];
    if (ch != '*' && ch != '?' && !g->cls[ch]) g->cls[ch] = (uint8_t)g->nclasses++;
  }
  g->masks = calloc((size_t)g->nclasses * (size_t)g->words, sizeof *g->masks);
  if (!g->masks) return ST_ERR_OUT_OF_MEMORY;
  int item = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)pat[i];
    if (ch == '*') {
      g->loops[item / 64] |= 1ull << (item % 64);
      continue;
    }
    int bit = item + 1;
    uint64_t b = 1ull << (bit % 64);
    if (ch == '?')
      for (int k = 0; k < g->nclasses; k++) g->masks[(size_t)k * g->words + bit / 64] |= b;
    else
      g->masks[(size_t)g->cls[ch] * g->words + bit / 64] |= b;
    item++;
  }
  return ST_OK;
}

void st__viewspec_glob_free(st__view_glob_t *g) {
  free(g->masks);
  g->masks = NULL;
}

int st__viewspec_glob_match(const st__view_glob_t *g, const char *name, size_t len,
                            uint64_t *steps) {
  uint64_t d[ST__VIEW_GLOB_WORDS_MAX] = {1};
  const int words = g->words;
  size_t i = 0;
  for (; i < len; i++) {
    const uint64_t *m = g->masks + (size_t)g->cls[(unsigned char)name[i]] * words;
    uint64_t carry = 0, live = 0;
    for (int k = 0; k < words; k++) {
      uint64_t next = (d[k] << 1 | carry) & m[k];
      carry = d[k] >> 63;
      d[k] = next | (d[k] & g->loops[k]);
      live |= d[k];
    }
    if (!live) {
      i++;
      break;
    }
  }
  if (steps) *steps += (uint64_t)i * (uint64_t)words;
  if (i < len) return 0;
  return (int)(d[g->nitems / 64] >> (g->nitems % 64) & 1);
}

int st__viewspec_glob(const char *pat, const char *name, size_t len) {
  st__view_glob_t g;
  if (st__viewspec_glob_compile(pat, &g) != ST_OK) {
    st__viewspec_glob_free(&g);
    return 0;
  }
  int m = st__viewspec_glob_match(&g, name, len, NULL);
  st__viewspec_glob_free(&g);
  return m;
}

int st__viewspec_match(const st__viewspec_t *v, const char *name, size_t len, uint64_t *steps) {
  for (int i = 0; i < v->nrules; i++)
    if (st__viewspec_glob_match(&v->rules[i].glob, name, len, steps)) return i;
  return -1;
}

/* ------------------------------------------------------------ applying */

/* Rows first + length of shard `rank` of `world` over n rows, as
 * torch.tensor_split: the first n % world shards get one row more. */
static void shard_range(int64_t n, int64_t rank, int64_t world, int64_t *first, int64_t *len) {
  int64_t base = n / world, extra = n % world;
  *first = rank * base + (rank < extra ? rank : extra);
  *len = base + (rank < extra ? 1 : 0);
}

static int apply_step(st__geom_t *g, const st__view_step_t *s, char *why, size_t whylen) {
  const int64_t *a = s->args;
  switch (s->kind) {
  case ST__VIEW_NARROW:
    return st__geom_narrow(g, a[0], a[1], a[2], why, whylen);
  case ST__VIEW_SLICE: {
    if (a[3] < 1) return bad(why, whylen, "step %lld is not >= 1", (long long)a[3]);
    int d = 0;
    int rc = st__geom_dim(g, a[0], &d, why, whylen);
    if (rc != ST_OK) return rc;
    /* A step past the size takes at most one element, as the size does:
     * the stride never grows past the dimension's extent. */
    int64_t step = a[3] > g->shape[d] ? (g->shape[d] ? g->shape[d] : 1) : a[3];
    return st__geom_slice(g, d, a[1], a[2], step, why, whylen);
  }
  case ST__VIEW_SHARD: {
    if (a[2] < 1) return bad(why, whylen, "world %lld is not >= 1", (long long)a[2]);
    if (a[1] < 0) return bad(why, whylen, "rank %lld is negative", (long long)a[1]);
    if (a[1] >= a[2])
      return bad(why, whylen, "rank %lld is not below world %lld", (long long)a[1],
                 (long long)a[2]);
    int d = 0;
    int rc = st__geom_dim(g, a[0], &d, why, whylen);
    if (rc != ST_OK) return rc;
    int64_t first, len;
    shard_range(g->shape[d], a[1], a[2], &first, &len);
    return st__geom_narrow(g, d, first, len, why, whylen);
  }
  case ST__VIEW_TRANSPOSE:
    return st__geom_transpose(g, a[0], a[1], why, whylen);
  case ST__VIEW_PERMUTE:
    return st__geom_permute(g, s->nargs, a, why, whylen);
  case ST__VIEW_CONTIGUOUS:
    return ST_OK;
  }
  return bad(why, whylen, "unknown step");
}

int st__viewspec_apply(const st__viewspec_t *v, int rule, const char *name, size_t name_len,
                       st__tensor_desc_t *d, int *materialize, char *err, size_t errlen) {
  if (materialize) *materialize = 0;
  if (rule < 0 || rule >= v->nrules) return bad(err, errlen, "view: no rule %d", rule);
  const st__view_rule_t *r = &v->rules[rule];
  st__geom_t g;
  memset(&g, 0, sizeof g);
  g.offset = d->offset;
  g.dtype = d->dtype;
  g.ndim = d->ndim;
  memcpy(g.shape, d->shape, sizeof g.shape);
  memcpy(g.strides, d->strides, sizeof g.strides);
  uint64_t lo0, hi0, lo, hi;
  if (st__geom_extent_of(g.dtype, g.offset, g.ndim, g.shape, g.strides, &lo0, &hi0) != ST_OK)
    return bad(err, errlen, "view: tensor '%.*s' has no valid geometry", (int)name_len, name);
  for (int i = 0; i < r->nsteps; i++) {
    char why[200] = "";
    if (apply_step(&g, &r->steps[i], why, sizeof why) != ST_OK) {
      char text[400];
      step_text(&r->steps[i], text, sizeof text);
      return bad(err, errlen, "%s: %s (tensor '%.*s')", text, why, (int)name_len, name);
    }
  }
  /* An empty view keeps the tensor's offset (one past a dimension's end
   * may lie past the arena). Windows only shrink: a result outside the
   * tensor is a bug here. */
  if (st__geom_numel(&g) == 0) g.offset = d->offset;
  else if (st__geom_extent_of(g.dtype, g.offset, g.ndim, g.shape, g.strides, &lo, &hi) != ST_OK ||
           lo < lo0 || hi > hi0)
    return bad(err, errlen, "view: the view of tensor '%.*s' leaves the tensor", (int)name_len,
               name);
  d->offset = g.offset;
  d->ndim = g.ndim;
  memcpy(d->shape, g.shape, sizeof d->shape);
  memcpy(d->strides, g.strides, sizeof d->strides);
  if (materialize) *materialize = r->contiguous && !st__geom_is_contiguous(&g);
  return ST_OK;
}

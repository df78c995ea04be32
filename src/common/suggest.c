/* src/common/suggest.c: "did you mean" (see suggest.h). */
#include "common/suggest.h"

#include <string.h>

#define NONE 1000

/* The optimal string alignment distance of a[0..n) and b[0..m), both at
 * most ST__SUGGEST_MAX_WORD long: three rows of the edit table. */
static int osa_distance(const char *a, size_t n, const char *b, size_t m) {
  int rows[3][ST__SUGGEST_MAX_WORD + 1];
  int *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
  for (size_t j = 0; j <= m; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= n; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= m; j++) {
      int cost = a[i - 1] != b[j - 1];
      int d = prev[j] + 1;
      if (cur[j - 1] + 1 < d) d = cur[j - 1] + 1;
      if (prev[j - 1] + cost < d) d = prev[j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          prev2[j - 2] + 1 < d)
        d = prev2[j - 2] + 1;
      cur[j] = d;
    }
    int *t = prev2;
    prev2 = prev;
    prev = cur;
    cur = t;
  }
  return prev[m];
}

/* See suggest.h. */
void st__suggest_init(st__suggest_t *s, const char *word) {
  s->word = word;
  s->best[0] = '\0';
  s->score = NONE;
}

/* See suggest.h. */
void st__suggest_add(st__suggest_t *s, const char *cand, size_t len) {
  size_t n = strlen(s->word), core = n - strspn(s->word, "-");
  if (n > ST__SUGGEST_MAX_WORD || len == 0 || len > ST__SUGGEST_MAX_WORD) return;
  int d = osa_distance(s->word, n, cand, len);
  if (d == 0) return; /* the word itself is no suggestion */
  if (core >= 3 && n < len && memcmp(s->word, cand, n) == 0) d = 1;
  if (d > 2 || (size_t)d >= core || d >= s->score) return;
  s->score = d;
  memcpy(s->best, cand, len);
  s->best[len] = '\0';
}

/* See suggest.h. */
const char *st__suggest_best(const st__suggest_t *s) {
  return s->score == NONE ? NULL : s->best;
}

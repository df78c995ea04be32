/* src/common: "did you mean" for a word that was not known (an unknown
 * flag of stserver). A candidate is close when it is at most 2 edits away
 * (insert, delete, substitute, swap two neighbours: optimal string
 * alignment distance) and the word, leading dashes aside, is longer than
 * the edits it needs, or when the word is a prefix of it with at least 3
 * characters besides leading dashes (counted as 1 edit). The closest wins;
 * on a tie, the first given.
 *
 * stcli applies the same rule (src/cli/suggest.c), linked in statically:
 * libstclient exports only the public API.
 *
 *   st__suggest_t s;
 *   st__suggest_init(&s, "--workrs");
 *   st__suggest_add(&s, "--workers", 9);  ...
 *   st__suggest_best(&s)                  -> "--workers", or NULL
 */
#ifndef ST_COMMON_SUGGEST_H
#define ST_COMMON_SUGGEST_H

#include <stddef.h>

/* Words (and candidates) longer than this are never compared. */
#define ST__SUGGEST_MAX_WORD 63

typedef struct st__suggest {
  const char *word;                     /* borrowed: the unknown word */
  char best[ST__SUGGEST_MAX_WORD + 1];  /* the closest candidate so far */
  int score;                            /* its distance; large: none */
} st__suggest_t;

/* Starts a search for the candidates close to `word` (borrowed, must
 * outlive s). Any thread. */
void st__suggest_init(st__suggest_t *s, const char *word);
/* Offers cand[0..len) (need not be NUL-terminated; copied when it is the
 * closest so far). Any thread. */
void st__suggest_add(st__suggest_t *s, const char *cand, size_t len);
/* The closest candidate offered (borrowed from s), or NULL when none was
 * close. Any thread. */
const char *st__suggest_best(const st__suggest_t *s);

#endif

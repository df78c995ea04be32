/* stcli: "did you mean" for a word it or the server did not know: an
 * unknown command, an unknown option of a command, an unknown endpoint.
 * A candidate is close when it is at most 2 edits away (insert, delete,
 * substitute, swap two neighbours: optimal string alignment distance) and
 * the word, leading dashes aside, is longer than the edits it needs, or
 * when the word is a prefix of it with at least 3 characters besides
 * leading dashes (counted as 1 edit). The closest wins; on a tie, the
 * first given: the rule of src/common/suggest.c, which stserver applies
 * to its flags too.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* See cli.h. */
void cli_suggest_init(cli_suggest_t *s, const char *word) {
  st__suggest_init(&s->s, word);
  s->text[0] = '\0';
}

/* See cli.h. */
void cli_suggest_add(cli_suggest_t *s, const char *cand, size_t len) {
  st__suggest_add(&s->s, cand, len);
}

/* Compares each word of a space-separated list (a trailing '=' dropped). */
static void suggest_words(cli_suggest_t *s, const char *list) {
  while (list && *list) {
    size_t len = strcspn(list, " ");
    size_t name = len && list[len - 1] == '=' ? len - 1 : len;
    cli_suggest_add(s, list, name);
    list += len;
    list += strspn(list, " ");
  }
}

/* See cli.h. */
const char *cli_suggest_text(cli_suggest_t *s) {
  const char *best = st__suggest_best(&s->s);
  if (!best) return "";
  snprintf(s->text, sizeof s->text, "; did you mean '%s'?", best);
  return s->text;
}

/* See cli.h. */
int cli_usage_unknown(const cli_command_t *cmd, const char *word) {
  if (word[0] != '-' || !word[1])
    return cli_usage(cmd ? cmd->name : NULL, "unexpected argument '%s'", word);
  /* "--reader=uid:1" is compared as "--reader" */
  char name[64];
  size_t n = strcspn(word, "=");
  snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : 0), word);
  cli_suggest_t s;
  cli_suggest_init(&s, name);
  if (cmd) suggest_words(&s, cmd->options);
  suggest_words(&s, cli_global_options);
  if (!cmd) suggest_words(&s, "--version");
  return cli_usage(cmd ? cmd->name : NULL, "unknown option '%s'%s", word, cli_suggest_text(&s));
}

/* See cli.h. */
const char *cli_suggest_endpoint(cli_suggest_t *s, const st_value_t *endpoints) {
  size_t n = endpoints && endpoints->kind == ST_VALUE_ARRAY ? endpoints->as.array.len : 0;
  for (size_t i = 0; i < n; i++) {
    const char *name = cli_value_str(st_value_get(&endpoints->as.array.items[i], "name"));
    if (name) cli_suggest_add(s, name, strlen(name));
  }
  return cli_suggest_text(s);
}

/* See cli.h. */
int cli_fail_endpoint(st_client_t *c, int rc, const char *endpoint) {
  if (rc != ST_ERR_UNKNOWN_ENDPOINT) return cli_fail(c, rc);
  char msg[512];
  const char *m = st_client_error(c);
  snprintf(msg, sizeof msg, "%s", m && *m ? m : st_strerror(rc));
  cli_suggest_t s;
  cli_suggest_init(&s, endpoint);
  st_result_t *r = NULL;
  if (st_client_endpoints(c, &r) == ST_OK) cli_suggest_endpoint(&s, st_result_value(r));
  st_result_free(r);
  fprintf(stderr, "stcli: %s: %s%s\n", st_err_name(rc), msg, cli_suggest_text(&s));
  return cli_exit_code(rc);
}

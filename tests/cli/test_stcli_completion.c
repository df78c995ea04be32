/* stcli's shell completion, the real binary (ST_CLI_BIN) against a real
 * stserver: what it asks the server (`endpoints --names`, `endpoints
 * --params NAME`, `tasks --ids`), and `completion bash` / `completion zsh`
 * (the scripts parse; run by bash with COMP_WORDS/COMP_CWORD set, and by
 * zsh through its completion function with compadd stubbed: commands,
 * options, endpoint names, parameter names as key= with no space after
 * them, task ids, keys, buffer names, object ids: `keys --names`,
 * `buffers --names`, `objects --ids`). The zsh part skips when zsh is not
 * installed. */
#include <st/client.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "cli_run.h"
#include "client_kit.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

TEST(endpoints_names) {
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--names"), 0);
  CHECK_STR_EQ(R.out, "alpha\nbeta\ncached\nt\n");
  CHECK_STR_EQ(R.err, "");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "endpoints", "--names"), 0);
  CHECK_STR_EQ(R.out, "[\"alpha\", \"beta\", \"cached\", \"t\"]\n");
  CHECK(json_ok(R.out));
  char missing[400];
  snprintf(missing, sizeof missing, "%s/none-0.sock", srv.dir);
  CHECK_EQ_INT(STCLI("--socket", missing, "endpoints", "--names"), 3);
  CHECK_STR_EQ(R.out, "");
  CHECK_CONTAINS(R.err, "stcli: IO: cannot connect");
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--nam"), 2);
}

TEST(endpoints_params) {
  /* Required ones first, then the others in the server's order. */
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--params", "alpha"), 0);
  CHECK_STR_EQ(R.out, "v\nn\ntag\n");
  CHECK_STR_EQ(R.err, "");
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--params=t", "--json"), 0);
  CHECK_STR_EQ(R.out, "[\"n\"]\n");
  CHECK(json_ok(R.out));
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--params", "beta"), 0);
  CHECK_STR_EQ(R.out, "");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "endpoints", "--params", "beta"), 0);
  CHECK_STR_EQ(R.out, "[]\n");
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--params", "gamma"), 1);
  CHECK_STR_EQ(R.out, "");
  CHECK_STR_EQ(R.err, "stcli: UNKNOWN_ENDPOINT: unknown endpoint 'gamma'\n");
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--params"), 2);
  CHECK_CONTAINS(R.err, "--params needs an endpoint name");
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--params", "t", "--names"), 2);
  CHECK_CONTAINS(R.err, "give --names or --params NAME, not both");
  CHECK_EQ_INT(STCLI("endpoints", "--help"), 0);
  CHECK_CONTAINS(R.out, "usage: stcli [global options] endpoints [--names | --params NAME]");
  CHECK_CONTAINS(R.out, "\n  --params NAME  only the parameter names of endpoint NAME");
}

static char task_a[32], task_b[32];

TEST(tasks_ids) {
  CHECK_EQ_INT(STCLI(SOCK, "submit", "t", "n=2"), 0);
  snprintf(task_a, sizeof task_a, "%.*s", (int)strcspn(R.out, "\n"), R.out);
  CHECK_EQ_INT(STCLI(SOCK, "submit", "t", "n=3"), 0);
  snprintf(task_b, sizeof task_b, "%.*s", (int)strcspn(R.out, "\n"), R.out);
  CHECK(atoi(task_a) > 0 && atoi(task_b) > atoi(task_a));
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--ids"), 0);
  char want[80];
  snprintf(want, sizeof want, "%s\n%s\n", task_b, task_a); /* newest first */
  CHECK_STR_EQ(R.out, want);
  CHECK_EQ_INT(STCLI(SOCK, "--json", "tasks", "--ids"), 0);
  snprintf(want, sizeof want, "[%s, %s]\n", task_b, task_a);
  CHECK_STR_EQ(R.out, want);
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--ids", "--status", "pending"), 0);
  CHECK(strstr(R.out, "(no") == NULL); /* ids only, never the table's text */
}

static char object_ids[64];   /* "ID ID" of `objects --ids` */

/* Puts key (a float32 [2]) with the public API: stcli reads keys, programs
 * put them. */
static int put_key(const char *key) {
  st_client_t *c = stt_client_open(srv.socket);
  if (!c) return -1;
  st_result_t *a = NULL;
  char err[200];
  int64_t n = 2;
  int rc = st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &a, err, sizeof err);
  st_args_t *args = st_args_new();
  if (rc == ST_OK) rc = st_args_tensor(args, "w", st_result_tensor(a, 0), err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(c, key, args, ST_KEY_EVICTABLE, 0, NULL);
  st_args_free(args);
  st_result_free(a);
  st_client_close(c);
  return rc;
}

TEST(keys_buffers_objects_names) {
  CHECK_EQ_INT(STCLI(SOCK, "keys", "--names"), 0);
  CHECK_STR_EQ(R.out, "");
  CHECK_EQ_INT(put_key("model/w"), ST_OK);
  CHECK_EQ_INT(put_key("other"), ST_OK);
  CHECK_EQ_INT(STCLI(SOCK, "keys", "--names", "model/"), 0);
  CHECK_STR_EQ(R.out, "model/w\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "keys", "--names", "model/"), 0);
  CHECK_STR_EQ(R.out, "[\"model/w\"]\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "cam", "uint8", "4"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "buffers", "--names"), 0);
  CHECK_STR_EQ(R.out, "cam\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "buffers", "--names"), 0);
  CHECK_STR_EQ(R.out, "[\"cam\"]\n");
  /* A cached call makes an object; its id is listed. */
  CHECK_EQ_INT(STCLI(SOCK, "--json", "call", "cached"), 0);
  const char *at = strstr(R.out, "\"object\": {\"id\": ");
  CHECK(at != NULL);
  long id = at ? atol(at + 17) : 0;
  CHECK(id > 0);
  CHECK_EQ_INT(STCLI(SOCK, "objects", "--ids"), 0);
  char want[32];
  snprintf(want, sizeof want, "%ld\n", id);
  CHECK_CONTAINS(R.out, want);
  size_t n = 0;
  for (const char *p = R.out; *p && n + 1 < sizeof object_ids; p++)
    object_ids[n++] = *p == '\n' ? ' ' : *p;
  while (n && object_ids[n - 1] == ' ') n--;
  object_ids[n] = '\0';
  CHECK_EQ_INT(STCLI(SOCK, "--json", "objects", "--ids"), 0);
  CHECK(json_ok(R.out) && R.out[0] == '[');
  CHECK_EQ_INT(STCLI(SOCK, "objects", "--idz"), 2);
  CHECK_CONTAINS(R.err, "did you mean '--ids'?");
}

/* `sh -c script` with $1 the stcli binary, $2 the socket, $3 the test's
 * directory. Returns the exit code (R holds the output). */
static int run_shell(const char *shell, const char *script) {
  return run_prog(shell, NULL,
                  (const char *const[]){"-c", script, shell, cli_bin, srv.socket, srv.dir, NULL});
}

/* The first of `paths` (NULL-terminated) that is executable, or NULL. */
static const char *find_shell(const char *const *paths) {
  for (; *paths; paths++)
    if (access(*paths, X_OK) == 0) return *paths;
  return NULL;
}

TEST(completion_script) {
  CHECK_EQ_INT(STCLI("completion", "bash"), 0);
  CHECK_CONTAINS_ALL(R.out, "\n_stcli() {\n", "\n_stcli_options() {\n",
                            "\n    endpoints) echo '--names --params' ;;\n", "endpoints --names",
                            "endpoints --params", "tasks --ids", "\ncomplete -F _stcli stcli\n");
  CHECK(strstr(R.out, "compdef") == NULL);
  CHECK_STR_EQ(R.err, "");
  CHECK_EQ_INT(STCLI("completion", "zsh"), 0);
  CHECK_CONTAINS(R.out, "autoload -Uz bashcompinit && bashcompinit\n");
  CHECK_CONTAINS(R.out, "\n_stcli() {\n"); /* the same completion code */
  CHECK_CONTAINS(R.out, "\ncompdef _stcli_zsh stcli\n");
  CHECK(strstr(R.out, "complete -F") == NULL);
  CHECK_EQ_INT(STCLI("completion", "fish"), 2);
  CHECK_CONTAINS(R.err, "stcli: USAGE: no completion for 'fish' (bash or zsh)");
  CHECK_EQ_INT(STCLI("completion"), 2);
  CHECK_EQ_INT(STCLI("completion", "bash", "extra"), 2);
  CHECK_EQ_INT(STCLI("completion", "--help"), 0);
  CHECK_CONTAINS(R.out, "source <(stcli completion bash)");
  CHECK_CONTAINS(R.out, "source <(stcli completion zsh)");
  CHECK_EQ_INT(STCLI("--help"), 0);
  CHECK_CONTAINS(R.out, "\n  completion ");
  CHECK_CONTAINS(R.out, "\n  watch ");
  /* Both scripts parse in their shell. */
  const char *bash = find_shell((const char *const[]){"/bin/bash", "/usr/bin/bash", NULL});
  if (bash) {
    CHECK_EQ_INT(run_shell(bash, "\"$1\" completion bash > \"$3/c.bash\" && "
                                 "exec \"$0\" -n \"$3/c.bash\""),
                 0);
    CHECK_STR_EQ(R.err, "");
  }
  const char *zsh = find_shell((const char *const[]){"/bin/zsh", "/usr/bin/zsh", NULL});
  if (zsh) {
    CHECK_EQ_INT(run_shell(zsh, "\"$1\" completion zsh > \"$3/c.zsh\" && "
                                "exec \"$0\" -n \"$3/c.zsh\""),
                 0);
    CHECK_STR_EQ(R.err, "");
  } else {
    fprintf(stderr, "no zsh: the zsh script is not checked\n");
  }
}

/* The bash script, sourced into bash, completing lines: t WORD... sets
 * COMP_WORDS to the words (the last one being completed) and prints
 * COMPREPLY as "[a b]", then the completion options the script set
 * ("(-o nospace)"; compopt is stubbed). */
static const char bash_driver[] =
    "source <(\"$1\" completion bash) || exit 9\n"
    "compopt() { o+=\"($*)\"; }\n"
    "t() { o=''; COMP_WORDS=(\"$@\"); COMP_CWORD=$(( $# - 1 )); _stcli;"
    " echo \"[${COMPREPLY[*]}]$o\"; }\n"
    "t \"$1\" ca\n"
    "t \"$1\" --json st\n"
    "t \"$1\" watch --i\n"
    "t \"$1\" call --args-json '{}' --v\n"
    "t \"$1\" tasks --status c\n"
    "t \"$1\" --socket \"$2\" call al\n"
    "t \"$1\" --socket \"$2\" invalidate ''\n"
    "t \"$1\" --socket = \"$2\" submit b\n"
    "t \"$1\" --socket \"$2\" call alpha ''\n"
    "t \"$1\" --socket \"$2\" call alpha v = 1 t\n"
    "t \"$1\" --socket \"$2\" submit alpha n : int = 5 ''\n"
    "t \"$1\" --socket \"$2\" call alpha n =\n"
    "t \"$1\" --socket \"$2\" call alpha n = ''\n"
    "t \"$1\" --socket \"$2\" call alpha --v\n"
    "t \"$1\" --socket \"$2\" call gamma ''\n"
    "t \"$1\" --socket \"$2\" endpoints --params b\n"
    "t \"$1\" --socket \"$2\" wait ''\n"
    "t \"$1\" --socket \"$2\" --json cancel ''\n"
    "t \"$1\" --socket /nonexistent/x.sock call ''\n"
    "t \"$1\" --socket /nonexistent/x.sock call alpha ''\n"
    "t \"$1\" --base-path /nonexistent/\n"
    "t \"$1\" help wa\n"
    "t \"$1\" completion ''\n"
    "t \"$1\" --socket \"$2\" get mo\n"
    "t \"$1\" --socket \"$2\" delete ot\n"
    "t \"$1\" --socket \"$2\" keys m\n"
    "t \"$1\" --socket \"$2\" buffer-unlink ''\n"
    "t \"$1\" --socket \"$2\" release ''\n"
    "t \"$1\" --socket /nonexistent/x.sock get ''\n";

TEST(completion_in_bash) {
  const char *bash = find_shell((const char *const[]){"/bin/bash", "/usr/bin/bash", NULL});
  if (!bash) {
    fprintf(stderr, "no bash: the bash script is not run\n");
    return;
  }
  CHECK_EQ_INT(run_shell(bash, bash_driver), 0);
  char want[1024];
  snprintf(want, sizeof want,
           "[call cancel]\n"
           "[stats status]\n"
           "[--interval]\n"
           "[--view --values]\n"
           "[completed cancelled]\n"
           "[alpha]\n"
           "[alpha beta cached t]\n"
           "[beta]\n"
           "[v= n= tag=](-o nospace)\n"
           "[tag=](-o nospace)\n"
           "[v= tag=](-o nospace)\n"
           "[]\n"
           "[]\n"
           "[--view --values]\n"
           "[]\n"
           "[beta]\n"
           "[%s %s]\n"
           "[%s %s]\n"
           "[]\n"
           "[]\n"
           "[](-o filenames)\n"
           "[wait watch]\n"
           "[bash zsh]\n"
           "[model/w]\n"
           "[other]\n"
           "[model/w]\n"
           "[cam]\n"
           "[%s]\n"
           "[]\n",
           task_b, task_a, task_b, task_a, object_ids);
  CHECK_STR_EQ(R.out, want);
  CHECK_STR_EQ(R.err, ""); /* no server answering is quiet */
}

/* The zsh script, sourced into zsh -f after compinit, completing lines
 * through its completion function: t WORD... sets words, CURRENT and
 * PREFIX as zsh's completion does; compadd (stubbed) prints the matches
 * of PREFIX as "[a b]" and " (nospace)" for -S '', _files "[files P]". */
static const char zsh_driver[] =
    "autoload -Uz compinit && compinit -u -d \"$3/zcompdump\" || exit 10\n"
    "source <(\"$1\" completion zsh) || exit 9\n"
    "[[ $_comps[stcli] == _stcli_zsh ]] || { echo \"stcli: '$_comps[stcli]'\"; exit 8; }\n"
    "(( $+functions[_stcli] && $+functions[compgen] )) || exit 7\n"
    "compadd() {\n"
    "  local ns='' a\n"
    "  [[ $1 == -S && -z $2 ]] && ns=' (nospace)'\n"
    "  local -a m\n"
    "  a=${@[-1]}\n"
    "  m=(\"${(@P)a}\")\n"
    "  m=(\"${(@M)m:#${PREFIX}*}\")\n"
    "  print -r -- \"[${m[*]}]$ns\"\n"
    "}\n"
    "compset() { [[ $1 == -P && $PREFIX == *=* ]] && PREFIX=${PREFIX#*=}; }\n"
    "_files() { print -r -- \"[files $PREFIX]\"; }\n"
    "t() { words=(\"$@\"); CURRENT=$#; PREFIX=${@[-1]}; _stcli_zsh; }\n"
    "t \"$1\" ca\n"
    "t \"$1\" watch --i\n"
    "t \"$1\" tasks --status c\n"
    "t \"$1\" --socket \"$2\" call al\n"
    "t \"$1\" --socket=\"$2\" call alpha ''\n"
    "t \"$1\" --socket \"$2\" call alpha v=1 t\n"
    "t \"$1\" --socket \"$2\" submit alpha n:int=5 ''\n"
    "t \"$1\" --socket \"$2\" call alpha n=\n"
    "t \"$1\" --socket \"$2\" call alpha --v\n"
    "t \"$1\" --socket \"$2\" endpoints --params=b\n"
    "t \"$1\" --socket \"$2\" wait ''\n"
    "t \"$1\" --socket /nonexistent/x.sock call ''\n"
    "t \"$1\" --socket=/nonexistent/x\n"
    "t \"$1\" --base-path /nonexistent/y\n"
    "t \"$1\" completion ''\n"
    "t \"$1\" --socket \"$2\" get mo\n"
    "t \"$1\" --socket \"$2\" buffer-unlink c\n"
    "t \"$1\" --socket \"$2\" release ''\n";

TEST(completion_in_zsh) {
  const char *zsh = find_shell((const char *const[]){"/bin/zsh", "/usr/bin/zsh", NULL});
  if (!zsh) {
    fprintf(stderr, "no zsh: the zsh script is not run\n");
    return;
  }
  CHECK_EQ_INT(run_shell(zsh, zsh_driver), 0);
  char want[1024];
  snprintf(want, sizeof want,
           "[call cancel]\n"
           "[--interval]\n"
           "[completed cancelled]\n"
           "[alpha]\n"
           "[v= n= tag=] (nospace)\n"
           "[tag=] (nospace)\n"
           "[v= tag=] (nospace)\n"
           "[]\n"
           "[--view --values]\n"
           "[beta]\n"
           "[%s %s]\n"
           "[]\n"
           "[files /nonexistent/x]\n"
           "[files /nonexistent/y]\n"
           "[bash zsh]\n"
           "[model/w]\n"
           "[cam]\n"
           "[%s]\n",
           task_b, task_a, object_ids);
  CHECK_STR_EQ(R.out, want);
  CHECK_STR_EQ(R.err, "");
}

static const stt_endpoint_t endpoints[] = {
    {"t.lua", STT_EP_T},
    {"alpha.lua",
     "return st.endpoint{ name = \"alpha\", params = { v = st.required, n = 1, tag = \"x\" },\n"
     "  build = function(a) return 1 end }\n"},
    {"beta.lua",
     "return st.endpoint{ name = \"beta\", build = function(a) return 2 end }\n"},
    {"cached.lua",
     "return st.endpoint{ name = \"cached\", cache = true,\n"
     "  build = function(a) return st.zeros{2} end }\n"},
    {NULL, NULL},
};

int main(void) {
  cli_setup(&srv, NULL, endpoints);
  RUN(endpoints_names);
  RUN(endpoints_params);
  RUN(tasks_ids);
  RUN(keys_buffers_objects_names);
  RUN(completion_script);
  RUN(completion_in_bash);
  RUN(completion_in_zsh);
  return stt_server_finish(&srv);
}

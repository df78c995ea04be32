/* stcli pull, replicate: keys between servers (docs/multihost.md, "Pulling
 * a key" and "Pushing a key"; docs/cli.md, "pull, replicate"). Each
 * starts a task on the server and, unless --no-wait, follows it to its
 * end with a progress display on stderr, then prints what it did. Ctrl-C
 * while waiting cancels the task. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* How long one `wait` request lasts on a terminal (the bar's refresh)
 * and elsewhere (one progress line each). */
#define TTY_STEP_S 0.2
#define LINE_STEP_S 1.0

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig) {
  (void)sig;
  interrupted = 1;
}

static int is_finished(const char *status) {
  return strcmp(status, "completed") == 0 || strcmp(status, "failed") == 0 ||
         strcmp(status, "cancelled") == 0;
}

/* The bytes of a pull's note "N of M bytes": 1, or 0 when it is not one. */
static int note_bytes(const char *note, double *done, double *total) {
  unsigned long long n, m;
  if (!note || sscanf(note, "%llu of %llu bytes", &n, &m) != 2) return 0;
  *done = (double)n;
  *total = (double)m;
  return 1;
}

/* One progress display of task `id` ("pull w/model from a"): a bar on a
 * terminal, redrawn in place, else a line each time it is called. */
static void show_progress(int tty, const char *what, const st_value_t *info, double elapsed) {
  const char *status = cli_value_str(st_value_get(info, "status"));
  const char *note = cli_value_str(st_value_get(info, "note"));
  double p = -1, done = 0, total = 0;
  int has_p = cli_value_number(st_value_get(info, "progress"), &p);
  if (has_p) p = p < 0 ? 0 : p > 1 ? 1 : p;
  char amount[96] = "";
  if (note_bytes(note, &done, &total)) {
    char a[32], b[32];
    cli_format_bytes(done, a, sizeof a);
    cli_format_bytes(total, b, sizeof b);
    snprintf(amount, sizeof amount, "%s of %s, %.2f GB/s", a, b,
             elapsed > 0 ? done / elapsed / 1e9 : 0.0);
  } else if (note && *note) {
    snprintf(amount, sizeof amount, "%.80s", note);
  }
  if (tty) {
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int fill = has_p ? (int)(p * WIDTH + 0.5) : 0;
    for (int k = 0; k < WIDTH; k++) bar[k] = k < fill ? '#' : '-';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r\033[K%s [%s] ", what, bar);
    if (has_p) fprintf(stderr, "%3.0f%%", p * 100);
    else fprintf(stderr, "%s", status ? status : "?");
    if (*amount) fprintf(stderr, "  %s", amount);
    fflush(stderr);
    return;
  }
  fprintf(stderr, "%s: %s", what, status ? status : "?");
  if (has_p) fprintf(stderr, " %.0f%%", p * 100);
  if (*amount) fprintf(stderr, " %s", amount);
  fprintf(stderr, "\n");
}

/* Waits for task `id` to end, showing progress as `what`: CLI_OK with
 * *result the task's result (owned), or an exit code after printing the
 * failure (the task's error, CANCELLED after Ctrl-C, TIMEOUT past
 * limit_s when it is >= 0). */
static int follow(st_client_t *c, uint64_t id, const char *what, double limit_s,
                  st_result_t **result) {
  *result = NULL;
  int tty = isatty(STDERR_FILENO);
  double step = tty ? TTY_STEP_S : LINE_STEP_S;
  double start = cli_now_unix();
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  interrupted = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int code = CLI_OK, drawn = 0, asked_stop = 0;
  for (;;) {
    double wait_s = step;
    if (limit_s >= 0) {
      double left = limit_s - (cli_now_unix() - start);
      if (left < wait_s) wait_s = left > 0 ? left : 0;
    }
    st_result_t *info = NULL;
    int rc = st_client_task_wait(c, id, wait_s, &info);
    if (rc != ST_OK) {
      if (drawn) fprintf(stderr, "\r\033[K");
      code = cli_fail(c, rc);
      break;
    }
    const st_value_t *v = st_result_value(info);
    const char *status = cli_value_str(st_value_get(v, "status"));
    if (status && is_finished(status)) {
      st_result_free(info);
      if (drawn) fprintf(stderr, "\r\033[K");
      rc = st_client_task_result(c, id, result);
      if (rc != ST_OK) code = cli_fail(c, rc);
      break;
    }
    if (interrupted && !asked_stop) {
      /* The task ends cancelled; the next wait sees it. */
      asked_stop = 1;
      st_result_t *ci = NULL;
      if (st_client_task_cancel(c, id, &ci) != ST_OK) {
        st_result_free(info);
        if (drawn) fprintf(stderr, "\r\033[K");
        code = cli_fail(c, ST_ERR_CANCELLED);
        break;
      }
      st_result_free(ci);
    }
    show_progress(tty, what, v, cli_now_unix() - start);
    drawn = tty;
    st_result_free(info);
    if (limit_s >= 0 && cli_now_unix() - start >= limit_s) {
      if (drawn) fprintf(stderr, "\r\033[K");
      char took[32];
      cli_format_duration(limit_s, took, sizeof took);
      fprintf(stderr, "stcli: TIMEOUT: task %" PRIu64 " (%s) is still running after %s; it "
              "goes on (stcli wait %" PRIu64 ", stcli cancel %" PRIu64 ")\n", id, what, took, id,
              id);
      code = CLI_TIMEOUT;
      break;
    }
  }
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  return code;
}

/* The options pull and replicate share. */
typedef struct remote_args {
  const char *key;
  const char *from;           /* pull                      */
  const char *to;             /* replicate: "a,b"          */
  const char *as;
  const char *device;         /* pull                      */
  int policy;                 /* pull                      */
  uint64_t version;
  int no_wait;
  double timeout_s;           /* --timeout; -1: none       */
  cli_readers_t readers;      /* pull                      */
  int live;                   /* pull --live               */
} remote_args_t;

static int take_readers(const char *v, void *ud) { return cli_parse_readers("pull", v, ud); }

static int parse_remote(cli_t *g, const cli_command_t *cmd, int pull, int argc, char **argv,
                        remote_args_t *a, int *done) {
  memset(a, 0, sizeof *a);
  a->timeout_s = -1;
  *done = 0;
  if (pull) {
    int code = cli_take_option(&argc, argv, "--readers", take_readers, &a->readers);
    if (code != CLI_OK) return code;
  }
  const char *name = cmd->name;
  for (int i = 1; i < argc; i++) {
    const char *v;
    /* Before the global options: the global --timeout (per reply) goes
     * before the command, as for `stcli wait`. */
    if (cli_option("--timeout", argc, argv, &i, &v)) {
      if (cli_parse_duration(v, &a->timeout_s) != 0)
        return cli_usage(name, "--timeout needs a duration (5, 2.5s, 500ms, 1m), not '%s'",
                         v ? v : "");
      continue;
    }
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(argv[i], "--help") == 0) {
      cli_print_command_help(cmd, stdout);
      *done = 1;
      return CLI_OK;
    } else if (pull && cli_option("--from", argc, argv, &i, &v)) {
      if (!v || !*v) return cli_usage(name, "--from needs a peer id (stcli peers lists them)");
      a->from = v;
    } else if (!pull && cli_option("--to", argc, argv, &i, &v)) {
      if (!v || !*v) return cli_usage(name, "--to needs peer ids, joined by commas");
      a->to = v;
    } else if (cli_option("--version", argc, argv, &i, &v)) {
      if (!v || cli_parse_id(name, "version", v, &a->version) != CLI_OK || a->version == 0)
        return cli_usage(name, "--version takes a version >= 1");
    } else if (cli_option("--as", argc, argv, &i, &v)) {
      if (!v || !*v) return cli_usage(name, "--as needs a key name");
      a->as = v;
    } else if (pull && cli_option("--device", argc, argv, &i, &v)) {
      if (!v || !*v) return cli_usage(name, "--device needs cpu, cuda or cuda:N");
      a->device = v;
    } else if (pull && cli_option("--policy", argc, argv, &i, &v)) {
      if (v && strcmp(v, "pinned") == 0) a->policy = ST_KEY_PINNED;
      else if (v && strcmp(v, "evictable") == 0) a->policy = ST_KEY_EVICTABLE;
      else return cli_usage(name, "--policy takes pinned or evictable, not '%s'", v ? v : "");
    } else if (pull && strcmp(argv[i], "--live") == 0) {
      a->live = 1;
    } else if (strcmp(argv[i], "--no-wait") == 0) {
      a->no_wait = 1;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_unknown(cmd, argv[i]);
    } else if (a->key) {
      return cli_usage(name, "one key only ('%s' is extra)", argv[i]);
    } else {
      a->key = argv[i];
    }
  }
  if (!a->key) return cli_usage(name, "a key is required");
  if (pull && !a->from) return cli_usage(name, "--from PEER is required (stcli peers lists them)");
  if (!pull && !a->to) return cli_usage(name, "--to PEER[,PEER...] is required");
  return CLI_OK;
}

/* cli_fail for a request naming peer `peer`: when the server answered
 * NOT_FOUND for it, a "did you mean" among the configured peers. */
static int fail_peer(st_client_t *c, int rc, const char *peer) {
  if (rc != ST_ERR_NOT_FOUND || !peer) return cli_fail(c, rc);
  char msg[512];
  const char *m = st_client_error(c);
  snprintf(msg, sizeof msg, "%s", m && *m ? m : st_strerror(rc));
  cli_suggest_t s;
  cli_suggest_init(&s, peer);
  st_result_t *r = NULL;
  if (st_client_peers(c, &r) == ST_OK) {
    const st_value_t *v = st_result_value(r);
    for (size_t i = 0; v && v->kind == ST_VALUE_ARRAY && i < v->as.array.len; i++) {
      const char *id = cli_value_str(st_value_get(&v->as.array.items[i], "id"));
      if (id) cli_suggest_add(&s, id, strlen(id));
    }
  }
  st_result_free(r);
  fprintf(stderr, "stcli: %s: %s%s\n", st_err_name(rc), msg, cli_suggest_text(&s));
  return cli_exit_code(rc);
}

/* --no-wait: the task id, or {"task_id": N}. */
static void print_task_id(const cli_t *g, uint64_t id) {
  if (g->json) printf("{\"task_id\": %" PRIu64 "}\n", id);
  else printf("%" PRIu64 "\n", id);
}

/* ------------------------------------------------------------------ pull */

/* "w/model version 2 <- a:w/model version 1: 25.0 MiB (26218509 bytes)
 * in 0.41 s, 0.06 GB/s". */
static void print_pulled(const st_value_t *v) {
  const char *key = cli_value_str(st_value_get(v, "key"));
  const st_value_t *o = st_value_get(v, "origin");
  const char *peer = cli_value_str(st_value_get(o, "peer"));
  const char *okey = cli_value_str(st_value_get(o, "key"));
  double version = 0, oversion = 0, bytes = 0, seconds = 0;
  cli_value_number(st_value_get(v, "version"), &version);
  cli_value_number(st_value_get(o, "version"), &oversion);
  cli_value_number(st_value_get(v, "bytes"), &bytes);
  cli_value_number(st_value_get(v, "seconds"), &seconds);
  char size[32], took[32];
  cli_format_bytes(bytes, size, sizeof size);
  cli_format_duration(seconds, took, sizeof took);
  const st_value_t *live = st_value_get(v, "live");
  printf("%s version %.0f <- %s:%s version %.0f: %s (%.0f bytes) in %s, %.2f GB/s%s\n",
         key ? key : "?", version, peer ? peer : "?", okey ? okey : "?", oversion, size, bytes,
         took, seconds > 0 ? bytes / seconds / 1e9 : 0.0,
         live && live->kind == ST_VALUE_BOOL && live->as.boolean
             ? "; live: it follows the peer's key (stcli replicas shows it)"
             : "");
}

static int run_pull(cli_t *g, int argc, char **argv) {
  remote_args_t a;
  int done;
  int code = parse_remote(g, &cli_pull_command, 1, argc, argv, &a, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  st_readers_t rd;
  st_pull_opts_t o = {.version = a.version, .as = a.as, .device = a.device,
                      .policy = a.policy, .readers = cli_readers_of(&a.readers, &rd),
                      .live = a.live};
  uint64_t id;
  int rc = st_client_pull(c, a.key, a.from, &o, &id);
  if (rc != ST_OK) {
    code = fail_peer(c, rc, a.from);
  } else if (a.no_wait) {
    print_task_id(g, id);
  } else {
    char what[300];
    snprintf(what, sizeof what, "pull %.128s from %.128s", a.key, a.from);
    st_result_t *r = NULL;
    code = follow(c, id, what, a.timeout_s, &r);
    if (code == CLI_OK) {
      const st_value_t *v = st_result_value(r);
      if (g->json) code = cli_print_json_owned(st_value_json(v, 1));
      else print_pulled(v);
    }
    st_result_free(r);
  }
  st_client_close(c);
  return code;
}

const cli_command_t cli_pull_command = {
    "pull",
    "pull KEY --from PEER [--version N] [--as NAME] [--device D] [--live] [--no-wait]",
    "Copy a key published on a peer into this server, showing its progress.",
    "Starts a pull (docs/multihost.md) and waits for it: on a terminal a\n"
    "progress bar on stderr (percent, bytes moved, rate), else one progress\n"
    "line a second. Then prints what arrived:\n"
    "  w/model version 1 <- a:w/model version 3: 1.5 GiB (1610612736 bytes) in 2.1 s, 0.77 GB/s\n"
    "(the key and version here, the peer, its key and version, the bytes, the\n"
    "time and the rate). Ctrl-C cancels the pull; nothing of it stays. A\n"
    "refusal exits 1 with the server's reason (a key the peer does not\n"
    "export: AUTH; this server's memory budget: OUT_OF_MEMORY).\n"
    "With --json, prints the task's result {key, version, origin, bytes, seconds}.\n\n"
    "Options:\n"
    "  --from PEER        the peer's id (stcli peers lists them); required\n"
    "  --version N        the peer's version N (default: its latest)\n"
    "  --as NAME          the key's name here (default: KEY)\n"
    "  --device D         cpu, cuda or cuda:N (default: the kind of memory the\n"
    "                     key has on the peer)\n"
    "  --policy P         pinned (default) or evictable\n"
    "  --readers LIST     uids and groups granted read of the copy: uid:N, gid:N\n"
    "  --live             the peer's key is a live key: the copy is a live key\n"
    "                     that follows it, each new version brought in place\n"
    "                     under the same number (stcli replicas, unsubscribe)\n"
    "  --no-wait          print the task id and return (stcli wait ID follows it)\n"
    "  --timeout T        stop waiting after T (exit 4; the pull goes on)\n",
    run_pull,
    "--from= --version= --as= --device= --policy= --readers= --live --no-wait --timeout=",
};

/* ------------------------------------------------------------- replicate */

/* One line per peer of a replicate result; CLI_SERVER_ERROR when one
 * failed. */
static int print_replicated(const st_value_t *v) {
  const char *key = cli_value_str(st_value_get(v, "key"));
  double version = 0;
  cli_value_number(st_value_get(v, "version"), &version);
  const st_value_t *peers = st_value_get(v, "peers");
  int failed = 0;
  size_t n = peers && peers->kind == ST_VALUE_MAP ? peers->as.map.len : 0;
  printf("%s version %.0f to %zu peer%s\n", key ? key : "?", version, n, n == 1 ? "" : "s");
  for (size_t i = 0; i < n; i++) {
    const char *id = cli_value_str(&peers->as.map.keys[i]);
    const st_value_t *e = &peers->as.map.values[i];
    const st_value_t *ok = st_value_get(e, "ok");
    double pv = 0;
    if (ok && ok->kind == ST_VALUE_BOOL && ok->as.boolean) {
      cli_value_number(st_value_get(e, "version"), &pv);
      printf("  %-20s ok, version %.0f\n", id ? id : "?", pv);
    } else {
      const char *err = cli_value_str(st_value_get(e, "error"));
      printf("  %-20s failed: %s\n", id ? id : "?", err ? err : "no reason given");
      failed++;
    }
  }
  if (failed)
    fprintf(stderr, "stcli: replicate: %d of %zu peers failed\n", failed, n);
  return failed ? CLI_SERVER_ERROR : CLI_OK;
}

static int run_replicate(cli_t *g, int argc, char **argv) {
  remote_args_t a;
  int done;
  int code = parse_remote(g, &cli_replicate_command, 0, argc, argv, &a, &done);
  if (code != CLI_OK || done) return code;
  /* "a,b,c" into ids (at most 256: a cluster's peer table). */
  enum { MAX_TO = 256 };
  char *list = strdup(a.to);
  const char *to[MAX_TO];
  size_t nto = 0;
  if (!list) {
    fprintf(stderr, "stcli: OUT_OF_MEMORY: out of memory\n");
    return CLI_SERVER_ERROR;
  }
  for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    if (nto == MAX_TO) {
      free(list);
      return cli_usage("replicate", "--to names more than %d peers", MAX_TO);
    }
    to[nto++] = p;
  }
  if (nto == 0) {
    free(list);
    return cli_usage("replicate", "--to needs peer ids, joined by commas");
  }
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) {
    free(list);
    return code;
  }
  st_replicate_opts_t o = {.version = a.version, .as = a.as};
  uint64_t id;
  int rc = st_client_replicate(c, a.key, to, nto, &o, &id);
  if (rc != ST_OK) {
    code = fail_peer(c, rc, nto == 1 ? to[0] : NULL);
  } else if (a.no_wait) {
    print_task_id(g, id);
  } else {
    char what[300];
    snprintf(what, sizeof what, "replicate %.128s to %.128s", a.key, a.to);
    st_result_t *r = NULL;
    code = follow(c, id, what, a.timeout_s, &r);
    if (code == CLI_OK) {
      const st_value_t *v = st_result_value(r);
      if (g->json) code = cli_print_json_owned(st_value_json(v, 1));
      else code = print_replicated(v);
    }
    st_result_free(r);
  }
  st_client_close(c);
  free(list);
  return code;
}

const cli_command_t cli_replicate_command = {
    "replicate",
    "replicate KEY --to PEER[,PEER...] [--version N] [--as NAME] [--no-wait]",
    "Push a key of this server to peers, showing its progress.",
    "Starts a replicate (docs/multihost.md, \"Pushing a key\") and waits for\n"
    "it, with the progress display of `pull`. Each peer pulls the key under\n"
    "the uid its config names for this server (peer.peers[ID].as_uid there),\n"
    "so the key must be exported. When every peer holds it, prints one line\n"
    "per peer:\n"
    "  w/model version 3 to 2 peers\n"
    "    b                    ok, version 1\n"
    "    c                    ok, version 4\n"
    "else exits 1 naming each peer's outcome (\"replicate: 1 of 2 peers\n"
    "failed: b: ok; c: ...\"). Ctrl-C cancels the task and the peers' pulls.\n"
    "With --json, prints the task's result {key, version, peers: {ID: {ok,\n"
    "version}}}.\n\n"
    "Options:\n"
    "  --to PEERS         peer ids joined by commas (stcli peers lists them)\n"
    "  --version N        this server's version N (default: the latest)\n"
    "  --as NAME          the key's name on the peers (default: KEY)\n"
    "  --no-wait          print the task id and return (stcli wait ID follows it)\n"
    "  --timeout T        stop waiting after T (exit 4; the task goes on)\n",
    run_replicate,
    "--to= --version= --as= --no-wait --timeout=",
};

/* src/cli: stcli, the shell tool, built on the public client API only
 * (include/st/). docs/cli.md documents every command and exit code.
 *
 *   main.c       global options, dispatch, help, errors and exit codes
 *   cmd_ping.c   ping
 *   cmd_info.c   info, endpoints
 *   cmd_call.c   call
 *   cmd_task.c   submit, wait, status, result, cancel, tasks
 *   cmd_remote.c pull, replicate: keys between servers
 *   cmd_replicas.c replicas, unsubscribe: live keys followed across servers
 *   cmd_object.c objects, release, invalidate
 *   cmd_keys.c   keys, get, delete
 *   cmd_admin.c  reload, stats
 *   cmd_buffer.c buffers, buffer-create, buffer-unlink
 *   cmd_watch.c  watch: live counters and rates
 *   cmd_completion.c  completion: the bash and zsh completion scripts
 *   suggest.c    "did you mean" for unknown commands, options, endpoints
 *   result_out.c NAME key=value command lines; printing call-like results
 *   table.c      tables, ids, times and small value helpers
 *   print.c      shared output helpers (values, tensors, checksums)
 */
#ifndef ST_CLI_H
#define ST_CLI_H

#include "common/suggest.h"
#include <stdint.h>
#include <stdio.h>

#include <st/client.h>

/* Exit codes (docs/cli.md). */
#define CLI_OK 0
#define CLI_SERVER_ERROR 1
#define CLI_USAGE 2
#define CLI_NO_CONNECTION 3
#define CLI_TIMEOUT 4

typedef struct cli {
  const char *base;     /* --base-path, NULL: environment, then default */
  int device;           /* --device                                     */
  const char *socket;   /* --socket, overrides base and device          */
  int json;             /* --json                                       */
  int timeout_ms;       /* --timeout, 0: none                           */
  long long server_uid; /* --server-uid, ST_SERVER_UID_DEFAULT: none    */
} cli_t;

typedef struct cli_command {
  const char *name;
  const char *synopsis;   /* "ping [--count N]"                 */
  const char *summary;    /* one line for the command list       */
  const char *details;    /* the rest of `stcli help NAME`       */
  int (*run)(cli_t *g, int argc, char **argv);  /* argv[0] is the name */
  /* The command's own options, space-separated, "--count=" for one that
   * takes a value ("--count N", "--count=N"), "" for none: what shell
   * completion offers and "did you mean" compares with. */
  const char *options;
} cli_command_t;

extern const cli_command_t cli_ping_command;
extern const cli_command_t cli_info_command;
extern const cli_command_t cli_endpoints_command;
extern const cli_command_t cli_peers_command;
extern const cli_command_t cli_pull_command;
extern const cli_command_t cli_replicate_command;
extern const cli_command_t cli_replicas_command;
extern const cli_command_t cli_unsubscribe_command;
extern const cli_command_t cli_call_command;
extern const cli_command_t cli_submit_command;
extern const cli_command_t cli_wait_command;
extern const cli_command_t cli_status_command;
extern const cli_command_t cli_result_command;
extern const cli_command_t cli_cancel_command;
extern const cli_command_t cli_tasks_command;
extern const cli_command_t cli_objects_command;
extern const cli_command_t cli_release_command;
extern const cli_command_t cli_invalidate_command;
extern const cli_command_t cli_keys_command;
extern const cli_command_t cli_get_command;
extern const cli_command_t cli_delete_command;
extern const cli_command_t cli_reload_command;
extern const cli_command_t cli_rpc_command;
extern const cli_command_t cli_stats_command;
extern const cli_command_t cli_watch_command;
extern const cli_command_t cli_completion_command;
extern const cli_command_t cli_buffers_command;
extern const cli_command_t cli_buffer_create_command;
extern const cli_command_t cli_buffer_unlink_command;
extern const cli_command_t cli_handoffs_command;
extern const cli_command_t cli_handoff_delete_command;

/* main.c: the command table */
/* Command i of the table (help's order), NULL past the last one. */
const cli_command_t *cli_command_at(size_t i);

/* options.c: what every command shares */
/* The global options, as cli_command_t.options lists a command's. */
extern const char cli_global_options[];
/* The help text of the global options. */
extern const char cli_global_help[];
/* 1 when argv[*i] is option `opt`, given as "--opt VALUE" (*i advances
 * past VALUE) or "--opt=VALUE"; *value is VALUE, NULL when it is missing.
 * 0 (and *value NULL) for any other word. */
int cli_option(const char *opt, int argc, char **argv, int *i, const char **value);

/* A duration ("5", "2.5s", "500ms", "1m"; bare: seconds) into *seconds:
 * 0, or -1 when v is NULL or malformed (options.c). */
int cli_parse_duration(const char *v, double *seconds);
/* Consumes a global option at argv[*i] (advancing *i past its value).
 * Returns 1 if it was one, 0 if not, -1 after printing a usage error. */
int cli_global_option(cli_t *g, int argc, char **argv, int *i);
/* Prints "stcli: USAGE: ..." plus a hint for `cmd`; returns CLI_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the usage of a command on `out`. */
void cli_print_command_help(const cli_command_t *cmd, FILE *out);
/* Connects as the global options say; on failure prints the error and
 * returns the exit code (else CLI_OK with *out set). */
int cli_connect(const cli_t *g, st_client_t **out);
/* Prints the last failure of c as "stcli: NAME: message"; returns the exit
 * code for rc. */
int cli_fail(st_client_t *c, int rc);
/* Connects, runs one method and closes; prints the failure. Returns the
 * exit code (CLI_OK with *out set, which the caller frees). */
int cli_fetch(const cli_t *g, int (*method)(st_client_t *, st_result_t **), st_result_t **out);
/* Prints the value of r as JSON and frees r (taken). Returns the exit code. */
int cli_print_result_json(st_result_t *r);
/* Exit code for an error value. */
int cli_exit_code(int rc);
/* Parses a non-negative decimal int; 0 on success. */
int cli_parse_count(const char *s, long max, long *out);

/* --readers: the uids and gids a command that makes a name grants read
 * (st_readers_t; docs/cli.md, "Read grants"). `given` says an option was
 * seen, so that the request carries a grant. */
#define CLI_READERS_MAX 16
typedef struct cli_readers {
  uint32_t uids[CLI_READERS_MAX], gids[CLI_READERS_MAX];
  size_t nuids, ngids;
  int given;
} cli_readers_t;
/* Adds the entries of one --readers value (`v`, NULL when the value is
 * missing) to r: "uid:N" and "gid:N" joined by commas, N a number or a
 * user/group name of this host. CLI_OK, or a usage error for `cmd`. */
int cli_parse_readers(const char *cmd, const char *v, cli_readers_t *r);
/* The st_readers_t of r (pointing into r), NULL when no --readers was
 * given. */
const st_readers_t *cli_readers_of(const cli_readers_t *r, st_readers_t *out);

/* result_out.c */
#define CLI_DEFAULT_VALUES 8
#define CLI_ARGS_VALUES 1u   /* accept --values[=N] */
#define CLI_ARGS_ALL 2u      /* accept --all        */
#define CLI_ARGS_VIEW 4u     /* accept --view SPEC  */

/* "NAME [key=value ...] [--args-json JSON]" and the flags' options. */
typedef struct cli_call_args {
  const char *endpoint;   /* borrowed from argv                          */
  st_args_t *args;        /* owned (st_args_free); NULL after a failure  */
  int nargs;              /* key=value words and --args-json given       */
  long nvalues;           /* --values[=N]; -1 when absent                */
  int all;                /* --all                                       */
  const char *view;       /* --view SPEC (borrowed from argv); NULL: none */
  int help;               /* --help was printed: exit CLI_OK             */
} cli_call_args_t;

/* Parses a command line of that shape (argv[0] is the command), global
 * options included. Returns CLI_OK (check ->help) or an exit code after
 * printing the error. */
int cli_parse_call_args(cli_t *g, const cli_command_t *cmd, int argc, char **argv,
                        unsigned flags, cli_call_args_t *out);
/* cli_parse_call_args, then cli_connect: CLI_OK with *c connected (the
 * caller frees out->args and closes *c), CLI_OK with *c NULL when only help
 * was printed, or an exit code (out->args already freed). */
int cli_call_connect(cli_t *g, const cli_command_t *cmd, int argc, char **argv, unsigned flags,
                     cli_call_args_t *out, st_client_t **c);
/* Prints a call-like result as `call` does: tensors (with values when
 * nvalues >= 0), a non-tensor value as JSON, the object line; or JSON
 * with --json. Returns the exit code. */
int cli_print_result(const cli_t *g, const st_result_t *r, long nvalues);

/* table.c */
/* The AGE cell of a listed object or task: how long before `now` its
 * "created_at" (unix seconds) was, "-" without one. Owned (free()), NULL
 * when out of memory. */
char *cli_age_cell(const st_value_t *e, double now);
#define CLI_TABLE_MAX_COLS 8
/* Prints the result r of a listing command: as JSON with --json or when
 * its value is not an array, else as a table of `ncol` columns (at most
 * CLI_TABLE_MAX_COLS) under `heads`: fill(e, now, row) makes the ncol owned
 * cells (may be NULL) of element e, now being cli_now_unix(). Prints the
 * line of printf format `empty` when the array is empty, the out-of-memory
 * error when a row cannot be added. Frees r. Returns the exit code. */
int cli_print_listing(const cli_t *g, st_result_t *r, size_t ncol, const char *const *heads,
                      void (*fill)(const st_value_t *e, double now, char **row),
                      const char *empty, ...) __attribute__((format(printf, 6, 7)));
/* A formatted, owned string (free()), or NULL when out of memory. */
char *cli_strdupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 and *out when v is an integer or float; 0 otherwise. */
int cli_value_number(const st_value_t *v, double *out);
/* The text of a STRING value, or NULL. Borrowed. */
const char *cli_value_str(const st_value_t *v);
/* Parses a task or object id (a decimal uint64). CLI_OK, or a usage error
 * for `cmd` naming `what`. */
int cli_parse_id(const char *cmd, const char *what, const char *s, uint64_t *out);
/* Seconds as "850 ms", "4.2 s", "3 min", "2.5 h", "4 d". */
void cli_format_duration(double seconds, char *buf, size_t len);
/* Bytes as "40 B", "4.0 KiB", "11.8 GiB". */
void cli_format_bytes(double bytes, char *buf, size_t len);
/* Unix time as local "YYYY-MM-DD HH:MM:SS". */
void cli_format_unix_time(double t, char *buf, size_t len);
/* Seconds since the epoch now (wall clock). */
double cli_now_unix(void);
/* A command line with only --help, global options and min..max
 * positional words (stored in pos[]; `need` names them for the error,
 * "a task id"); returns CLI_OK (check *done) or an exit code. */
int cli_parse_plain(cli_t *g, const cli_command_t *cmd, int argc, char **argv, int min, int max,
                    const char *need, const char **pos, int *done);
/* Takes every `flag` (e.g. "--force") before a "--" out of argv (*argc
 * shrinks): 1 when there was one, for a command that parses the rest with
 * cli_parse_plain. */
int cli_take_flag(int *argc, char **argv, const char *flag);
/* Takes every option `opt` with its value ("--opt V", "--opt=V") before
 * a "--" out of argv (*argc shrinks), handing each value to take(value,
 * ud) (value NULL when missing). CLI_OK, or the first code other than
 * CLI_OK that take returns. */
int cli_take_option(int *argc, char **argv, const char *opt,
                    int (*take)(const char *value, void *ud), void *ud);
/* Prints the string or number `member` of each map of the array r holds,
 * one per line, or with --json a JSON array of them (what shell
 * completion reads: keys --names, buffers --names, objects --ids); frees
 * r. Returns the exit code. */
int cli_print_members(const cli_t *g, st_result_t *r, const char *member);
/* A command without arguments that runs one method: parses the command
 * line as cli_parse_plain with no positional words, then cli_fetch.
 * Returns the exit code; *out is NULL when only help was printed. */
int cli_fetch_plain(cli_t *g, const cli_command_t *cmd, int argc, char **argv,
                    int (*method)(st_client_t *, st_result_t **), st_result_t **out);

/* suggest.c: "did you mean" */
typedef struct cli_suggest {
  st__suggest_t s;      /* the rule, shared with stserver (common/suggest.h) */
  char text[96];        /* cli_suggest_text's buffer             */
} cli_suggest_t;

/* Starts looking for the candidate closest to `word` (borrowed). */
void cli_suggest_init(cli_suggest_t *s, const char *word);
/* Compares candidate cand[0..len) (not NUL-terminated) with the word. */
void cli_suggest_add(cli_suggest_t *s, const char *cand, size_t len);
/* "; did you mean 'X'?" for the closest candidate, "" when none is close.
 * Points into s. */
const char *cli_suggest_text(cli_suggest_t *s);
/* Compares the names of the endpoints listed in `endpoints` (the reply of
 * st_client_endpoints); returns cli_suggest_text(s). */
const char *cli_suggest_endpoint(cli_suggest_t *s, const st_value_t *endpoints);
/* The usage error for a word command `cmd` (NULL: stcli itself) does not
 * take: "unknown option 'W'" with a "did you mean" among its options and
 * the global ones when W starts with '-', else "unexpected argument 'W'".
 * Returns CLI_USAGE. */
int cli_usage_unknown(const cli_command_t *cmd, const char *word);
/* cli_fail for a request naming `endpoint`: when the server answered
 * UNKNOWN_ENDPOINT, asks it for the endpoint names over c and adds a
 * "did you mean" for a close one to the message. Returns the exit code. */
int cli_fail_endpoint(st_client_t *c, int rc, const char *endpoint);

/* print.c */
/* Prints `s`, then a newline, freeing it; NULL prints an error. */
int cli_print_json_owned(char *s);
/* Compact single-line rendering of a scalar or small value (strings
 * without quotes); owned (free()), NULL when out of memory. */
char *cli_value_text(const st_value_t *v);
/* "[2, 3]" for a shape. */
void cli_format_shape(const st_tensor_t *t, char *buf, size_t len);
/* "cpu", or "cuda:N (GPU-uuid)" for a CUDA tensor. */
const char *cli_device_name(const st_tensor_t *t, char *buf, size_t len);
/* Called with `count` elements in row-major order, from element `first`,
 * as host bytes at `base` (contiguous). */
typedef void (*cli_chunk_fn)(void *ud, const void *base, int64_t first, int64_t count);
/* Hands the first n elements of t (row-major, strides followed) to fn in
 * order, chunk by chunk; a CUDA tensor is copied to the host with
 * st_tensor_copy_to_host. ST_OK or the copy's error. */
int cli_each_chunk(const st_tensor_t *t, int64_t n, cli_chunk_fn fn, void *ud);
/* Element k of contiguous host elements at base as text, exact for
 * integers. */
void cli_format_element(st_dtype_t dtype, const void *base, int64_t k, char *buf, size_t len);
/* Sum of all elements (as doubles) and FNV-1a 64 of the element bytes in
 * row-major order; CPU and CUDA tensors. ST_OK or the copy's error. */
int cli_checksum(const st_tensor_t *t, double *sum, uint64_t *fnv);
/* A double as JSON (null for NaN and infinities). */
void cli_format_json_number(double d, char *buf, size_t len);
/* s as a JSON string literal on out. */
void cli_print_json_string(FILE *out, const char *s);
/* Pretty JSON text `json` (borrowed; NULL prints null) on stdout one
 * level deeper: two spaces after each of its newlines, for a member of an
 * object stcli prints itself. */
void cli_print_json_nested(const char *json);

#endif

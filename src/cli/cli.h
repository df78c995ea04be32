/* src/cli: stcli, the shell tool, built on the public client API only
 * (include/st/). docs/cli.md documents every command and exit code.
 *
 *   main.c       global options, dispatch, help, errors and exit codes
 *   cmd_ping.c   ping
 *   cmd_info.c   info, endpoints
 *   cmd_call.c   call
 *   print.c      shared output helpers (values, tensors, checksums)
 */
#ifndef ST_CLI_H
#define ST_CLI_H

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
} cli_t;

typedef struct cli_command {
  const char *name;
  const char *synopsis;   /* "ping [--count N]"                 */
  const char *summary;    /* one line for the command list       */
  const char *details;    /* the rest of `stcli help NAME`       */
  int (*run)(cli_t *g, int argc, char **argv);  /* argv[0] is the name */
} cli_command_t;

extern const cli_command_t cli_ping_command;
extern const cli_command_t cli_info_command;
extern const cli_command_t cli_endpoints_command;
extern const cli_command_t cli_call_command;

/* main.c */
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
/* Exit code for an error value. */
int cli_exit_code(int rc);
/* Parses a non-negative decimal int; 0 on success. */
int cli_parse_count(const char *s, long max, long *out);

/* print.c */
/* Prints `s`, then a newline, freeing it; NULL prints an error. */
int cli_print_json_owned(char *s);
/* Compact single-line rendering of a scalar or small value (strings
 * without quotes); owned (free()), NULL when out of memory. */
char *cli_value_text(const st_value_t *v);
/* "[2, 3]" for a shape. */
void cli_format_shape(const st_tensor_t *t, char *buf, size_t len);
/* "cpu" or "cuda:N". */
const char *cli_device_name(const st_tensor_t *t, char *buf, size_t len);
/* Element i in row-major order as text, exact for integers. */
void cli_format_element(const st_tensor_t *t, int64_t i, char *buf, size_t len);
/* Sum of all elements (as doubles) and FNV-1a 64 of the element bytes in
 * row-major order. CPU tensors only. */
void cli_checksum(const st_tensor_t *t, double *sum, uint64_t *fnv);
/* A double as JSON (null for NaN and infinities). */
void cli_format_json_number(double d, char *buf, size_t len);
/* s as a JSON string literal on out. */
void cli_print_json_string(FILE *out, const char *s);

#endif

/* stcli: global options, command dispatch, help, errors and exit codes.
 *
 *   stcli [global options] COMMAND [args]
 *
 * Global options may also follow the command. Errors go to stderr as
 * "stcli: NAME: message"; see docs/cli.md for the exit codes.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const cli_command_t help_command;

static const cli_command_t *const commands[] = {
    &cli_ping_command,    &cli_info_command,       &cli_stats_command,
    &cli_endpoints_command, &cli_call_command,     &cli_submit_command,
    &cli_wait_command,    &cli_status_command,     &cli_result_command,
    &cli_cancel_command,  &cli_tasks_command,      &cli_objects_command,
    &cli_release_command, &cli_invalidate_command, &cli_reload_command,
    &cli_watch_command,   &cli_completion_command, &help_command,
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const char global_help[] =
    "Global options (before or after the command):\n"
    "  --socket PATH     connect to this socket (overrides --base-path/--device)\n"
    "  --base-path PATH  socket base; the socket is PATH-<device>.sock\n"
    "                    (default: $" ST_ENV_BASE_PATH ", else " ST_DEFAULT_BASE_PATH ")\n"
    "  --device N        device index of the socket (default 0)\n"
    "  --json            print machine-readable JSON\n"
    "  --timeout MS      give up waiting for a reply after MS milliseconds\n"
    "  --help            show help (also: stcli help COMMAND)\n"
    "  --version         print the version\n";

static void print_main_help(FILE *out) {
  fprintf(out, "usage: stcli [global options] COMMAND [args]\n\n"
               "Talks to a sharedtensor server (stserver) on this host.\n\nCommands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(out, "  %-11s %s\n", commands[i]->name, commands[i]->summary);
  fprintf(out, "\n%s\nExit codes: 0 ok, 1 the server answered with an error, 2 usage error,\n"
               "3 cannot connect or connection lost, 4 timeout.\n",
          global_help);
}

/* See cli.h. */
void cli_print_command_names(FILE *out) {
  for (size_t i = 0; i < NCOMMANDS; i++) fprintf(out, "%s%s", i ? " " : "", commands[i]->name);
}

/* Prints a command's usage on out. */
void cli_print_command_help(const cli_command_t *cmd, FILE *out) {
  fprintf(out, "usage: stcli [global options] %s\n\n%s\n", cmd->synopsis, cmd->summary);
  if (cmd->details && *cmd->details) fprintf(out, "\n%s", cmd->details);
  fprintf(out, "\n%s", global_help);
}

/* "stcli: USAGE: ..." on stderr. Returns CLI_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "stcli: USAGE: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (cmd)
    fprintf(stderr, " (see 'stcli help %s')\n", cmd);
  else
    fprintf(stderr, " (see 'stcli --help')\n");
  return CLI_USAGE;
}

/* Parses a decimal integer in [0, max]. 0 on success, -1 otherwise. */
int cli_parse_count(const char *s, long max, long *out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > max) return -1;
  *out = v;
  return 0;
}

/* Value of an option given as "--opt VALUE" or "--opt=VALUE". Returns the
 * value or NULL (not this option, or missing value: *missing set). */
static const char *option_value(const char *opt, int argc, char **argv, int *i, int *missing) {
  size_t n = strlen(opt);
  const char *a = argv[*i];
  if (strncmp(a, opt, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  (*i)++;
  return argv[*i];
}

/* See cli.h. */
int cli_global_option(cli_t *g, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  int missing = 0;
  const char *v;
  if (strcmp(a, "--json") == 0) {
    g->json = 1;
    return 1;
  }
  if ((v = option_value("--socket", argc, argv, i, &missing))) {
    g->socket = v;
    return 1;
  }
  if (missing) return cli_usage(NULL, "--socket needs a path"), -1;
  if ((v = option_value("--base-path", argc, argv, i, &missing))) {
    g->base = v;
    return 1;
  }
  if (missing) return cli_usage(NULL, "--base-path needs a path"), -1;
  if ((v = option_value("--device", argc, argv, i, &missing))) {
    long d;
    if (cli_parse_count(v, 1 << 20, &d) != 0)
      return cli_usage(NULL, "--device needs a device index, not '%s'", v), -1;
    g->device = (int)d;
    return 1;
  }
  if (missing) return cli_usage(NULL, "--device needs a device index"), -1;
  if ((v = option_value("--timeout", argc, argv, i, &missing))) {
    long ms;
    if (cli_parse_count(v, 1L << 30, &ms) != 0)
      return cli_usage(NULL, "--timeout needs milliseconds, not '%s'", v), -1;
    g->timeout_ms = (int)ms;
    return 1;
  }
  if (missing) return cli_usage(NULL, "--timeout needs milliseconds"), -1;
  return 0;
}

/* See cli.h. */
int cli_exit_code(int rc) {
  if (rc == ST_OK) return CLI_OK;
  if (rc == ST_ERR_TIMEOUT) return CLI_TIMEOUT;
  if (rc == ST_ERR_IO) return CLI_NO_CONNECTION;
  return CLI_SERVER_ERROR;
}

/* See cli.h. */
int cli_fail(st_client_t *c, int rc) {
  const char *name = c ? st_client_error_name(c) : "";
  const char *msg = c ? st_client_error(c) : "";
  if (!name || !*name) name = st_err_name(rc);
  if (!msg || !*msg) msg = st_strerror(rc);
  fprintf(stderr, "stcli: %s: %s\n", name, msg);
  return cli_exit_code(rc);
}

/* See cli.h. */
int cli_connect(const cli_t *g, st_client_t **out) {
  char err[512] = "";
  int rc = g->socket ? st_client_connect(g->socket, out, err, sizeof err)
                     : st_client_connect_device(g->base, g->device, out, err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "stcli: %s: %s\n", st_err_name(rc), err[0] ? err : st_strerror(rc));
    return rc == ST_ERR_TIMEOUT ? CLI_TIMEOUT
           : rc == ST_ERR_INVALID_ARGUMENT ? CLI_USAGE
                                           : CLI_NO_CONNECTION;
  }
  st_client_set_timeout(*out, g->timeout_ms);
  return CLI_OK;
}

static const cli_command_t *find_command(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i]->name, name) == 0) return commands[i];
  return NULL;
}

static int run_help(cli_t *g, int argc, char **argv) {
  const char *topic = NULL;
  for (int i = 1; i < argc; i++) {
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(argv[i], "--help") == 0) {
      cli_print_command_help(&help_command, stdout);
      return CLI_OK;
    }
    if (argv[i][0] == '-') return cli_usage("help", "unknown option '%s'", argv[i]);
    if (topic) return cli_usage("help", "help takes one command name");
    topic = argv[i];
  }
  if (!topic) {
    print_main_help(stdout);
    return CLI_OK;
  }
  const cli_command_t *cmd = find_command(topic);
  if (!cmd) return cli_usage(NULL, "unknown command '%s'", topic);
  cli_print_command_help(cmd, stdout);
  return CLI_OK;
}

static const cli_command_t help_command = {
    "help", "help [COMMAND]", "Show the list of commands, or the usage of one.", "", run_help,
};

int main(int argc, char **argv) {
  cli_t g = {.device = 0};
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_main_help(stdout);
      return CLI_OK;
    }
    if (strcmp(a, "--version") == 0) {
      printf("stcli %s (protocol %d)\n", ST_VERSION_STRING, ST_PROTOCOL_VERSION);
      return CLI_OK;
    }
    int r = cli_global_option(&g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r == 0) break;
  }
  if (i >= argc) {
    print_main_help(stderr);
    return CLI_USAGE;
  }
  if (argv[i][0] == '-') return cli_usage(NULL, "unknown option '%s'", argv[i]);
  const cli_command_t *cmd = find_command(argv[i]);
  if (!cmd) return cli_usage(NULL, "unknown command '%s'", argv[i]);
  return cmd->run(&g, argc - i, argv + i);
}

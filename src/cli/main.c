/* stcli: the command table, dispatch and the main help.
 *
 *   stcli [global options] COMMAND [args]
 *
 * Global options may also follow the command. Errors go to stderr as
 * "stcli: NAME: message"; see docs/cli.md for the exit codes.
 */
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
    &cli_release_command, &cli_invalidate_command, &cli_keys_command,
    &cli_get_command,     &cli_delete_command,     &cli_buffers_command,
    &cli_buffer_create_command, &cli_buffer_unlink_command, &cli_handoffs_command,
    &cli_handoff_delete_command, &cli_reload_command,
    &cli_peers_command,   &cli_pull_command,    &cli_replicate_command,
    &cli_replicas_command, &cli_unsubscribe_command,
    &cli_rpc_command,     &cli_watch_command,      &cli_completion_command,
    &help_command,
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void print_main_help(FILE *out) {
  fprintf(out, "usage: stcli [global options] COMMAND [args]\n\n"
               "Talks to a sharedtensor server (stserver) on this host.\n\nCommands:\n");
  /* The names' column is as wide as the longest name. */
  int width = 0;
  for (size_t i = 0; i < NCOMMANDS; i++)
    if ((int)strlen(commands[i]->name) > width) width = (int)strlen(commands[i]->name);
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(out, "  %-*s  %s\n", width, commands[i]->name, commands[i]->summary);
  fprintf(out, "\n%s\nExit codes: 0 ok, 1 the server answered with an error, 2 usage error,\n"
               "3 cannot connect or connection lost, 4 timeout.\n",
          cli_global_help);
}

/* See cli.h. */
const cli_command_t *cli_command_at(size_t i) {
  return i < NCOMMANDS ? commands[i] : NULL;
}

/* "unknown command 'W'", with a "did you mean" among the commands. */
static int unknown_command(const char *word) {
  cli_suggest_t s;
  cli_suggest_init(&s, word);
  for (size_t i = 0; i < NCOMMANDS; i++)
    cli_suggest_add(&s, commands[i]->name, strlen(commands[i]->name));
  return cli_usage(NULL, "unknown command '%s'%s", word, cli_suggest_text(&s));
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
    if (argv[i][0] == '-') return cli_usage_unknown(&help_command, argv[i]);
    if (topic) return cli_usage("help", "help takes one command name");
    topic = argv[i];
  }
  if (!topic) {
    print_main_help(stdout);
    return CLI_OK;
  }
  const cli_command_t *cmd = find_command(topic);
  if (!cmd) return unknown_command(topic);
  cli_print_command_help(cmd, stdout);
  return CLI_OK;
}

static const cli_command_t help_command = {
    "help", "help [COMMAND]", "Show the list of commands, or the usage of one.", "", run_help, "",
};

int main(int argc, char **argv) {
  cli_t g = {.device = 0, .server_uid = ST_SERVER_UID_DEFAULT};
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
  if (argv[i][0] == '-') return cli_usage_unknown(NULL, argv[i]);
  const cli_command_t *cmd = find_command(argv[i]);
  if (!cmd) return unknown_command(argv[i]);
  return cmd->run(&g, argc - i, argv + i);
}

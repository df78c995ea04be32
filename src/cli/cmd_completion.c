/* stcli completion: prints the shell completion script.
 *
 *   source <(stcli completion bash)
 *
 * The script below is the only copy: it completes commands, global and
 * per-command options, option values (--status, files for --socket), and
 * asks the server for endpoint names (`stcli endpoints --names`) and task
 * ids (`stcli tasks --ids`). It uses plain bash (compgen, complete), not
 * the bash-completion package.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The script before and after the line that lists the commands, which
 * is printed from stcli's own command table. */
static const char bash_head[] =
    "# bash completion for stcli (sharedtensor). Enable it in a shell with\n"
    "#   source <(stcli completion bash)\n"
    "# Endpoint names (call, submit, invalidate) and task ids (wait, status,\n"
    "# result, cancel) are asked of the server with `stcli endpoints --names`\n"
    "# and `stcli tasks --ids`, using the socket options already on the line;\n"
    "# when no server answers, they complete to nothing.\n"
    "\n";

static const char bash_body[] =
    "_stcli_globals='--socket --base-path --device --json --timeout --help'\n"
    "\n"
    "# The options of command $1.\n"
    "_stcli_options() {\n"
    "  case $1 in\n"
    "    ping) echo '--count' ;;\n"
    "    endpoints) echo '--names' ;;\n"
    "    call) echo '--args-json --values' ;;\n"
    "    submit) echo '--args-json' ;;\n"
    "    wait) echo '--timeout --values' ;;\n"
    "    result) echo '--values' ;;\n"
    "    tasks) echo '--status --limit --before --ids' ;;\n"
    "    invalidate) echo '--args-json --all' ;;\n"
    "    watch) echo '--interval --count' ;;\n"
    "  esac\n"
    "}\n"
    "\n"
    "# Succeeds when option $1 takes the next word as its value.\n"
    "_stcli_takes_value() {\n"
    "  case $1 in\n"
    "    --socket|--base-path|--device|--timeout) return 0 ;;\n"
    "    --count|-c|--args-json|--status|--interval) return 0 ;;\n"
    "  esac\n"
    "  return 1\n"
    "}\n"
    "\n"
    "# Asks the server: stcli [socket options] ARGS..., errors silenced.\n"
    "_stcli_ask() {\n"
    "  local bin=${COMP_WORDS[0]}\n"
    "  [[ $bin == '~/'* ]] && bin=$HOME/${bin#'~/'}\n"
    "  \"$bin\" \"${_stcli_conn[@]}\" --timeout 2s \"$@\" 2>/dev/null\n"
    "}\n"
    "\n"
    "_stcli() {\n"
    "  local cur=${COMP_WORDS[COMP_CWORD]} prev='' w='' cmd='' npos=0 i\n"
    "  local -a _stcli_conn=()\n"
    "  COMPREPLY=()\n"
    "  (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD-1]}\n"
    "  # Bash splits \"--opt=VALUE\" at '=' into \"--opt\" \"=\" \"VALUE\".\n"
    "  if [[ $cur == '=' ]]; then\n"
    "    cur=''\n"
    "  elif [[ $prev == '=' ]] && (( COMP_CWORD >= 2 )); then\n"
    "    prev=${COMP_WORDS[COMP_CWORD-2]}\n"
    "  fi\n"
    "  # The command word, the socket options, and how many positional words\n"
    "  # follow the command.\n"
    "  for (( i = 1; i < COMP_CWORD; i++ )); do\n"
    "    w=${COMP_WORDS[i]}\n"
    "    if [[ $w == '=' ]]; then\n"
    "      i=$((i + 1))\n"
    "      continue\n"
    "    fi\n"
    "    case $w in\n"
    "      --socket|--base-path|--device)\n"
    "        if [[ ${COMP_WORDS[i+1]} == '=' ]]; then\n"
    "          _stcli_conn+=(\"$w=${COMP_WORDS[i+2]}\")\n"
    "          i=$((i + 2))\n"
    "        else\n"
    "          _stcli_conn+=(\"$w\" \"${COMP_WORDS[i+1]}\")\n"
    "          i=$((i + 1))\n"
    "        fi\n"
    "        continue ;;\n"
    "      --socket=*|--base-path=*|--device=*)\n"
    "        _stcli_conn+=(\"$w\")\n"
    "        continue ;;\n"
    "      -*)\n"
    "        if _stcli_takes_value \"$w\" && [[ ${COMP_WORDS[i+1]} != '=' ]]; then\n"
    "          i=$((i + 1))\n"
    "        fi\n"
    "        continue ;;\n"
    "    esac\n"
    "    if [[ -z $cmd ]]; then\n"
    "      cmd=$w\n"
    "    else\n"
    "      npos=$((npos + 1))\n"
    "    fi\n"
    "  done\n"
    "\n"
    "  case $prev in\n"
    "    --socket|--base-path)\n"
    "      compopt -o filenames 2>/dev/null\n"
    "      COMPREPLY=($(compgen -f -- \"$cur\"))\n"
    "      return 0 ;;\n"
    "    --status)\n"
    "      COMPREPLY=($(compgen -W 'pending running completed failed cancelled' -- \"$cur\"))\n"
    "      return 0 ;;\n"
    "    --device|--timeout|--count|-c|--interval|--args-json)\n"
    "      return 0 ;;\n"
    "  esac\n"
    "  if [[ $cur == -* && -z $cmd ]]; then\n"
    "    COMPREPLY=($(compgen -W \"$_stcli_globals --version\" -- \"$cur\"))\n"
    "    return 0\n"
    "  fi\n"
    "  if [[ $cur == -* ]]; then\n"
    "    COMPREPLY=($(compgen -W \"$(_stcli_options \"$cmd\") $_stcli_globals\" -- \"$cur\"))\n"
    "    return 0\n"
    "  fi\n"
    "  if [[ -z $cmd ]]; then\n"
    "    COMPREPLY=($(compgen -W \"$_stcli_commands\" -- \"$cur\"))\n"
    "    return 0\n"
    "  fi\n"
    "  (( npos > 0 )) && return 0\n"
    "  case $cmd in\n"
    "    call|submit|invalidate)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask endpoints --names)\" -- \"$cur\")) ;;\n"
    "    wait|status|result|cancel)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask tasks --ids)\" -- \"$cur\")) ;;\n"
    "    help)\n"
    "      COMPREPLY=($(compgen -W \"$_stcli_commands\" -- \"$cur\")) ;;\n"
    "    completion)\n"
    "      COMPREPLY=($(compgen -W 'bash' -- \"$cur\")) ;;\n"
    "  esac\n"
    "  return 0\n"
    "}\n"
    "\n"
    "complete -F _stcli stcli\n";

static int run_completion(cli_t *g, int argc, char **argv) {
  const char *pos[1] = {NULL};
  int done;
  int code = cli_parse_plain(g, &cli_completion_command, argc, argv, 1, 1, "a shell name (bash)",
                             pos, &done);
  if (code != CLI_OK || done) return code;
  if (strcmp(pos[0], "bash") != 0)
    return cli_usage("completion", "no completion for '%s' (only bash)", pos[0]);
  fputs(bash_head, stdout);
  printf("_stcli_commands='");
  cli_print_command_names(stdout);
  printf("'\n");
  fputs(bash_body, stdout);
  return fflush(stdout) == 0 ? CLI_OK : CLI_SERVER_ERROR;
}

const cli_command_t cli_completion_command = {
    "completion",
    "completion bash",
    "Print the bash completion script: source <(stcli completion bash).",
    "Completes commands, global and per-command options, --status values,\n"
    "files after --socket and --base-path, endpoint names after call, submit\n"
    "and invalidate, and task ids after wait, status, result and cancel. Names\n"
    "and ids come from the server (stcli endpoints --names, stcli tasks --ids)\n"
    "at the socket the line names; with no server they complete to nothing.\n"
    "Enable it for every shell by adding to ~/.bashrc:\n"
    "  source <(stcli completion bash)\n",
    run_completion,
};

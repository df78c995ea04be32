/* stcli completion: prints the shell completion script.
 *
 *   source <(stcli completion bash)
 *   source <(stcli completion zsh)
 *
 * One completion code for both shells (`body`): it completes commands,
 * global and per-command options (their lists printed from stcli's command
 * table, cli_command_t.options), option values (--status, files for
 * --socket), and asks the server for endpoint names (`stcli endpoints
 * --names`), their parameter names (`stcli endpoints --params NAME`),
 * task ids (`stcli tasks --ids`), keys (`stcli keys --names`), buffer names
 * (`stcli buffers --names`) and object ids (`stcli objects --ids`). bash runs it with plain compgen and
 * complete (no bash-completion package); zsh runs it under its bash
 * emulation (bashcompinit), through the small adapter in `zsh_tail`.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The bash script's head: how to enable it. */
static const char bash_head[] =
    "# bash completion for stcli (sharedtensor). Enable it in a shell with\n"
    "#   source <(stcli completion bash)\n"
    "# Endpoint names (call, submit, invalidate), their parameter names (as\n"
    "# key=, after the endpoint), task ids (wait, status, result, cancel), keys\n"
    "# (get, delete, keys), buffer names (buffer-unlink) and object ids\n"
    "# (release) are asked of the server with `stcli endpoints --names`,\n"
    "# `stcli endpoints --params NAME`, `stcli tasks --ids`, `stcli keys\n"
    "# --names`, `stcli buffers --names` and `stcli objects --ids`, using the\n"
    "# socket options already on the line; when no server answers, they\n"
    "# complete to nothing.\n"
    "\n";

/* The zsh script's head: zsh's bash emulation provides compgen. */
static const char zsh_head[] =
    "# zsh completion for stcli (sharedtensor). Enable it in a shell with\n"
    "#   source <(stcli completion zsh)\n"
    "# It runs the completion code of `stcli completion bash` (below) under\n"
    "# zsh's bash emulation (bashcompinit). Endpoint names (call, submit,\n"
    "# invalidate), their parameter names (as key=, after the endpoint), task\n"
    "# ids (wait, status, result, cancel), keys (get, delete, keys), buffer\n"
    "# names (buffer-unlink) and object ids (release) are asked of the server\n"
    "# with `stcli endpoints --names`, `stcli endpoints --params NAME`, `stcli\n"
    "# tasks --ids`, `stcli keys --names`, `stcli buffers --names` and `stcli\n"
    "# objects --ids`, using the socket options already on the line; when no\n"
    "# server answers, they complete to nothing.\n"
    "\n"
    "(( $+functions[compdef] )) || { autoload -Uz compinit && compinit; }\n"
    "autoload -Uz bashcompinit && bashcompinit\n"
    "\n";

/* The completion code both shells run, after the tables print_tables
 * writes from stcli's command table. */
static const char body[] =
    "# Asks the server: stcli [socket options] ARGS..., errors silenced.\n"
    "_stcli_ask() {\n"
    "  local bin=${COMP_WORDS[0]}\n"
    "  [[ $bin == '~/'* ]] && bin=$HOME/${bin#'~/'}\n"
    "  \"$bin\" \"${_stcli_conn[@]}\" --timeout 2s \"$@\" 2>/dev/null\n"
    "}\n"
    "\n"
    "_stcli() {\n"
    "  local cur=${COMP_WORDS[COMP_CWORD]} prev='' w='' cmd='' ep='' used='' keys='' p\n"
    "  local npos=0 value=0 i\n"
    "  local -a _stcli_conn=()\n"
    "  COMPREPLY=()\n"
    "  (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD-1]}\n"
    "  # Bash splits \"--opt=VALUE\" at '=' into \"--opt\" \"=\" \"VALUE\" (and\n"
    "  # \"key:type=VALUE\" at ':' too); value=1 while completing a VALUE.\n"
    "  if [[ $cur == '=' || $cur == ':' ]]; then\n"
    "    value=1\n"
    "    cur=''\n"
    "  elif [[ $prev == '=' ]] && (( COMP_CWORD >= 2 )); then\n"
    "    value=1\n"
    "    prev=${COMP_WORDS[COMP_CWORD-2]}\n"
    "  elif [[ $prev == ':' ]]; then\n"
    "    value=1\n"
    "  fi\n"
    "  # The command word, the socket options, how many positional words\n"
    "  # follow the command, the first of them (ep) and the keys of the\n"
    "  # others (used).\n"
    "  for (( i = 1; i < COMP_CWORD; i++ )); do\n"
    "    w=${COMP_WORDS[i]}\n"
    "    if [[ $w == '=' || $w == ':' ]]; then\n"
    "      i=$((i + 1))\n"
    "      continue\n"
    "    fi\n"
    "    case $w in\n"
    "      --socket|--base-path|--device|--server-uid)\n"
    "        if [[ ${COMP_WORDS[i+1]} == '=' ]]; then\n"
    "          _stcli_conn+=(\"$w=${COMP_WORDS[i+2]}\")\n"
    "          i=$((i + 2))\n"
    "        else\n"
    "          _stcli_conn+=(\"$w\" \"${COMP_WORDS[i+1]}\")\n"
    "          i=$((i + 1))\n"
    "        fi\n"
    "        continue ;;\n"
    "      --socket=*|--base-path=*|--device=*|--server-uid=*)\n"
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
    "      continue\n"
    "    fi\n"
    "    npos=$((npos + 1))\n"
    "    if (( npos == 1 )); then\n"
    "      ep=$w\n"
    "    else\n"
    "      w=${w%%=*}\n"
    "      used+=\" ${w%%:*}\"\n"
    "    fi\n"
    "  done\n"
    "\n"
    "  case $prev in\n"
    "    --socket|--base-path)\n"
    "      _stcli_opt filenames\n"
    "      COMPREPLY=($(compgen -f -- \"$cur\"))\n"
    "      return 0 ;;\n"
    "    --status)\n"
    "      COMPREPLY=($(compgen -W 'pending running completed failed cancelled' -- \"$cur\"))\n"
    "      return 0 ;;\n"
    "    --params)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask endpoints --names)\" -- \"$cur\"))\n"
    "      return 0 ;;\n"
    "  esac\n"
    "  # Any other option's value, or a key=VALUE's: nothing to offer.\n"
    "  (( value )) && return 0\n"
    "  [[ $prev == -* ]] && _stcli_takes_value \"$prev\" && return 0\n"
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
    "  # After the endpoint name: its parameters not on the line yet, as key=.\n"
    "  if (( npos > 0 )); then\n"
    "    [[ $cmd == call || $cmd == submit || $cmd == invalidate ]] || return 0\n"
    "    for p in $(_stcli_ask endpoints --params \"$ep\"); do\n"
    "      [[ \" $used \" == *\" $p \"* ]] || keys+=\" $p=\"\n"
    "    done\n"
    "    COMPREPLY=($(compgen -W \"$keys\" -- \"$cur\"))\n"
    "    (( ${#COMPREPLY[@]} )) && _stcli_opt nospace\n"
    "    return 0\n"
    "  fi\n"
    "  case $cmd in\n"
    "    call|submit|invalidate)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask endpoints --names)\" -- \"$cur\")) ;;\n"
    "    wait|status|result|cancel)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask tasks --ids)\" -- \"$cur\")) ;;\n"
    "    get|delete|keys)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask keys --names)\" -- \"$cur\")) ;;\n"
    "    buffer-unlink)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask buffers --names)\" -- \"$cur\")) ;;\n"
    "    release)\n"
    "      COMPREPLY=($(compgen -W \"$(_stcli_ask objects --ids)\" -- \"$cur\")) ;;\n"
    "    help)\n"
    "      COMPREPLY=($(compgen -W \"$_stcli_commands\" -- \"$cur\")) ;;\n"
    "    completion)\n"
    "      COMPREPLY=($(compgen -W 'bash zsh' -- \"$cur\")) ;;\n"
    "  esac\n"
    "  return 0\n"
    "}\n"
    "\n";

/* bash: completion options through compopt. */
static const char bash_tail[] =
    "# Sets completion option $1 (nospace, filenames) for this completion.\n"
    "_stcli_opt() { compopt -o \"$1\" 2>/dev/null; }\n"
    "\n"
    "complete -F _stcli stcli\n";

/* zsh: runs _stcli as bash would and hands COMPREPLY to compadd. */
static const char zsh_tail[] =
    "# Records completion option $1 (nospace, filenames) for _stcli_zsh.\n"
    "_stcli_opt() { _stcli_zopts+=(\"$1\"); }\n"
    "\n"
    "# zsh keeps \"--opt=VALUE\" and \"key=VALUE\" one word: the word being\n"
    "# completed is split at '=' as bash splits it, and the part before the\n"
    "# '=' stays on the line (compset). _stcli runs as compgen does (sh\n"
    "# emulation: arrays from 0, words split); names ending in '=' take no\n"
    "# space after them, file names come from _files.\n"
    "_stcli_zsh() {\n"
    "  local -a COMP_WORDS COMPREPLY _stcli_zopts\n"
    "  local COMP_CWORD\n"
    "  COMP_WORDS=(\"${(@)words[1,CURRENT-1]}\")\n"
    "  if [[ $PREFIX == *=* ]]; then\n"
    "    COMP_WORDS+=(\"${PREFIX%%=*}\" = \"${PREFIX#*=}\")\n"
    "    compset -P 1 '*='\n"
    "  else\n"
    "    COMP_WORDS+=(\"$PREFIX\")\n"
    "  fi\n"
    "  COMP_CWORD=$(( ${#COMP_WORDS} - 1 ))\n"
    "  () { emulate -L sh; setopt kshglob noshglob braceexpand; _stcli; }\n"
    "  if (( ${_stcli_zopts[(I)filenames]} )); then\n"
    "    _files\n"
    "  elif (( ${_stcli_zopts[(I)nospace]} )); then\n"
    "    compadd -S '' -a COMPREPLY\n"
    "  else\n"
    "    compadd -a COMPREPLY\n"
    "  fi\n"
    "}\n"
    "\n"
    "compdef _stcli_zsh stcli\n";

/* Options list k: the global options (0), then each command's. NULL
 * past the last command. */
static const char *options_list(size_t k) {
  const cli_command_t *cmd = k ? cli_command_at(k - 1) : NULL;
  return k == 0 ? cli_global_options : cmd ? cmd->options : NULL;
}

/* 1 when an options list before list k has the word word[0..len). */
static int listed_before(size_t k, const char *word, size_t len) {
  for (size_t j = 0; j < k; j++) {
    for (const char *at = options_list(j); *at; at += strspn(at, " ")) {
      size_t n = strcspn(at, " ");
      if (n == len && memcmp(at, word, len) == 0) return 1;
      at += n;
    }
  }
  return 0;
}

/* Prints the words of options list k without their '=': all of them, or
 * (values) those that take a value and no earlier list has; `sep` before
 * each but the first printed, *n counting them. */
static void print_options(size_t k, int values, char sep, int *n) {
  const char *list = options_list(k);
  while (*list) {
    size_t len = strcspn(list, " ");
    int takes = len > 1 && list[len - 1] == '=';
    int show = values ? takes && !listed_before(k, list, len) : len > 0;
    if (show) {
      if ((*n)++) putchar(sep);
      printf("%.*s", (int)(takes ? len - 1 : len), list);
    }
    list += len;
    list += strspn(list, " ");
  }
}

/* The tables the body reads, from stcli's command table: the commands,
 * the global options, each command's options and the options that take a
 * value. */
static void print_tables(void) {
  const cli_command_t *cmd;
  int n = 0;
  printf("_stcli_commands='");
  for (size_t i = 0; (cmd = cli_command_at(i)); i++) printf("%s%s", i ? " " : "", cmd->name);
  printf("'\n_stcli_globals='");
  print_options(0, 0, ' ', &n);
  printf("'\n\n# The options of command $1.\n_stcli_options() {\n  case $1 in\n");
  for (size_t i = 0; (cmd = cli_command_at(i)); i++) {
    if (!*cmd->options) continue;
    printf("    %s) echo '", cmd->name);
    n = 0;
    print_options(i + 1, 0, ' ', &n);
    printf("' ;;\n");
  }
  printf("  esac\n}\n\n# Succeeds when option $1 takes the next word as its value.\n"
         "_stcli_takes_value() {\n  case $1 in\n    ");
  n = 0;
  for (size_t k = 0; options_list(k); k++) print_options(k, 1, '|', &n);
  printf(") return 0 ;;\n  esac\n  return 1\n}\n\n");
}

static int run_completion(cli_t *g, int argc, char **argv) {
  const char *pos[1] = {NULL};
  int done;
  int code = cli_parse_plain(g, &cli_completion_command, argc, argv, 1, 1,
                             "a shell name (bash or zsh)", pos, &done);
  if (code != CLI_OK || done) return code;
  int zsh = strcmp(pos[0], "zsh") == 0;
  if (!zsh && strcmp(pos[0], "bash") != 0)
    return cli_usage("completion", "no completion for '%s' (bash or zsh)", pos[0]);
  fputs(zsh ? zsh_head : bash_head, stdout);
  print_tables();
  fputs(body, stdout);
  fputs(zsh ? zsh_tail : bash_tail, stdout);
  return fflush(stdout) == 0 ? CLI_OK : CLI_SERVER_ERROR;
}

const cli_command_t cli_completion_command = {
    "completion",
    "completion bash|zsh",
    "Print the shell completion script: source <(stcli completion bash).",
    "Completes commands, global and per-command options, --status values,\n"
    "files after --socket and --base-path, endpoint names after call, submit\n"
    "and invalidate, the endpoint's parameter names (as key=) after the name,\n"
    "task ids after wait, status, result and cancel, keys after get, delete\n"
    "and keys, buffer names after buffer-unlink and object ids after release.\n"
    "Names and ids come from the server (stcli endpoints --names, stcli\n"
    "endpoints --params NAME, stcli tasks --ids, stcli keys --names, stcli\n"
    "buffers --names, stcli objects --ids) at the socket the line names; with\n"
    "no server they complete to nothing. Enable it for every shell by adding to ~/.bashrc:\n"
    "  source <(stcli completion bash)\n"
    "or to ~/.zshrc (after compinit, which it runs when it has not run):\n"
    "  source <(stcli completion zsh)\n",
    run_completion,
    "",
};

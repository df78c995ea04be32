/* stcli rpc: any method of docs/protocol.md by name, with key=value
 * parameters, so that every method (one without a command of its own
 * included) is reachable from the shell. */
#include "cli.h"

static int run_rpc(cli_t *g, int argc, char **argv) {
  cli_call_args_t ca;
  st_client_t *c;
  int code = cli_call_connect(g, &cli_rpc_command, argc, argv, CLI_ARGS_VALUES, &ca, &c);
  if (code != CLI_OK || !c) return code;
  st_result_t *r = NULL;
  int rc = st_client_rpc(c, ca.endpoint, ca.args, &r);
  st_args_free(ca.args);
  if (rc != ST_OK) {
    code = cli_fail(c, rc);
    st_client_close(c);
    return code;
  }
  st_client_close(c); /* the result outlives the connection */
  code = cli_print_result(g, r, ca.nvalues);
  st_result_free(r);
  return code;
}

const cli_command_t cli_rpc_command = {
    "rpc",
    "rpc METHOD [key=value ...] [--args-json JSON] [--values[=N]]",
    "Send any method of the protocol with named parameters and print the reply.",
    "METHOD is a method of docs/protocol.md (info, keys, tasks, ...), also one\n"
    "that has no command of its own. Parameters are key=value words typed as\n"
    "for `call` (key:int=, key:float=, key:bool=, key:str=, key:json=);\n"
    "--args-json takes a JSON object of them. The reply prints as `call`\n"
    "prints a result: its tensors, then its value as JSON (--json: the whole\n"
    "reply as JSON). A method the server does not\n"
    "know, or a parameter it refuses, is the server's error (exit code 1).\n\n"
    "Options:\n"
    "  --args-json JSON  parameters as one JSON object\n"
    "  --values[=N]      also print the first N values of each tensor (default 8),\n"
    "                    as `call --values` does\n",
    run_rpc,
    "--args-json= --values",
};

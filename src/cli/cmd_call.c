/* stcli call and rpc: call an endpoint, or send any method by name, and
 * describe what it returned. */
#include <stdio.h>

#include "cli.h"

/* What `call` and `rpc` send: the request named by ca->endpoint. */
typedef int (*send_fn)(st_client_t *c, const cli_call_args_t *ca, st_result_t **r);

/* Parses cmd's arguments, connects, sends, and prints the result as `call`
 * describes it. Returns the exit code. */
static int send_and_print(cli_t *g, const cli_command_t *cmd, int argc, char **argv,
                          unsigned flags, send_fn send) {
  cli_call_args_t ca;
  st_client_t *c;
  int code = cli_call_connect(g, cmd, argc, argv, flags, &ca, &c);
  if (code != CLI_OK || !c) return code;
  st_result_t *r = NULL;
  int rc = send(c, &ca, &r);
  st_args_free(ca.args);
  if (rc != ST_OK) {
    code = cli_fail_endpoint(c, rc, ca.endpoint);
    st_client_close(c);
    return code;
  }
  st_client_close(c); /* the result outlives the connection */
  code = cli_print_result(g, r, ca.nvalues);
  st_result_free(r);
  return code;
}

static int send_call(st_client_t *c, const cli_call_args_t *ca, st_result_t **r) {
  return ca->view ? st_client_call_view(c, ca->endpoint, ca->args, 0, ca->view, r)
                  : st_client_call(c, ca->endpoint, ca->args, r);
}

static int run_call(cli_t *g, int argc, char **argv) {
  return send_and_print(g, &cli_call_command, argc, argv, CLI_ARGS_VALUES | CLI_ARGS_VIEW,
                        send_call);
}

static int send_rpc(st_client_t *c, const cli_call_args_t *ca, st_result_t **r) {
  return st_client_rpc(c, ca->endpoint, ca->args, r);
}

static int run_rpc(cli_t *g, int argc, char **argv) {
  return send_and_print(g, &cli_rpc_command, argc, argv, CLI_ARGS_VALUES, send_rpc);
}

const cli_command_t cli_call_command = {
    "call",
    "call NAME [key=value ...] [--args-json JSON] [--view SPEC] [--values[=N]]",
    "Call an endpoint and describe the tensors and values it returns.",
    "Arguments are key=value words, typed by their text: n=5 is an integer,\n"
    "x=1.5 or x=1e3 a float, b=true/false a boolean, v=null nil, anything else a\n"
    "string. Force a type with key:int=, key:float=, key:bool=, key:str= or\n"
    "key:json= (any JSON value). --args-json takes a JSON object of arguments;\n"
    "later arguments override earlier ones. Use -- before words that begin\n"
    "with '--'.\n\n"
    "Each tensor prints as: name  dtype  [shape]  device  bytes, the device\n"
    "being cpu or cuda:N (GPU-uuid), N its ordinal in this process. A bare tensor\n"
    "is named (tensor); module and nested tensors by dotted paths (m.weight).\n"
    "A value that is not a single tensor or module is printed as JSON too.\n"
    "A managed or cached endpoint's reply names a server object, printed as\n"
    "  object <id> (lease|no lease, refcount N, cache key K)\n"
    "(the lease belongs to stcli's connection and ends when stcli exits).\n\n"
    "Options:\n"
    "  --args-json JSON  arguments as one JSON object\n"
    "  --view SPEC       the result seen through a view spec (docs/views.md):\n"
    "                    e.g. 'w:shard(0,1,4)', '*:transpose(0,1)|contiguous'\n"
    "  --values[=N]      also print the first N values (default 8), the sum of\n"
    "                    all elements and an FNV-1a 64 hash of their bytes in\n"
    "                    row-major order (CUDA tensors are copied to the host)\n"
    "  --json            print the value as JSON; with --values or a server\n"
    "                    object, print {\"value\": ..., \"tensors\": [{name,\n"
    "                    values, sum, fnv1a64}], \"object\": {...}} (each member\n"
    "                    only when it applies)\n",
    run_call,
    "--args-json= --view= --values",
};

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

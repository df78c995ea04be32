/* stcli call: call an endpoint and describe what it returned. */
#include <stdio.h>

#include "cli.h"

static int run_call(cli_t *g, int argc, char **argv) {
  cli_call_args_t ca;
  st_client_t *c;
  int code = cli_call_connect(g, &cli_call_command, argc, argv, CLI_ARGS_VALUES | CLI_ARGS_VIEW,
                              &ca, &c);
  if (code != CLI_OK || !c) return code;
  st_result_t *r = NULL;
  int rc = ca.view ? st_client_call_view(c, ca.endpoint, ca.args, 0, ca.view, &r)
                   : st_client_call(c, ca.endpoint, ca.args, &r);
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

/* stcli call: call an endpoint and describe what it returned. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define DEFAULT_VALUES 8

static const char *display_name(const st_tensor_t *t) { return *t->name ? t->name : "(tensor)"; }

/* "name  dtype  [shape]  device  N bytes", columns aligned over all. */
static void print_tensors(const st_result_t *r, long nvalues) {
  size_t n = st_result_tensor_count(r), wname = 0, wdtype = 0, wshape = 0;
  char shape[256], dev[32];
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    cli_format_shape(t, shape, sizeof shape);
    const char *dt = st_dtype_name(t->dtype);
    if (strlen(display_name(t)) > wname) wname = strlen(display_name(t));
    if (dt && strlen(dt) > wdtype) wdtype = strlen(dt);
    if (strlen(shape) > wshape) wshape = strlen(shape);
  }
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    cli_format_shape(t, shape, sizeof shape);
    printf("%-*s  %-*s  %-*s  %s  %zu bytes\n", (int)wname, display_name(t), (int)wdtype,
           st_dtype_name(t->dtype), (int)wshape, shape, cli_device_name(t, dev, sizeof dev),
           t->nbytes);
    if (nvalues < 0) continue;
    if (t->device != ST_DEVICE_CPU) {
      printf("  values: (in device memory, not shown)\n");
      continue;
    }
    printf("  values:");
    int64_t shown = t->numel < nvalues ? t->numel : nvalues;
    for (int64_t k = 0; k < shown; k++) {
      char buf[64];
      cli_format_element(t, k, buf, sizeof buf);
      printf(" %s", buf);
    }
    if (t->numel > shown) printf(" ... (%" PRId64 " more)", t->numel - shown);
    printf("\n");
    double sum;
    uint64_t fnv;
    cli_checksum(t, &sum, &fnv);
    char sbuf[64];
    cli_format_json_number(sum, sbuf, sizeof sbuf);
    printf("  sum: %s  fnv1a64: 0x%016" PRIx64 "\n", sbuf, fnv);
  }
}

/* --json --values: {"value": ..., "tensors": [{name, values, sum, fnv1a64}]} */
static int print_json_with_values(const st_result_t *r, long nvalues) {
  char *value = st_value_json(st_result_value(r), 1);
  if (!value) return cli_print_json_owned(NULL);
  printf("{\n\"value\": %s,\n\"tensors\": [", value);
  free(value);
  size_t n = st_result_tensor_count(r);
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    printf("%s\n  {\"name\": ", i ? "," : "");
    cli_print_json_string(stdout, t->name);
    if (t->device != ST_DEVICE_CPU) {
      printf(", \"values\": null, \"sum\": null, \"fnv1a64\": null}");
      continue;
    }
    printf(", \"values\": [");
    int64_t shown = t->numel < nvalues ? t->numel : nvalues;
    for (int64_t k = 0; k < shown; k++) {
      char buf[64];
      cli_format_json_number(st_tensor_get(t, k), buf, sizeof buf);
      printf("%s%s", k ? ", " : "", buf);
    }
    double sum;
    uint64_t fnv;
    cli_checksum(t, &sum, &fnv);
    char sbuf[64];
    cli_format_json_number(sum, sbuf, sizeof sbuf);
    printf("], \"sum\": %s, \"fnv1a64\": \"0x%016" PRIx64 "\"}", sbuf, fnv);
  }
  printf("%s]\n}\n", n ? "\n" : "");
  return CLI_OK;
}

static int run_call(cli_t *g, int argc, char **argv) {
  const char *endpoint = NULL;
  long nvalues = -1;
  int rest = 0;
  st_args_t *args = st_args_new();
  if (!args) {
    fprintf(stderr, "stcli: OUT_OF_MEMORY: cannot build the arguments\n");
    return CLI_SERVER_ERROR;
  }
  int code = CLI_OK;
  char err[256];
  for (int i = 1; i < argc && code == CLI_OK; i++) {
    const char *a = argv[i];
    if (!rest && a[0] == '-' && a[1] == '-') {
      int r = cli_global_option(g, argc, argv, &i);
      if (r < 0) {
        code = CLI_USAGE;
        break;
      }
      if (r > 0) continue;
      if (strcmp(a, "--") == 0) {
        rest = 1;
      } else if (strcmp(a, "--help") == 0) {
        cli_print_command_help(&cli_call_command, stdout);
        st_args_free(args);
        return CLI_OK;
      } else if (strcmp(a, "--values") == 0) {
        nvalues = DEFAULT_VALUES;
      } else if (strncmp(a, "--values=", 9) == 0) {
        if (cli_parse_count(a + 9, 1L << 40, &nvalues) != 0)
          code = cli_usage("call", "--values=N needs a count, not '%s'", a + 9);
      } else if (strcmp(a, "--args-json") == 0 || strncmp(a, "--args-json=", 12) == 0) {
        const char *json = a[11] == '=' ? a + 12 : (i + 1 < argc ? argv[++i] : NULL);
        if (!json) {
          code = cli_usage("call", "--args-json needs a JSON object");
        } else if (st_args_parse_json(args, json, err, sizeof err) != ST_OK) {
          fprintf(stderr, "stcli: INVALID_ARGUMENT: --args-json: %s\n", err);
          code = CLI_USAGE;
        }
      } else {
        code = cli_usage("call", "unknown option '%s'", a);
      }
      continue;
    }
    if (!endpoint) {
      endpoint = a;
      continue;
    }
    int rc = st_args_parse_kv(args, a, err, sizeof err);
    if (rc == ST_ERR_INVALID_ARGUMENT) {
      fprintf(stderr, "stcli: INVALID_ARGUMENT: %s\n", err);
      code = CLI_USAGE;
    } else if (rc != ST_OK) {
      fprintf(stderr, "stcli: %s: %s\n", st_err_name(rc), st_strerror(rc));
      code = CLI_SERVER_ERROR;
    }
  }
  if (code == CLI_OK && !endpoint) code = cli_usage("call", "call needs an endpoint name");
  if (code != CLI_OK) {
    st_args_free(args);
    return code;
  }

  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) {
    st_args_free(args);
    return code;
  }
  st_result_t *r = NULL;
  int rc = st_client_call(c, endpoint, args, &r);
  st_args_free(args);
  if (rc != ST_OK) {
    code = cli_fail(c, rc);
    st_client_close(c);
    return code;
  }
  st_client_close(c); /* the result outlives the connection */
  const st_value_t *v = st_result_value(r);
  if (g->json) {
    code = nvalues >= 0 ? print_json_with_values(r, nvalues)
                        : cli_print_json_owned(st_value_json(v, 1));
  } else {
    print_tensors(r, nvalues);
    if (v->kind != ST_VALUE_TENSOR && v->kind != ST_VALUE_MODULE)
      code = cli_print_json_owned(st_value_json(v, 1));
  }
  st_result_free(r);
  return code;
}

const cli_command_t cli_call_command = {
    "call",
    "call NAME [key=value ...] [--args-json JSON] [--values[=N]]",
    "Call an endpoint and describe the tensors and values it returns.",
    "Arguments are key=value words, typed by their text: n=5 is an integer,\n"
    "x=1.5 or x=1e3 a float, b=true/false a boolean, v=null nil, anything else a\n"
    "string. Force a type with key:int=, key:float=, key:bool=, key:str= or\n"
    "key:json= (any JSON value). --args-json takes a JSON object of arguments;\n"
    "later arguments override earlier ones. Use -- before words that begin\n"
    "with '--'.\n\n"
    "Each tensor prints as: name  dtype  [shape]  device  bytes. A bare tensor\n"
    "is named (tensor); module and nested tensors by dotted paths (m.weight).\n"
    "A value that is not a single tensor or module is printed as JSON too.\n\n"
    "Options:\n"
    "  --args-json JSON  arguments as one JSON object\n"
    "  --values[=N]      also print the first N values (default 8), the sum of\n"
    "                    all elements and an FNV-1a 64 hash of their bytes in\n"
    "                    row-major order\n"
    "  --json            print the value as JSON; with --values, print\n"
    "                    {\"value\": ..., \"tensors\": [{name, values, sum, fnv1a64}]}\n",
    run_call,
};

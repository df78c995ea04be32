/* stcli: what `call`, `result` and `wait` share: reading "NAME key=value
 * ... --args-json JSON" command lines, and printing a call-like result
 * (its tensors, optional values and checksums, its value as JSON, and the
 * server object a managed or cached endpoint produced). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The name a key put from Python gives a lone tensor: the key holds the map
 * {"__tensor__": t} (docs/python.md, "Published keys"). */
#define LONE_TENSOR "__tensor__"

static const char *display_name(const st_tensor_t *t) {
  return *t->name && strcmp(t->name, LONE_TENSOR) != 0 ? t->name : "(tensor)";
}

/* A lone tensor's map {"__tensor__": t} as the lone tensor it stands for,
 * unnamed, as `call` shows one: *tv and *t (the caller's storage) are
 * filled and tv returned. Any other value: v itself. */
static const st_value_t *unwrap_lone(const st_value_t *v, st_value_t *tv, st_tensor_t *t) {
  if (v->kind != ST_VALUE_MAP || v->as.map.len != 1) return v;
  const st_value_t *k = &v->as.map.keys[0], *m = &v->as.map.values[0];
  if (k->kind != ST_VALUE_STRING || k->as.str.len != strlen(LONE_TENSOR) ||
      memcmp(k->as.str.ptr, LONE_TENSOR, k->as.str.len) != 0 || m->kind != ST_VALUE_TENSOR)
    return v;
  *t = *m->as.tensor;
  t->name = "";
  memset(tv, 0, sizeof *tv);
  tv->kind = ST_VALUE_TENSOR;
  tv->as.tensor = t;
  return tv;
}

typedef struct values_out {
  st_dtype_t dtype;
  int json;
} values_out_t;

/* Prints " v0 v1 ..." (text) or "v0, v1, ..." (JSON numbers). */
static void print_values_chunk(void *ud, const void *base, int64_t first, int64_t count) {
  const values_out_t *o = ud;
  for (int64_t k = 0; k < count; k++) {
    char buf[64];
    if (o->json) {
      cli_format_json_number(st_dtype_load(o->dtype, base, (size_t)k), buf, sizeof buf);
      printf("%s%s", first + k ? ", " : "", buf);
    } else {
      cli_format_element(o->dtype, base, k, buf, sizeof buf);
      printf(" %s", buf);
    }
  }
}

/* A tensor's values could not be read (a CUDA copy failed). */
static void values_failed(const st_tensor_t *t, int rc) {
  fprintf(stderr, "stcli: %s: cannot read the values of '%s' on %s: %s\n", st_err_name(rc),
          display_name(t), t->device == ST_DEVICE_CUDA ? "the GPU" : "the host",
          st_strerror(rc));
}

/* Prints the first nvalues values of t (as text, or as JSON numbers when
 * json; text adds "... (N more)" and ends the line), then the checksum of
 * every value (the sum as a JSON number, the FNV-1a of the bytes): text as
 * a line "  sum: S  fnv1a64: 0x...", JSON as the end of the tensor's entry
 * `], "sum": S, "fnv1a64": "0x..."}` (both null when the values cannot be
 * read). ST_OK, or the failure (reported). */
static int print_values(const st_tensor_t *t, long nvalues, int json) {
  int64_t shown = t->numel < nvalues ? t->numel : nvalues;
  values_out_t o = {t->dtype, json};
  int rc = cli_each_chunk(t, shown, print_values_chunk, &o);
  if (!json && nvalues > 0) {
    if (rc == ST_OK && t->numel > shown) printf(" ... (%" PRId64 " more)", t->numel - shown);
    printf("\n");
  }
  double s;
  uint64_t fnv;
  if (rc == ST_OK) rc = cli_checksum(t, &s, &fnv);
  if (rc != ST_OK) {
    values_failed(t, rc);
    if (json) printf("], \"sum\": null, \"fnv1a64\": null}");
    return rc;
  }
  char sum[64];
  cli_format_json_number(s, sum, sizeof sum);
  if (json)
    printf("], \"sum\": %s, \"fnv1a64\": \"0x%016" PRIx64 "\"}", sum, fnv);
  else
    printf("  sum: %s  fnv1a64: 0x%016" PRIx64 "\n", sum, fnv);
  return ST_OK;
}

/* "name  dtype  [shape]  device  N bytes", columns aligned over all.
 * Returns the exit code (a value that could not be read fails). */
static int print_tensors(const st_result_t *r, long nvalues) {
  size_t n = st_result_tensor_count(r), wname = 0, wdtype = 0, wshape = 0, wdev = 0;
  char shape[256], dev[96];
  int code = CLI_OK;
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    cli_format_shape(t, shape, sizeof shape);
    const char *dt = st_dtype_name(t->dtype);
    if (strlen(display_name(t)) > wname) wname = strlen(display_name(t));
    if (dt && strlen(dt) > wdtype) wdtype = strlen(dt);
    if (strlen(shape) > wshape) wshape = strlen(shape);
    if (strlen(cli_device_name(t, dev, sizeof dev)) > wdev) wdev = strlen(dev);
  }
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    cli_format_shape(t, shape, sizeof shape);
    printf("%-*s  %-*s  %-*s  %-*s  %zu bytes\n", (int)wname, display_name(t), (int)wdtype,
           st_dtype_name(t->dtype), (int)wshape, shape, (int)wdev,
           cli_device_name(t, dev, sizeof dev), t->nbytes);
    if (nvalues < 0) continue;
    if (nvalues > 0) printf("  values:");   /* --values=0: the checksums only */
    if (print_values(t, nvalues, 0) != ST_OK) code = CLI_SERVER_ERROR;
  }
  return code;
}

/* The "tensors" member of --json --values: [{name, values, sum, fnv1a64}].
 * Returns the exit code. */
static int print_json_tensor_values(const st_result_t *r, long nvalues) {
  size_t n = st_result_tensor_count(r);
  int code = CLI_OK;
  printf("[");
  for (size_t i = 0; i < n; i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    printf("%s\n    {\"name\": ", i ? "," : "");
    cli_print_json_string(stdout, strcmp(t->name, LONE_TENSOR) ? t->name : "");
    printf(", \"values\": [");
    if (print_values(t, nvalues, 1) != ST_OK) code = CLI_SERVER_ERROR;
  }
  printf("%s]", n ? "\n  " : "");
  return code;
}

/* The object as one JSON line. */
static void print_json_object(const st_object_info_t *o) {
  printf("{\"id\": %" PRIu64 ", \"server_id\": ", o->id);
  cli_print_json_string(stdout, o->server_id);
  printf(", \"cache_key\": ");
  cli_print_json_string(stdout, o->cache_key);
  printf(", \"cached\": %s, \"managed\": %s, \"lease\": %s, \"refcount\": %" PRId64
         ", \"bytes\": %" PRIu64 ", \"device\": ",
         o->cached ? "true" : "false", o->managed ? "true" : "false",
         o->lease ? "true" : "false", o->refcount, o->bytes);
  cli_print_json_string(stdout, o->device);
  printf("}");
}

/* "object 12 (lease, refcount 1, cache key lin:4)"; a singleflight
 * endpoint's object has a key but is not cached. */
static void print_object_line(const st_object_info_t *o) {
  printf("object %" PRIu64 " (%s, refcount %" PRId64, o->id, o->lease ? "lease" : "no lease",
         o->refcount);
  if (o->cached)
    printf(", cache key %s", *o->cache_key ? o->cache_key : "-");
  else if (*o->cache_key)
    printf(", key %s, not cached", o->cache_key); /* singleflight only */
  printf(")\n");
}

/* See cli.h. */
int cli_print_result(const cli_t *g, const st_result_t *r, long nvalues) {
  st_value_t lone;
  st_tensor_t lone_tensor;
  const st_value_t *v = unwrap_lone(st_result_value(r), &lone, &lone_tensor);
  st_object_info_t obj;
  int has_obj = st_result_object(r, &obj) == ST_OK;
  if (!g->json) {
    int code = print_tensors(r, nvalues);
    if (v->kind != ST_VALUE_TENSOR && v->kind != ST_VALUE_MODULE) {
      int c2 = cli_print_json_owned(st_value_json(v, 1));
      if (code == CLI_OK) code = c2;
    }
    if (has_obj) print_object_line(&obj);
    return code;
  }
  if (nvalues < 0 && !has_obj) return cli_print_json_owned(st_value_json(v, 1));
  char *value = st_value_json(v, 1);
  if (!value) return cli_print_json_owned(NULL);
  printf("{\n  \"value\": ");
  cli_print_json_nested(value);
  free(value);
  int code = CLI_OK;
  if (nvalues >= 0) {
    printf(",\n  \"tensors\": ");
    code = print_json_tensor_values(r, nvalues);
  }
  if (has_obj) {
    printf(",\n  \"object\": ");
    print_json_object(&obj);
  }
  printf("\n}\n");
  return code;
}

/* See cli.h. */
int cli_parse_call_args(cli_t *g, const cli_command_t *cmd, int argc, char **argv,
                        unsigned flags, cli_call_args_t *out) {
  memset(out, 0, sizeof *out);
  out->nvalues = -1;
  out->args = st_args_new();
  if (!out->args) {
    fprintf(stderr, "stcli: OUT_OF_MEMORY: cannot build the arguments\n");
    return CLI_SERVER_ERROR;
  }
  int rest = 0, code = CLI_OK;
  char err[256];
  for (int i = 1; i < argc && code == CLI_OK; i++) {
    const char *a = argv[i], *json;
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
        cli_print_command_help(cmd, stdout);
        out->help = 1;
        return CLI_OK;
      } else if ((flags & CLI_ARGS_VALUES) && strcmp(a, "--values") == 0) {
        out->nvalues = CLI_DEFAULT_VALUES;
      } else if ((flags & CLI_ARGS_VALUES) && strncmp(a, "--values=", 9) == 0) {
        if (cli_parse_count(a + 9, 1L << 40, &out->nvalues) != 0)
          code = cli_usage(cmd->name, "--values=N needs a count, not '%s'", a + 9);
      } else if ((flags & CLI_ARGS_ALL) && strcmp(a, "--all") == 0) {
        out->all = 1;
      } else if ((flags & CLI_ARGS_VIEW) && cli_option("--view", argc, argv, &i, &out->view)) {
        if (!out->view) code = cli_usage(cmd->name, "--view needs a view spec");
      } else if (cli_option("--args-json", argc, argv, &i, &json)) {
        if (!json) {
          code = cli_usage(cmd->name, "--args-json needs a JSON object");
        } else if (st_args_parse_json(out->args, json, err, sizeof err) != ST_OK) {
          fprintf(stderr, "stcli: INVALID_ARGUMENT: --args-json: %s\n", err);
          code = CLI_USAGE;
        } else {
          out->nargs++;
        }
      } else {
        code = cli_usage_unknown(cmd, a);
      }
      continue;
    }
    if (!out->endpoint) {
      out->endpoint = a;
      continue;
    }
    int rc = st_args_parse_kv(out->args, a, err, sizeof err);
    if (rc == ST_ERR_INVALID_ARGUMENT) {
      fprintf(stderr, "stcli: INVALID_ARGUMENT: %s\n", err);
      code = CLI_USAGE;
    } else if (rc != ST_OK) {
      fprintf(stderr, "stcli: %s: %s\n", st_err_name(rc), st_strerror(rc));
      code = CLI_SERVER_ERROR;
    } else {
      out->nargs++;
    }
  }
  if (code == CLI_OK && !out->endpoint)
    code = cli_usage(cmd->name, "%s needs an endpoint name", cmd->name);
  if (code != CLI_OK) {
    st_args_free(out->args);
    out->args = NULL;
  }
  return code;
}

/* See cli.h. */
int cli_call_connect(cli_t *g, const cli_command_t *cmd, int argc, char **argv, unsigned flags,
                     cli_call_args_t *out, st_client_t **c) {
  *c = NULL;
  int code = cli_parse_call_args(g, cmd, argc, argv, flags, out);
  if (code != CLI_OK || out->help) {
    st_args_free(out->args);
    out->args = NULL;
    return code;
  }
  code = cli_connect(g, c);
  if (code != CLI_OK) {
    *c = NULL;
    st_args_free(out->args);
    out->args = NULL;
  }
  return code;
}

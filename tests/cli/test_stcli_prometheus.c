/* `stcli stats --prometheus` (docs/cli.md; docs/operations.md,
 * "Monitoring"): after a known workload its output parses with a real
 * Prometheus text-format parser (prometheus_client's
 * text_string_to_metric_families, run by python3), with the families,
 * types and values the workload implies; option errors are usage errors.
 * Skipped (77) when no python3 with prometheus_client is installed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"

static stt_server_t srv;
static const char *python;

#define SOCK "--socket", srv.socket

/* What python checks, given the text's file and the counts of the
 * workload (ok calls of `plain`, failed calls of `fail`). Exit 0, 1 with
 * the reason on stderr, or 77 when prometheus_client is missing. */
static const char check_py[] =
    "import math, sys\n"
    "try:\n"
    "    from prometheus_client.parser import text_string_to_metric_families\n"
    "except ImportError:\n"
    "    sys.exit(77)\n"
    "text = open(sys.argv[1]).read()\n"
    "ok_calls, failed_calls = int(sys.argv[2]), int(sys.argv[3])\n"
    "fams = {f.name: f for f in text_string_to_metric_families(text)}\n"
    "def fail(why):\n"
    "    print(why, file=sys.stderr); sys.exit(1)\n"
    "def value(fam, sample, **labels):\n"
    "    for s in fams[fam].samples:\n"
    "        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):\n"
    "            return s.value\n"
    "    fail('no sample %s %s' % (sample, labels))\n"
    "want = {'sharedtensor_requests': 'counter', 'sharedtensor_requests_in_flight': 'gauge',\n"
    "        'sharedtensor_errors': 'counter', 'sharedtensor_calls': 'counter',\n"
    "        'sharedtensor_request_duration_seconds': 'histogram',\n"
    "        'sharedtensor_objects': 'gauge', 'sharedtensor_object_bytes': 'gauge',\n"
    "        'sharedtensor_leases': 'gauge', 'sharedtensor_tasks': 'gauge',\n"
    "        'sharedtensor_open_connections': 'gauge', 'sharedtensor_reloads': 'counter',\n"
    "        'sharedtensor_descriptors_held': 'gauge',\n"
    "        'sharedtensor_memory_budget_bytes': 'gauge'}\n"
    "for name, typ in want.items():\n"
    "    if name not in fams: fail('no family %s in %s' % (name, sorted(fams)))\n"
    "    if fams[name].type != typ: fail('%s is %s, not %s' % (name, fams[name].type, typ))\n"
    "for f in fams.values():\n"
    "    if not f.name.startswith('sharedtensor_'): fail('foreign family ' + f.name)\n"
    "    if f.type == 'untyped': fail('untyped family ' + f.name)\n"
    "    if not f.documentation: fail('no HELP for ' + f.name)\n"
    "    if f.type == 'counter' and not all(s.name.endswith('_total') for s in f.samples):\n"
    "        fail('counter sample without _total in ' + f.name)\n"
    "if value('sharedtensor_requests', 'sharedtensor_requests_total', method='call', outcome='ok') != ok_calls:\n"
    "    fail('ok calls')\n"
    "if value('sharedtensor_requests', 'sharedtensor_requests_total', method='call', outcome='error') != failed_calls:\n"
    "    fail('failed calls')\n"
    "if value('sharedtensor_calls', 'sharedtensor_calls_total', endpoint='plain', outcome='ok') != ok_calls:\n"
    "    fail('calls of plain')\n"
    "if value('sharedtensor_errors', 'sharedtensor_errors_total', name='ENDPOINT') != failed_calls:\n"
    "    fail('ENDPOINT errors')\n"
    "if value('sharedtensor_requests_in_flight', 'sharedtensor_requests_in_flight', method='metrics') != 1:\n"
    "    fail('the metrics request is not in flight')\n"
    "h = [s for s in fams['sharedtensor_request_duration_seconds'].samples if s.labels.get('method') == 'call']\n"
    "buckets = [s for s in h if s.name.endswith('_bucket')]\n"
    "bounds = [float(s.labels['le']) for s in buckets]\n"
    "if bounds != sorted(bounds) or not math.isinf(bounds[-1]): fail('bucket bounds')\n"
    "counts = [s.value for s in buckets]\n"
    "if counts != sorted(counts): fail('buckets are not cumulative')\n"
    "count = [s.value for s in h if s.name.endswith('_count')][0]\n"
    "if counts[-1] != count or count != ok_calls + failed_calls: fail('histogram count')\n"
    "if [s.value for s in h if s.name.endswith('_sum')][0] <= 0: fail('histogram sum')\n"
    "if value('sharedtensor_open_connections', 'sharedtensor_open_connections') < 1: fail('connections')\n"
    "print('parsed %d families' % len(fams))\n";

/* The first python3 that can import prometheus_client, or NULL. */
static const char *find_python(void) {
  static const char *const candidates[] = {"/usr/bin/python3", "python3", NULL};
  for (int i = 0; candidates[i]; i++) {
    int rc = run_prog(candidates[i], NULL,
                      (const char *const[]){"-c", "import prometheus_client.parser", NULL});
    if (rc == 0) return candidates[i];
  }
  return NULL;
}

TEST(prometheus_text_parses) {
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(STCLI(SOCK, "call", "plain"), 0);
  for (int i = 0; i < 2; i++) CHECK_EQ_INT(STCLI(SOCK, "call", "fail"), 1);
  /* The text is longer than what the test kit captures: into a file. */
  char path[400];
  snprintf(path, sizeof path, "%s/metrics.prom", srv.dir);
  CHECK_EQ_INT(run_prog("/bin/sh",
                        NULL,
                        (const char *const[]){"-c", "exec \"$0\" --socket \"$1\" stats --prometheus > \"$2\"",
                                              cli_bin, srv.socket, path, NULL}),
               0);
  CHECK_STR_EQ(R.err, "");
  char head[512] = "";
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  if (!f) return;
  size_t n = fread(head, 1, sizeof head - 1, f);
  head[n] = '\0';
  fclose(f);
  CHECK(strncmp(head, "# HELP sharedtensor_requests_total ", 35) == 0);
  int rc = run_prog(python, NULL, (const char *const[]){"-c", check_py, path, "3", "2", NULL});
  if (rc != 0) fprintf(stderr, "   python: %s%s\n", R.out, R.err);
  CHECK_EQ_INT(rc, 0);
}

TEST(prometheus_usage) {
  check_command_help("stats");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "stats", "--prometheus"), 2);
  CHECK_CONTAINS(R.err, "--prometheus");
  CHECK_EQ_INT(STCLI(SOCK, "stats", "--prometeus"), 2);
  CHECK_CONTAINS(R.err, "--prometheus");   /* did you mean */
  CHECK_EQ_INT(STCLI("completion", "zsh"), 0);
  CHECK_CONTAINS(R.out, "--prometheus");
}

static const stt_endpoint_t endpoints[] = {
    {"plain.lua", "return st.endpoint{ name = 'plain', build = function() return 1 end }\n"},
    {"fail.lua", "return st.endpoint{ name = 'fail', build = function() error('nope') end }\n"},
    {NULL, NULL},
};

int main(void) {
  cli_require_bin();
  python = find_python();
  if (!python) stt_skip("no python3 with prometheus_client (Debian: python3-prometheus-client)");
  stt_server_setup(&srv, NULL, endpoints);
  RUN(prometheus_text_parses);
  RUN(prometheus_usage);
  return stt_server_finish(&srv);
}

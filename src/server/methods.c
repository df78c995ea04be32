/* src/server: THE table of wire methods (rpc.h; docs/protocol.md,
 * "Methods"): one row per method with its handler and its parameters,
 * in the order they are checked. A parameter a handler checks itself
 * (call's args, the arenas taken before dispatch) is ST_RPC_ANY. */
#include <string.h>

#include "server/rpc.h"
#include "server/takeover.h"
#include "server/work.h"

#define M(name) #name, sizeof #name - 1
#define P(n, t, f) {.name = n, .type = t, .flags = f}
#define ANY(n) P(n, ST_RPC_ANY, 0)
#define BOOL(n) P(n, ST_RPC_BOOL, 0)
#define P_TASK P("task_id", ST_RPC_U64, ST_RPC_REQUIRED)
#define P_OBJECT P("object_id", ST_RPC_U64, ST_RPC_REQUIRED)
#define P_ENDPOINT P("endpoint", ST_RPC_STR, ST_RPC_REQUIRED)
#define P_NAME P("name", ST_RPC_STR, ST_RPC_REQUIRED)
#define P_KEY P("key", ST_RPC_STR, ST_RPC_REQUIRED)
#define NONE {{0}}

static const st__rpc_method_t methods[] = {
    {M(ping), st__rpc_ping, NONE},
    {M(call), st__rpc_call,
     {P_ENDPOINT, ANY("args"), ANY("arenas"), BOOL("readonly"), ANY("view")}},
    {M(hello), st__rpc_hello,
     {P("protocol", ST_RPC_U64, ST_RPC_NIL_IS_VALUE), P("client", ST_RPC_STR, ST_RPC_NIL_IS_VALUE),
      ANY("features")}},
    {M(info), st__rpc_info, NONE},
    {M(endpoints), st__rpc_endpoints, NONE},
    {M(submit), st__rpc_submit, {P_ENDPOINT, ANY("args"), ANY("arenas")}},
    {M(status), st__rpc_status, {P_TASK}},
    {M(wait), st__rpc_wait, {{.name = "timeout", .type = ST_RPC_SECONDS, .lo = 0, .hi = 3600}, P_TASK}},
    {M(result), st__rpc_result, {P_TASK}},
    {M(cancel), st__rpc_cancel, {P_TASK}},
    {M(tasks), st__rpc_tasks,
     {{.name = "status", .type = ST_RPC_WORD, .choices = ST__TASK_STATUS_NAMES},
      P("limit", ST_RPC_U64, 0), P("before", ST_RPC_U64, 0)}},
    {M(release), st__rpc_release, {P_OBJECT}},
    {M(object_info), st__rpc_object_info, {P_OBJECT}},
    {M(ensure_live), st__rpc_ensure_live, {P("server_id", ST_RPC_STR, 0), P_OBJECT}},
    {M(objects), st__rpc_objects, NONE},
    {M(invalidate_call), st__rpc_invalidate_call, {P_ENDPOINT, ANY("args")}},
    {M(invalidate_endpoint), st__rpc_invalidate_endpoint, {P_ENDPOINT}},
    {M(reload), st__rpc_reload, NONE},
    {M(takeover), st__rpc_takeover, NONE},
    {M(metrics), st__rpc_metrics, NONE},
    {M(handoff_create), st__rpc_handoff_create,
     {P_NAME, P("device", ST_RPC_STR, 0), P("chunk_bytes", ST_RPC_U64, ST_RPC_REQUIRED),
      P("chunks", ST_RPC_U64, ST_RPC_REQUIRED), P("consumers", ST_RPC_U64, ST_RPC_REQUIRED),
      ANY("readers")}},
    {M(handoff_open), st__rpc_handoff_open,
     {P_NAME, P("consumers", ST_RPC_U64, 0), P("device", ST_RPC_STR, 0)}},
    {M(handoff_close), st__rpc_handoff_close, {P_NAME}},
    {M(handoff_delete), st__rpc_handoff_delete, {P_NAME, BOOL("force")}},
    {M(handoffs), st__rpc_handoffs, {BOOL("all")}},
    {M(buffer_create), st__rpc_buffer_create,
     {P_NAME, ANY("shape"), P("dtype", ST_RPC_STR, ST_RPC_REQUIRED), P("device", ST_RPC_STR, 0),
      P("slots", ST_RPC_U64, 0), ANY("readers")}},
    {M(buffer_open), st__rpc_buffer_open, {P_NAME, BOOL("readonly")}},
    {M(buffer_close), st__rpc_buffer_close, {P_NAME, P("handle", ST_RPC_U64, ST_RPC_REQUIRED)}},
    {M(buffer_unlink), st__rpc_buffer_unlink, {P_NAME, BOOL("force")}},
    {M(buffers), st__rpc_buffers, {BOOL("all")}},
    {M(put), st__rpc_put,
     {P_KEY, P("value", ST_RPC_ANY, ST_RPC_REQUIRED), ANY("arenas"),
      {.name = "policy", .type = ST_RPC_WORD, .choices = ST__KEY_POLICY_NAMES}, BOOL("readonly"),
       BOOL("live"), ANY("readers")}},
    {M(get), st__rpc_get,
     {P_KEY, P("version", ST_RPC_U64, 0), BOOL("readonly"), ANY("view"), P("have", ST_RPC_U64, 0)}},
    {M(keys), st__rpc_keys, {P("prefix", ST_RPC_STR, 0), BOOL("all")}},
    {M(delete), st__rpc_delete, {P_KEY, BOOL("force")}},
    {M(pull), st__rpc_pull,
     {P_KEY, P("from", ST_RPC_STR, ST_RPC_REQUIRED), P("version", ST_RPC_U64, 0),
      P("as", ST_RPC_STR, 0), P("device", ST_RPC_STR, 0),
      {.name = "policy", .type = ST_RPC_WORD, .choices = ST__KEY_POLICY_NAMES}, ANY("readers"),
      BOOL("live")}},
    {M(unsubscribe), st__rpc_unsubscribe, {P_KEY}},
    {M(replicas), st__rpc_replicas, {P_KEY}},
    {M(replicate), st__rpc_replicate,
     {P_KEY, P("to", ST_RPC_ANY, ST_RPC_REQUIRED), P("version", ST_RPC_U64, 0),
      P("as", ST_RPC_STR, 0)}},
    {M(peers), st__rpc_peers, NONE},
};

#define NMETHODS (sizeof methods / sizeof methods[0])
_Static_assert(NMETHODS <= ST__STATS_NMETHODS, "raise ST__STATS_NMETHODS (server.h)");

/* The row of a method name (not NUL-terminated); see rpc.h. A linear
 * scan by length first: the busiest methods come first. */
const st__rpc_method_t *st__rpc_method_find(const char *name, size_t len) {
  for (size_t i = 0; i < NMETHODS; i++)
    if (methods[i].len == len && memcmp(methods[i].name, name, len) == 0) return &methods[i];
  return NULL;
}

/* See rpc.h. */
size_t st__rpc_method_index(const st__rpc_method_t *m) {
  return (size_t)(m - methods);
}

size_t st__rpc_method_count(void) {
  return NMETHODS;
}

/* The name of row i (i < st__rpc_method_count()). Static. */
const char *st__rpc_method_name(size_t i) {
  return methods[i].name;
}

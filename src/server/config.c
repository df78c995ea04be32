/* src/server: the server's configuration (config.h): the settings schema
 * of config.lua (common/settings.h), its defaults, and the load, which
 * src/lua runs through the schema (st__settings_load). Command-line flags
 * are applied afterwards by the startup code. */
#include "server/config.h"

#include <limits.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/options.h"
#include "lua/st_lua.h"
#include "mem/ledger.h"
#include "st/errors.h"
#include "st/wire.h"

#define F(field) offsetof(st__config_t, field)
#define INT_FIELD(field) .offset = F(field), .size = sizeof(((st__config_t *)0)->field)

static int budget_key_ok(const char *key) {
  return st__device_name_ok(key, 0);
}

static int set_budget(st__config_t *c, const char *device, uint64_t bytes);

static int put_budget(void *obj, const char *key, int64_t value, char *err, size_t errlen) {
  if (set_budget(obj, key, (uint64_t)value) == 0) return 0;
  snprintf(err, errlen, "at most %d devices", ST_MAX_BUDGETS);
  return -1;
}

static const st__setting_t limits_rows[] = {
    {.name = "max_message_bytes", .type = ST_SET_INT, INT_FIELD(max_message_bytes), .lo = 64,
     .hi = INT64_C(1) << 40, .def = ST_DEFAULT_MAX_MESSAGE_BYTES,
     .description = "largest incoming message"},
    {.name = "max_connections", .type = ST_SET_INT, INT_FIELD(max_connections), .lo = 1,
     .hi = 1 << 20, .def = ST_DEFAULT_MAX_CONNECTIONS, .description = "connections at once"},
    {.name = "max_inflight", .type = ST_SET_INT, INT_FIELD(max_inflight), .lo = 1, .hi = 1 << 20,
     .def = ST_DEFAULT_MAX_INFLIGHT,
     .description = "requests of one connection waiting for a reply"},
    {.name = "frame_timeout_ms", .type = ST_SET_INT, INT_FIELD(frame_timeout_ms), .lo = 1,
     .hi = INT_MAX, .def = ST_DEFAULT_FRAME_TIMEOUT_MS,
     .description = "how long a frame may stay half-sent"},
    {.name = "max_object_bytes", .type = ST_SET_INT, INT_FIELD(max_object_bytes), .lo = 0,
     .hi = INT64_C(1) << 53, .def = (int64_t)ST_DEFAULT_MAX_OBJECT_BYTES,
     .description = "largest single allocation (arena); 0 = only its device's memory_budget "
                    "(and, on the cpu, the host's memory) bound it",
     .zero = "only its device's memory_budget"},
    {.name = "lua_memory_bytes", .type = ST_SET_INT, INT_FIELD(lua_memory_bytes),
     .lo = ST__CONFIG_MIN_LUA_MEMORY, .hi = INT64_C(1) << 44, .def = INT64_C(1) << 30,
     .description = "Lua memory of one worker's state (a body past it: OUT_OF_MEMORY)"},
    {.name = "default_timeout_s", .type = ST_SET_SECONDS, .flags = ST_SET_OPEN,
     .offset = F(default_timeout_s), .min = 0, .max = 1e9, .def_seconds = 300.0,
     .description = "timeout of an endpoint that declares none"},
    {.name = "max_arena_fds", .type = ST_SET_INT, INT_FIELD(max_arena_fds), .lo = 0,
     .hi = 1 << 30, .def = 0,
     .description = "descriptors the server's arenas keep open (memfd objects, results, tensor "
                    "arguments), all together; 0 = half of RLIMIT_NOFILE",
     .zero = "half of RLIMIT_NOFILE"},
    {.name = "max_fds_per_connection", .type = ST_SET_INT, INT_FIELD(max_fds_per_connection),
     .lo = 1, .hi = 1 << 24, .def = 1,
     .description = "descriptors held for one connection (default: derived, see limits.c)"},
    {.name = "max_fds_all_connections", .type = ST_SET_INT,
     INT_FIELD(max_fds_all_connections), .lo = 1, .hi = 1 << 24, .def = 1,
     .description = "descriptors held for all connections together (default: derived)"},
    {.name = "max_queued_bytes_per_connection", .type = ST_SET_INT,
     INT_FIELD(max_queued_bytes_per_connection), .lo = 1, .hi = INT64_C(1) << 53, .def = 1,
     .description = "arena bytes one connection's undelivered replies pin (default: derived)"},
    {.name = "max_queued_bytes_all_connections", .type = ST_SET_INT,
     INT_FIELD(max_queued_bytes_all_connections), .lo = 1, .hi = INT64_C(1) << 53, .def = 1,
     .description = "arena bytes all undelivered replies pin together (default: derived)"},
    {.name = "max_cached_arguments", .type = ST_SET_INT, INT_FIELD(max_cached_arguments),
     .lo = 0, .hi = 1 << 20, .def = 256,
     .description = "tensor arguments one connection's argument cache keeps mapped (least "
                    "recently used dropped first; 0 = none)",
     .zero = "none"},
    {.name = "max_handoffs_per_connection", .type = ST_SET_INT,
     INT_FIELD(max_handoffs_per_connection), .lo = 0, .hi = 1 << 16, .def = 16,
     .description = "hand-offs one connection may create or open (handoff_create, "
                    "handoff_open)"},
    {.name = "max_handoff_chunks", .type = ST_SET_INT, INT_FIELD(max_handoff_chunks), .lo = 1,
     .hi = 1 << 20, .def = 1024, .description = "chunks of one hand-off"},
    {.name = "max_buffers", .type = ST_SET_INT, INT_FIELD(max_buffers), .lo = 0, .hi = 1 << 20,
     .def = 256, .description = "named buffers of the server (buffer_create; unlinked ones "
                                "that handles still hold count too)"},
    {.name = "max_buffer_bytes", .type = ST_SET_INT, INT_FIELD(max_buffer_bytes), .lo = 0,
     .hi = INT64_C(1) << 50, .def = 0,
     .description = "bytes of one buffer's slots together (0 = a quarter of its device's "
                    "memory_budget)",
     .zero = "a quarter of its device's budget"},
    {.name = "max_buffer_handles_per_connection", .type = ST_SET_INT,
     INT_FIELD(max_buffer_handles_per_connection), .lo = 0, .hi = 1 << 16, .def = 64,
     .description = "buffer handles one connection may hold open (buffer_create, buffer_open)"},
    {.name = NULL},
};

static const st__setting_t pool_rows[] = {
    {.name = "slab_bytes", .type = ST_SET_INT, INT_FIELD(pool_slab_bytes), .lo = 4096,
     .hi = INT64_C(1) << 40, .def = 8 << 20,
     .description = "the largest slab of a connection's result pool on the cpu (the first is "
                    "the smallest power of two that holds 64 KiB and its result; each next one "
                    "doubles up to this)"},
    {.name = "max_bytes_per_connection", .type = ST_SET_INT, INT_FIELD(pool_max_bytes), .lo = 0,
     .hi = INT64_C(1) << 50, .def = 256 << 20,
     .description = "slab bytes one connection's pool may hold (at most a quarter of "
                    "memory_budget.cpu); past it results get arenas of their own"},
    {.name = "max_result_bytes", .type = ST_SET_INT, INT_FIELD(pool_max_result_bytes), .lo = 0,
     .hi = INT64_C(1) << 50, .def = 0,
     .description = "larger arenas are not pooled (0 = an eighth of the per-connection cap, "
                    "at most 16 MiB)",
     .zero = "an eighth of the per-connection cap, at most 16 MiB"},
    {.name = "max_regions", .type = ST_SET_INT, INT_FIELD(pool_max_regions), .lo = 0,
     .hi = 1 << 20, .def = 1024,
     .description = "live regions of one connection's pool (slots of its control page; "
                    "0 = no pools)",
     .zero = "no pools"},
    {.name = "cuda_slab_bytes", .type = ST_SET_INT, INT_FIELD(pool_cuda_slab_bytes),
     .lo = 4096, .hi = INT64_C(1) << 40, .def = 2 << 20,
     .description = "the first slab (a VMM allocation, rounded up to the device's granularity) "
                    "of a connection's result pool on a CUDA device, or the first result's size "
                    "when larger; each next one doubles"},
    {.name = "cuda_max_bytes_per_connection", .type = ST_SET_INT, INT_FIELD(pool_cuda_max_bytes),
     .lo = 0, .hi = INT64_C(1) << 50, .def = INT64_C(1) << 30,
     .description = "slab bytes one connection's pool may hold on one CUDA device (at most a "
                    "quarter of its memory_budget); past it results get arenas of their own"},
    {.name = "idle_s", .type = ST_SET_SECONDS, .offset = F(pool_idle_s), .min = 0,
     .max = 86400.0, .def_seconds = 5.0,
     .description = "a slab with no live region this long is retired (the oldest of a device "
                    "too once the connection made no pooled call this long; 0 = slabs live "
                    "until the connection closes)"},
    {.name = NULL},
};

static const st__setting_t keys_rows[] = {
    {.name = "max_keys", .type = ST_SET_INT, INT_FIELD(keys_max_keys), .lo = 0, .hi = 1 << 24,
     .def = 1024, .description = "published keys the server keeps (put of a new key past it: LIMIT)"},
    {.name = "max_bytes", .type = ST_SET_INT, INT_FIELD(keys_max_bytes), .lo = 0,
     .hi = INT64_C(1) << 53, .def = 0,
     .description = "bytes of every kept key version, all devices together; 0 = each device's "
                    "memory_budget alone bounds them",
     .zero = "each device's memory_budget alone"},
    {.name = "max_versions", .type = ST_SET_INT, INT_FIELD(keys_max_versions), .lo = 1,
     .hi = 1 << 16, .def = 2,
     .description = "versions kept per key; a put past it drops the oldest"},
    {.name = NULL},
};

static const st__setting_t tasks_rows[] = {
    {.name = "ttl_s", .type = ST_SET_SECONDS, .flags = ST_SET_OPEN, .offset = F(task_ttl_s),
     .min = 0, .max = 1e9, .def_seconds = 600.0,
     .description = "seconds a finished task (and a result nobody fetched) is kept"},
    {.name = "capacity", .type = ST_SET_INT, INT_FIELD(task_capacity), .lo = 1, .hi = 10000000,
     .def = 10000, .description = "tasks kept at most"},
    {.name = NULL},
};

#define QUOTA(kind) .offset = F(quotas[kind]), .size = sizeof(uint64_t)

static const st__setting_t quotas_rows[] = {
    {.name = "keys", .type = ST_SET_INT, QUOTA(ST__UIDQ_KEYS), .lo = 0, .hi = 1 << 24, .def = 0,
     .description = "published keys one uid may own (0 = a quarter of keys.max_keys)",
     .zero = "a quarter of keys.max_keys"},
    {.name = "versions", .type = ST_SET_INT, QUOTA(ST__UIDQ_VERSIONS), .lo = 0, .hi = 1 << 30,
     .def = 0,
     .description = "key versions one uid's keys may keep (0 = a quarter of keys.max_keys x "
                    "keys.max_versions)",
     .zero = "a quarter of keys.max_keys x keys.max_versions"},
    {.name = "buffers", .type = ST_SET_INT, QUOTA(ST__UIDQ_BUFFERS), .lo = 0, .hi = 1 << 20,
     .def = 0, .description = "named buffers one uid may own (0 = a quarter of limits.max_buffers)",
     .zero = "a quarter of limits.max_buffers"},
    {.name = "handoffs", .type = ST_SET_INT, QUOTA(ST__UIDQ_HANDOFFS), .lo = 0, .hi = 1 << 20,
     .def = 0,
     .description = "hand-offs one uid may own (0 = 4 x limits.max_handoffs_per_connection)",
     .zero = "4 x limits.max_handoffs_per_connection"},
    {.name = "tasks", .type = ST_SET_INT, QUOTA(ST__UIDQ_TASKS), .lo = 0, .hi = 10000000,
     .def = 0,
     .description = "tasks of one uid the table keeps (0 = a quarter of tasks.capacity)",
     .zero = "a quarter of tasks.capacity"},
    {.name = "fds", .type = ST_SET_INT, QUOTA(ST__UIDQ_FDS), .lo = 0, .hi = 1 << 30, .def = 0,
     .description = "arena descriptors the server keeps for one uid's keys, buffers and "
                    "hand-offs (0 = a quarter of limits.max_arena_fds as derived)",
     .zero = "a quarter of the arenas' descriptor cap"},
    {.name = "pinned_bytes", .type = ST_SET_INT, QUOTA(ST__UIDQ_PINNED_BYTES), .lo = 0,
     .hi = INT64_C(1) << 60, .def = 0,
     .description = "arena bytes of one uid's keys, buffers and hand-offs, all devices (0 = a "
                    "quarter of the memory_budget entries together; none without a budget)",
     .zero = "a quarter of the memory budgets"},
    {.name = "pool_bytes", .type = ST_SET_INT, QUOTA(ST__UIDQ_POOL_BYTES), .lo = 0,
     .hi = INT64_C(1) << 60, .def = 0,
     .description = "slab bytes of one uid's result pools, all its connections and devices, "
                    "root's too (0 = a quarter of the memory_budget entries together; none "
                    "without a budget)",
     .zero = "a quarter of the memory budgets"},
    {.name = NULL},
};

#define PF(field) offsetof(st__config_t, peer.field)
#define EF(field) offsetof(st__peer_entry_t, field)

static const st__setting_t peer_tls_rows[] = {
    {.name = "cert", .type = ST_SET_PATH, .offset = PF(tls_cert),
     .description = "this server's certificate chain (PEM)"},
    {.name = "key", .type = ST_SET_PATH, .offset = PF(tls_key),
     .description = "the private key of that certificate (PEM)"},
    {.name = "ca", .type = ST_SET_PATH, .offset = PF(tls_ca),
     .description = "the CA bundle peers' certificates must verify against (PEM)"},
    {.name = NULL},
};

/* One entry of peer.peers: "host:port", or {addr =, as_uid =}. */
static const st__setting_t peer_entry_rows[] = {
    {.name = "addr", .type = ST_SET_STRING, .offset = EF(addr),
     .description = "host:port of its peer listener (none: it may only dial us)"},
    {.name = "as_uid", .type = ST_SET_INT, .offset = EF(as_uid), .size = sizeof(int64_t),
     .lo = 1, .hi = UINT32_MAX - 1, .def = -1,
     .description = "the local uid that keys it pushes here belong to (default: none, pushes "
                    "refused; never root)"},
    {.name = NULL},
};

static int peer_id_ok(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > ST__PEER_ID_MAX) return 0;
  return strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

static const st__setting_t peer_rows[] = {
    {.name = "id", .type = ST_SET_STRING, .offset = PF(id),
     .description = "this server's id among its peers (default: the host name)"},
    {.name = "listen", .type = ST_SET_STRING, .offset = PF(listen),
     .description = "host:port of the TCP listener for peers (port 0: any free one); default: "
                    "none, no port opens"},
    {.name = "secret", .type = ST_SET_PATH, .offset = PF(secret),
     .description = "the cluster key file (at least 32 random bytes, raw or hex; mode 0600, "
                    "owned by the server's uid)"},
    {.name = "tls", .type = ST_SET_TABLE, .rows = peer_tls_rows,
     .description = "mutual certificates instead of a cluster key"},
    {.name = "peers", .type = ST_SET_RECORDS, .flags = ST_SET_ONE, .offset = PF(peers),
     .size = sizeof(st__peer_entry_t), .count_offset = PF(npeers),
     .max_entries = ST__PEER_MAX_PEERS, .rows = peer_entry_rows, .key_offset = EF(id),
     .key_ok = peer_id_ok, .keys = "peer ids (A-Z a-z 0-9 . _ -, at most 255)",
     .description = "the peers by id: \"host:port\" or {addr = \"host:port\", as_uid = N}"},
    {.name = "export", .type = ST_SET_STRINGS, .offset = PF(exports),
     .count_offset = PF(nexport), .max_entries = ST__PEER_MAX_EXPORT,
     .description = "globs of the keys peers may pull from this server (default: none)"},
    {.name = "live_reads", .type = ST_SET_WORD, INT_FIELD(peer.live_staged),
     .choices = "fenced|staged", .def = 0,
     .description = "how a live key's version is read for peers: fenced (the publisher's next "
                    "update waits while a transfer reads the key) or staged (the version is "
                    "copied on its device first, and the publisher waits for the copy alone)"},
    {.name = "max_transfers_per_peer", .type = ST_SET_INT, INT_FIELD(peer.max_transfers_per_peer),
     .lo = 1, .hi = 1024, .def = 4, .description = "transfers with one peer at once"},
    {.name = "max_bytes_in_flight_per_peer", .type = ST_SET_INT,
     INT_FIELD(peer.max_bytes_in_flight_per_peer), .lo = 1 << 20, .hi = INT64_C(1) << 50,
     .def = INT64_C(64) << 30, .description = "bytes of transfers with one peer at once"},
    {.name = "transfer_timeout_s", .type = ST_SET_SECONDS, .flags = ST_SET_OPEN,
     .offset = PF(transfer_timeout_s), .min = 0, .max = 86400.0, .def_seconds = 600.0,
     .description = "how long one transfer may take"},
    {.name = "connect_timeout_s", .type = ST_SET_SECONDS, .flags = ST_SET_OPEN,
     .offset = PF(connect_timeout_s), .min = 0, .max = 600.0, .def_seconds = 10.0,
     .description = "how long a link's TCP connect, TLS handshake and hellos may take, and a "
                    "peer_ping's answer"},
    {.name = "ucx_library", .type = ST_SET_PATH, .offset = PF(ucx_library),
     .description = "the UCX library to load (default: by soname)"},
    {.name = "nccl_library", .type = ST_SET_PATH, .offset = PF(nccl_library),
     .description = "the NCCL library to load (default: by soname, then next to torch)"},
    {.name = NULL},
};

/* The keys of config.lua (docs/operations.md, "Configuration"). */
static const st__setting_t config_settings[] = {
    {.name = "base_path", .type = ST_SET_STRING, .offset = F(base_path),
     .description = "socket base (default: $SHARED_TENSOR_BASE_PATH, else the first usable "
                    "of $XDG_RUNTIME_DIR/" ST_XDG_BASE_PATH ", " ST_RUN_BASE_PATH ", "
                    ST_DEFAULT_BASE_PATH ")"},
    {.name = "devices", .type = ST_SET_INTS, .flags = ST_SET_ONE | ST_SET_NONEMPTY | ST_SET_UNIQUE,
     .offset = F(devices), .size = sizeof(int), .count_offset = F(ndevices), .lo = 0,
     .hi = 4095, .max_entries = ST_MAX_DEVICES, .what = "device",
     .description = "socket indices to serve, one socket each"},
    {.name = "workers", .type = ST_SET_INT, INT_FIELD(workers), .lo = 1,
     .hi = ST__CONFIG_MAX_WORKERS, .def = 4, .description = "worker threads"},
    {.name = "spin_us", .type = ST_SET_INT, INT_FIELD(spin_us), .lo = 0, .hi = 100000,
     .def = 0,
     .description = "microseconds the loop (builds in flight) and a worker that just ran a "
                    "build poll for the next completion or build before sleeping; 0 = never "
                    "(default: derived, 50 with 8 or more CPUs, else 0)"},
    {.name = "loop_threads", .type = ST_SET_INT, INT_FIELD(loop_threads), .lo = 1,
     .hi = ST__CONFIG_MAX_LOOP_THREADS, .def = 1,
     .description = "event loop threads; with N > 1, loop 0 accepts and runs the timers of "
                    "tasks and reloads, and loops 1..N-1 serve the connections, answering "
                    "repeated cache hits in parallel and taking their own builds' completions "
                    "(default 1; with many clients calling cached objects, 1 + min(4, CPUs / "
                    "4))"},
    {.name = "endpoints", .type = ST_SET_PATH, .offset = F(endpoints_dir),
     .def_text = "endpoints",
     .description = "endpoint directory, or one endpoint file"},
    {.name = "log_level", .type = ST_SET_WORD, .offset = F(log_level),
     .choices = "error|warn|info|debug", .parse = st__log_level_parse, .def = ST_LOG_INFO,
     .description = "the most verbose level logged"},
    {.name = "socket_mode", .type = ST_SET_MODE, .offset = F(socket_mode), .def = 0600,
     .description = "socket permission bits"},
    {.name = "socket_group", .type = ST_SET_NAME_OR_ID, .offset = F(socket_group), .lo = 0,
     .hi = UINT32_MAX - 1, .description = "group of the socket file (name or number)"},
    {.name = "allow_uids", .type = ST_SET_INTS, .offset = F(allow_uids), .size = sizeof(uid_t),
     .count_offset = F(nallow_uids), .lo = 0, .hi = UINT32_MAX - 1,
     .max_entries = ST_MAX_ALLOW,
     .description = "uids admitted besides root and the server's own"},
    {.name = "allow_gids", .type = ST_SET_INTS, .offset = F(allow_gids), .size = sizeof(gid_t),
     .count_offset = F(nallow_gids), .lo = 0, .hi = UINT32_MAX - 1,
     .max_entries = ST_MAX_ALLOW,
     .description = "gids (primary or supplementary) whose processes are admitted"},
    {.name = "limits", .type = ST_SET_TABLE, .rows = limits_rows,
     .description = "limits of connections, messages and allocations"},
    {.name = "pool", .type = ST_SET_TABLE, .rows = pool_rows,
     .description = "per-connection pools of result memory (docs/pool.md)"},
    {.name = "keys", .type = ST_SET_TABLE, .rows = keys_rows,
     .description = "published keys: put, get (docs/keys.md)"},
    {.name = "tasks", .type = ST_SET_TABLE, .rows = tasks_rows,
     .description = "the task table: retention and capacity"},
    {.name = "quotas", .type = ST_SET_TABLE, .rows = quotas_rows,
     .description = "what one uid may hold (root and the server's uid are exempt; "
                    "docs/operations.md, \"Quotas\")"},
    {.name = "memory_budget", .type = ST_SET_MAP, .lo = 0, .hi = INT64_C(1) << 60,
     .key_ok = budget_key_ok, .keys = "\"cpu\" or \"cuda:N\"",
     .example = "{ cpu = 8 * 2^30 }", .put = put_budget,
     .description = "bytes of server-held objects per device; 0 = no budget"},
    {.name = "default_device", .type = ST_SET_WORD, .flags = ST_SET_AS_TEXT,
     .offset = F(default_device), .choices = "socket|cpu", .def_text = "socket",
     .description = "where a call builds when its endpoint names no device"},
    {.name = "data_dirs", .type = ST_SET_PATHS, .offset = F(data_dirs),
     .count_offset = F(ndata_dirs), .max_entries = ST_MAX_DATA_DIRS,
     .description = "directories that files loaded by endpoints must lie in"},
    {.name = "loader_threads", .type = ST_SET_INT, INT_FIELD(loader_threads), .lo = 1, .hi = 64,
     .def = 4, .description = "reader threads of one safetensors load"},
    {.name = "staging_bytes", .type = ST_SET_INT, INT_FIELD(staging_bytes), .lo = 4 << 20,
     .hi = INT64_C(1) << 40, .def = 256 << 20,
     .description = "the pinned host staging pool for loads to the GPU"},
    {.name = "shutdown_grace_s", .type = ST_SET_SECONDS, .offset = F(shutdown_grace_s),
     .min = 0, .max = 86400.0, .def_seconds = 10.0,
     .description = "how long in-flight calls may run after SIGTERM"},
    {.name = "endpoint_load_timeout_s", .type = ST_SET_SECONDS, .flags = ST_SET_OPEN,
     .offset = F(endpoint_load_timeout_s), .min = 0, .max = 3600.0, .def_seconds = 10.0,
     .description = "how long an endpoint file's top level may run when it is loaded"},
    {.name = "reload_uids", .type = ST_SET_INTS, .offset = F(reload_uids), .size = sizeof(uid_t),
     .count_offset = F(nreload_uids), .lo = 0, .hi = UINT32_MAX - 1,
     .max_entries = ST_MAX_ALLOW,
     .description = "uids that may call reload (default: root and the server's own)"},
    {.name = "peer", .type = ST_SET_TABLE, .rows = peer_rows,
     .description = "the server-to-server channel (docs/multihost.md)"},
    {.name = NULL},
};

/* See config.h. */
void st__config_print_tables(const st__config_t *cfg, FILE *out) {
  for (const st__setting_t *r = config_settings; r->name; r++) {
    if (r->type != ST_SET_TABLE) continue;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s: ", r->name);
    st__settings_print(out, prefix, r->rows, cfg);
  }
}

static int default_spin_us(void);
static int default_loop_threads(void);

/* Fills every field of *c with its default: the rows' defaults, then the
 * base path from the environment, socket 0, the data directory "." and
 * the cpu budget. Any previous content is overwritten, not freed (call
 * st__config_free first when reusing). The strings are owned by *c. Loop
 * thread, at start. */
void st__config_defaults(st__config_t *c) {
  memset(c, 0, sizeof *c);
  st__settings_defaults(config_settings, c);
  c->path = strdup("");
  const char *env = getenv(ST_ENV_BASE_PATH);
  if (env && env[0]) {
    free(c->base_path);
    c->base_path = strdup(env);
  }
  c->ndevices = 1;
  c->devices[0] = 0;
  c->nbudgets = 1;
  snprintf(c->budgets[0].device, sizeof c->budgets[0].device, "cpu");
  c->budgets[0].bytes = st__config_default_cpu_budget();
  c->ndata_dirs = 1;
  c->data_dirs[0] = strdup(".");
  st__config_connection_limits(c);
  c->spin_us = default_spin_us();
  c->loop_threads = default_loop_threads();
  c->nreload_uids = 0;
  c->reload_uids[c->nreload_uids++] = 0;
  if (geteuid() != 0) c->reload_uids[c->nreload_uids++] = geteuid();
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
  c->peer.id = strdup(host);
}

/* Runs config.lua through the rows, then takes the default data
 * directory from the file's directory. See config.h. */
int st__config_load(const char *path, st__config_t *cfg, st__errlist_t *errs) {
  int rc = st__settings_load(path, config_settings, cfg, errs);
  if (rc != ST_OK) return rc;
  if (cfg->ndata_dirs == 1 && strcmp(cfg->data_dirs[0], ".") == 0) {
    char *dir = st__settings_resolve(path, ".");
    if (dir) {
      free(cfg->data_dirs[0]);
      cfg->data_dirs[0] = dir;
    }
  }
  char *p = strdup(path);
  if (p) {
    free(cfg->path);
    cfg->path = p;
  }
  return ST_OK;
}

/* The CPUs this process may run on (its affinity). */
static int usable_cpus(void) {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                    : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* The default of spin_us: 50 when this process may run on 8 or more CPUs
 * (sched_getaffinity), else 0, so that a small host never gives a core to
 * polling. */
static int default_spin_us(void) {
  return usable_cpus() >= 8 ? 50 : 0;
}

/* The default of loop_threads: 1 + min(4, CPUs / 4) when this process
 * may run on 8 or more CPUs (5 on a 16-CPU host), else 1. Many clients
 * calling cached objects are served in parallel from three loops on,
 * while a call's own cost is the same as with one (docs/benchmarks.md,
 * "Loop threads"); a small host keeps its cores for the clients. */
static int default_loop_threads(void) {
  int cpus = usable_cpus();
  if (cpus < 8) return 1;
  return 1 + (cpus / 4 < 4 ? cpus / 4 : 4);
}

/* Half of what the host lets this process have: the physical memory or
 * the cgroup's memory limit, whichever is lower; 0 (no budget) when
 * sysconf cannot tell. */
uint64_t st__config_default_cpu_budget(void) {
  return st__ledger_host_memory(NULL, 0) / 2;
}

/* Sets the budget of `device` ("cpu" or "cuda:N"), adding an entry when
 * needed. 0 on success, -1 when every entry is taken. Loop thread, at
 * start. */
static int set_budget(st__config_t *c, const char *device, uint64_t bytes) {
  for (int i = 0; i < c->nbudgets; i++) {
    if (strcmp(c->budgets[i].device, device) == 0) {
      c->budgets[i].bytes = bytes;
      return 0;
    }
  }
  if (c->nbudgets == ST_MAX_BUDGETS) return -1;
  snprintf(c->budgets[c->nbudgets].device, sizeof c->budgets[0].device, "%s", device);
  c->budgets[c->nbudgets].bytes = bytes;
  c->nbudgets++;
  return 0;
}

/* Frees the strings of *c and clears it. Safe on a zeroed struct. */
void st__config_free(st__config_t *c) {
  st__settings_free(config_settings, c);
  free(c->path);
  memset(c, 0, sizeof *c);
}

static uint64_t quarter(uint64_t global) { return global / 4 ? global / 4 : 1; }

/* See config.h. */
void st__config_quotas(const st__config_t *cfg, uint64_t fd_cap, uint64_t out[ST__UIDQ_NKINDS],
                       int *lowered) {
  uint64_t budgets = 0;
  for (int i = 0; i < cfg->nbudgets; i++) budgets += cfg->budgets[i].bytes;
  /* Each kind's global limit (0: none). */
  uint64_t global[ST__UIDQ_NKINDS] = {
      [ST__UIDQ_KEYS] = (uint64_t)cfg->keys_max_keys,
      [ST__UIDQ_VERSIONS] = (uint64_t)cfg->keys_max_keys * (uint64_t)cfg->keys_max_versions,
      [ST__UIDQ_BUFFERS] = cfg->max_buffers,
      [ST__UIDQ_HANDOFFS] = 0,
      [ST__UIDQ_TASKS] = (uint64_t)cfg->task_capacity,
      [ST__UIDQ_FDS] = fd_cap,
      [ST__UIDQ_PINNED_BYTES] = budgets,
      [ST__UIDQ_POOL_BYTES] = budgets,
  };
  if (lowered) *lowered = 0;
  for (int k = 0; k < ST__UIDQ_NKINDS; k++) {
    uint64_t g = global[k], q = cfg->quotas[k];
    if (!q) q = k == ST__UIDQ_HANDOFFS ? 4 * (uint64_t)cfg->max_handoffs_per_connection
                : g                    ? quarter(g)
                                       : 0;
    else if (g > 1 && q >= g) {
      q = g - (g / 4 ? g / 4 : 1);
      if (lowered) (*lowered)++;
    }
    out[k] = q;
  }
}

-- stserver configuration (docs/operations.md).
--
-- This file is Lua: it runs once at start, sandboxed, and returns one table.
-- Every key is optional; a missing key keeps the default shown here. An
-- unknown key, a wrong type or a bad value stops the server at start with
-- "config.lua: key: message" (check a file with
-- `stserver --check --config FILE`).
-- Command-line flags override this file: --base-path, --endpoints,
-- --workers, --log-level.
return {
  -- Socket base: the server listens on "<base_path>-<device>.sock", one
  -- socket per entry of `devices`. Precedence: --base-path, then this key,
  -- then $SHARED_TENSOR_BASE_PATH, then the first usable default:
  -- "$XDG_RUNTIME_DIR/sharedtensor/st", "/run/sharedtensor/st", else the
  -- fallback "/tmp/shared-tensor" (docs/operations.md, "Where the socket
  -- lives"; clients without a path look there in the same order). Left
  -- unset here so that the environment variable and the defaults apply.
  -- base_path = "/srv/sharedtensor/st",

  -- Socket indices to serve (one socket each). Index N is the CUDA device
  -- N for CUDA endpoints; CPU endpoints work on every socket.
  devices = { 0 },

  -- Worker threads that run endpoint bodies (1..256). Each keeps its own
  -- Lua state per generation of the endpoints.
  workers = 4,

  -- Microseconds (0..100000) the loop thread polls for the completion of a
  -- build in flight, and a worker that just ran one polls for the next,
  -- before they sleep: a fresh result comes back without thread wake-ups.
  -- Default: 50 when the server may run on 8 or more CPUs, else 0 (off).
  -- spin_us = 50,

  -- Event loop threads (1..64). With N > 1, loop 0 accepts and takes
  -- completions, and loops 1..N-1 serve the connections: their reads,
  -- writes and repeated cache hits in parallel, everything else one at a
  -- time under one lock (docs/pool.md, section 7). Pays off with many busy
  -- clients on a machine with cores to spare.
  -- Default: 1, the shortest path for a fresh result (about 10 us less
  -- than with more); with many clients calling cached objects,
  -- 1 + min(4, CPUs / 4) (5 on 16 CPUs: 439k against 132k cached calls/s
  -- on the H100 host).
  -- loop_threads = 5,

  -- Directory of the endpoint files (*.lua, not recursive), or one endpoint
  -- file (such as a zero-branch script, docs/zero-branch.md). A relative
  -- path is relative to the directory of this file.
  endpoints = "endpoints",

  -- "error", "warn", "info" or "debug". Logs go to stderr, one line each.
  log_level = "info",

  -- Permission bits of the socket file, as an octal string (Lua has no
  -- octal literals). The socket is created with these bits atomically.
  -- Whoever can connect still has to pass the peer check below.
  socket_mode = "0600",

  -- Group of the socket file (a name or a number). With a group, a
  -- directory the server creates for the socket gets mode 0750 and that
  -- group; use socket_mode = "0660" so that its members can connect.
  -- socket_group = "ml",

  -- Peers admitted besides root and the server's own uid: these uids, and
  -- processes whose primary gid is one of allow_gids. Everyone else gets an
  -- AUTH error and is disconnected before the server reads a byte.
  allow_uids = {},
  allow_gids = {},

  limits = {
    -- Largest incoming message; a bigger one is a LIMIT error and the
    -- connection is closed.
    max_message_bytes = 16 * 1024 * 1024,
    -- Connections at once; one more gets a LIMIT error and is closed.
    max_connections = 1024,
    -- Requests of one connection waiting for a reply; the extra ones get
    -- BUSY at once.
    max_inflight = 64,
    -- A frame that stays half-sent this long: TIMEOUT, connection closed.
    frame_timeout_ms = 10000,
    -- Largest single allocation (arena) an endpoint may make; 0 = no cap
    -- of its own: the device's memory_budget bounds it.
    max_object_bytes = 0,
    -- Descriptors the server's memfd arenas keep open (cached and leased
    -- objects, unsent results); 0 = half of RLIMIT_NOFILE. Past it, cached
    -- objects are evicted, else the call fails with LIMIT.
    max_arena_fds = 0,
    -- Lua memory of each worker's state (not tensor data); a body that
    -- would go past it fails with OUT_OF_MEMORY.
    lua_memory_bytes = 1024 * 1024 * 1024,
    -- The timeout of an endpoint that declares none (seconds, > 0).
    default_timeout_s = 300,
    -- What connections may hold: descriptors (unclaimed ones a client
    -- sent, those of replies it has not read yet) and the arena bytes its
    -- unread replies keep alive; past them a reply gets LIMIT. Defaults
    -- derive from RLIMIT_NOFILE and the physical memory (stserver --check
    -- prints them); set them only to override.
    -- max_fds_per_connection = 512,
    -- max_fds_all_connections = 16384,
    -- max_queued_bytes_per_connection = 1024 * 1024 * 1024,
    -- max_queued_bytes_all_connections = 32 * 1024 * 1024 * 1024,
  },

  -- On SIGTERM/SIGINT, calls in flight get this many seconds to finish;
  -- then they are cancelled (their clients get CANCELLED).
  shutdown_grace_s = 10,

  tasks = {
    -- A finished task (and a result nobody fetched) is kept this many
    -- seconds; then its id gives NOT_FOUND and its memory is freed.
    ttl_s = 600,
    -- Tasks kept at most; a new one drops the oldest finished task. When
    -- all of them are pending or running, submit gets LIMIT.
    capacity = 10000,
  },

  -- Bytes of every arena the server holds (objects, unfetched task
  -- results, unsent results, running bodies' tensors) per device, counted
  -- before they are allocated; 0 = no budget. Past it, the least recently
  -- used cache entries nobody holds are evicted; an allocation that still
  -- does not fit fails with OUT_OF_MEMORY. Default for cpu: half of the
  -- physical memory or of the cgroup's memory limit, whichever is lower.
  -- memory_budget = { cpu = 32 * 1024 * 1024 * 1024, ["cuda:0"] = 60 * 1024 * 1024 * 1024 },

  -- Where an endpoint builds when it names no `device` (and a constructor
  -- names none): "socket" builds on the socket's device (socket N on
  -- cuda:N when this server has that CUDA device, else on the CPU); "cpu"
  -- always builds in host shared memory.
  default_device = "socket",

  -- Files that endpoints load (st.load_safetensors) must lie in one of
  -- these directories (symlinks resolved); relative names are taken from
  -- this file's directory. Default: this file's directory.
  -- data_dirs = { "models", "/srv/weights" },

  -- safetensors loading: reader threads per load, and the pinned host
  -- staging pool for copies to the GPU (allocated once, at start, when a
  -- CUDA device is served).
  loader_threads = 4,
  staging_bytes = 256 * 1024 * 1024,

  -- How long an endpoint file's top level may run when it is loaded (at
  -- start and on reload; a reload loads on a thread of its own, so clients
  -- are served meanwhile). Past it the load fails naming the file, and on
  -- reload the old endpoints keep serving.
  endpoint_load_timeout_s = 10,

  -- The uids whose `reload` requests (stcli reload) are served; others get
  -- AUTH. Default: root and the uid the server runs as. {} leaves reloads
  -- to SIGHUP.
  -- reload_uids = { 0, 1000 },

  -- The server-to-server channel (docs/multihost.md): off unless `listen`
  -- or `peers` is set; then a cluster key file (mode 0600) or certificates
  -- are required. Keys leave this host only when `export` matches them.
  -- peer = {
  --   id = "node-a",                        -- default: the host name
  --   listen = "10.0.0.1:7070",
  --   secret = "/etc/sharedtensor/cluster.key",
  --   -- tls = { cert = "node-a.pem", key = "node-a.key", ca = "ca.pem" },
  --   peers = { ["node-b"] = "10.0.0.2:7070", ["node-c"] = { addr = "10.0.0.3:7070", as_uid = 1000 } },
  --   export = { "weights/*" },
  --   max_transfers_per_peer = 4,
  --   max_bytes_in_flight_per_peer = 64 * 2^30,
  --   transfer_timeout_s = 600,
  --   connect_timeout_s = 10,
  --   live_reads = "fenced",                -- "staged": a trainer's update never waits
  --                                         -- for a transfer (a copy on its device first)
  -- },
}

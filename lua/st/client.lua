-- st.client: the Lua client of stserver, over libstclient through LuaJIT's
-- FFI (one protocol implementation: the C library's).
--
--   local st = require("st.client")
--   local c = assert(st.connect{ device = 0 })   -- or { path = "/tmp/x-0.sock" }
--   local res = assert(c:call("load_linear", { input_dim = 16 }))
--   local w = res.value.tensors.weight            -- a module's tensor
--   print(w.dtype, w.shape[1], w.shape[2], w:get(0))
--   res:free()                                    -- or let the GC do it
--
--   local x = assert(st.zeros({ 2, 3 }, { dtype = "float32" }))  -- passable memory
--   x:set(4, 1.5)
--   assert(c:call("scale", { x = x, k = 2 }))    -- the endpoint writes into x
--
-- Rules (as in the C API, include/st/client.h):
--   * misuse (a wrong argument type, a closed client) raises an error;
--   * a runtime failure returns nil, "NAME: message" (NAME is the stable
--     error name of docs/errors.md), plus the name as a third value.
--   * Tensors are mapped, not copied: `t.data` is a pointer into shared
--     memory (a device address for CUDA tensors), valid while the result it
--     came from is alive. Each tensor table keeps its result alive.
--   * Tensor arguments: only memory from st.empty / st.zeros (or a view of
--     it: t:slice, t:narrow, t:transpose) passes to an endpoint; it goes by
--     descriptor and the endpoint reads and writes it in place. CUDA memory
--     is written by the caller's own streams: synchronize them first.
--
-- Arguments keep their exact values (strings byte for byte; st.null for a
-- nil inside a table keeps its place; st.map(t) sends an empty table as a
-- map): lua/st/args.lua says how each Lua value goes.
--
-- What it wraps: st.connect and the client methods close, ping, call,
-- get, info, endpoints, peers, submit, pull, replicate, status, wait,
-- result, cancel, release, ensure_live, invalidate, buffer_create,
-- buffer_open, buffer_unlink, reload and rpc (any method by name), with tensors, replies and buffers
-- through the modules below. Everything else the C headers declare (put,
-- delete, keys, objects, tasks, st_client_rpc_marshal, hand-offs, live keys, st_get_into, copies, the
-- open-cache, a buffer's frame-level calls, ...) is left to st.ffi, the
-- raw declarations: docs/client.md ("Lua (LuaJIT FFI)") lists them.
--
-- Modules: st.ffi (the library and its declarations), st.tensor (tensors,
-- views, st.empty / st.zeros), st.result (replies as Lua values), st.args
-- (Lua values as arguments), st.buffer (named buffers and streams),
-- st.client (this one: the connection, and
-- everything a user needs re-exported).
--
-- The library is found as st.ffi says ($ST_CLIENT_LIB, the install
-- prefix, the system loader).
local ffi = require("ffi")
local C = require("st.ffi")
local tensor = require("st.tensor")
local result = require("st.result")
local args = require("st.args")
local buffer = require("st.buffer")

local lib = C.lib
local wrap_result, int_value = result.wrap, result.int_value
local build_args = args.build

local M = {}

local call_out = ffi.new("st_result_t*[1]")
local call_summary = ffi.new("st_result_summary_t")

M.null = result.null
M.bytes = result.bytes
M.map = args.map
M.empty = tensor.empty
M.zeros = tensor.zeros

-- ------------------------------------------------------------- client

local Client = {}
Client.__index = Client

local function check_self(c, what)
  if getmetatable(c) ~= Client then error(what .. ": call it as client:" .. what .. "(...)", 3) end
  if not c._h then error(what .. ": the client is closed", 3) end
end

local function failure(c)
  local name = ffi.string(lib.st_client_error_name(c._h))
  return nil, name .. ": " .. ffi.string(lib.st_client_error(c._h)), name
end

local function check_name(name, what)
  if type(name) ~= "string" or name == "" then
    error(what .. ": the endpoint name must be a non-empty string", 3)
  end
end

local function check_id(id, what)
  if type(id) ~= "number" and not (type(id) == "cdata" and ffi.istype("uint64_t", id)) then
    error(what .. ": the id must be a number", 3)
  end
end

-- Connects: opts.path, or opts.device (default 0) with opts.base_path
-- (default $SHARED_TENSOR_BASE_PATH, else the first socket of the device
-- that exists in $XDG_RUNTIME_DIR/sharedtensor/st, /run/sharedtensor/st,
-- /tmp/shared-tensor: the library's search, st_socket_path);
-- opts.timeout_ms bounds connecting (connect and hello; default 10 s) and
-- then each reply (default: no bound); opts.server_uid is the uid the
-- server must run as, checked before anything is sent (AUTH otherwise;
-- default: $SHARED_TENSOR_SERVER_UID if set, else this process's uid or
-- root). Returns a client, or nil, err.
function M.connect(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("connect: expected a table of options", 2) end
  local o = ffi.new("st_client_options_t")
  lib.st_client_options_init(o)
  if opts.server_uid ~= nil then
    local u = opts.server_uid
    if type(u) ~= "number" or u < 0 or u ~= math.floor(u) then
      error("connect: server_uid must be a uid (an integer >= 0)", 2)
    end
    o.server_uid = u
  end
  if opts.timeout_ms ~= nil then
    local t = opts.timeout_ms
    if type(t) ~= "number" or t < 0 or t >= 2^31 then
      error("connect: timeout_ms must be a number of milliseconds >= 0", 2)
    end
    o.timeout_ms = t > 0 and math.max(1, math.floor(t)) or 0
  end
  local out = ffi.new("st_client_t*[1]")
  local err = ffi.new("char[1024]")
  local path, rc = opts.path, nil
  if path ~= nil then
    if type(path) ~= "string" then error("connect: path must be a string", 2) end
    rc = lib.st_client_connect_opts(path, o, out, err, 1024)
  else
    local device = opts.device or 0
    if type(device) ~= "number" or device < 0 or device ~= math.floor(device) then
      error("connect: device must be an integer >= 0", 2)
    end
    rc = lib.st_client_connect_device_opts(opts.base_path, device, o, out, err, 1024)
  end
  if rc ~= 0 then
    local name = C.err_name(rc)
    return nil, name .. ": " .. ffi.string(err), name
  end
  local c = setmetatable({ _h = ffi.gc(out[0], lib.st_client_close) }, Client)
  c.server_id = ffi.string(lib.st_client_server_id(c._h))
  return c
end

function Client:close()
  C.drop(self, lib.st_client_close)
end

-- Round trip in microseconds, or nil, err.
function Client:ping()
  check_self(self, "ping")
  local rtt = ffi.new("double[1]")
  if lib.st_client_ping(self._h, rtt) ~= 0 then return failure(self) end
  return rtt[0]
end

-- Calls an endpoint; returns a result ({value, object, :tensors(), :free()}).
-- opts (optional): { view = "spec" } sees the result through a view
-- (docs/views.md, section 1), { readonly = true } maps an object read-only.
-- Raises for an option `opts` does not know, or a readonly that is not a
-- boolean: nothing unknown is taken silently.
local function check_opts(fn, opts, known)
  for k, v in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(("%s: unknown option '%s' (allowed: %s)"):format(fn, tostring(k),
        table.concat(names, ", ")), 3)
    end
  end
  if opts.readonly ~= nil and type(opts.readonly) ~= "boolean" then
    error(("%s: opts.readonly must be true or false, not %s"):format(fn, tostring(opts.readonly)), 3)
  end
end

function Client:call(name, args, opts)
  check_self(self, "call")
  check_name(name, "call")
  local a = build_args(args, 2)
  if opts ~= nil then
    if type(opts) ~= "table" then error("call: opts must be a table", 2) end
    check_opts("call", opts, { view = true, readonly = true })
    if opts.view ~= nil and type(opts.view) ~= "string" then
      error("call: opts.view must be a string", 2)
    end
    local out = ffi.new("st_result_t*[1]")
    local flags = opts.readonly and lib.ST_CALL_READONLY or 0
    if lib.st_client_call_view(self._h, name, a, flags, opts.view, out) ~= 0 then
      return failure(self)
    end
    return wrap_result(out[0])
  end
  -- One crossing: the call and the summary of its reply. The buffers are
  -- read before wrap_result returns, so one pair serves every call. A
  -- `same` reply is lent: a result already held takes one st_result_ref
  -- and no free.
  if lib.st_client_call_summary(self._h, name, a, lib.ST_CALL_LEND_SAME, call_out,
                                call_summary) ~= 0 then
    return failure(self)
  end
  return wrap_result(call_out[0], call_summary, true)
end

-- A published key's value (docs/keys.md); returns a result and its version.
-- opts (optional): { version = N, readonly = true, view = "spec" }.
function Client:get(key, opts)
  check_self(self, "get")
  check_name(key, "get")
  opts = opts or {}
  if type(opts) ~= "table" then error("get: opts must be a table", 2) end
  check_opts("get", opts, { version = true, readonly = true, view = true })
  if opts.view ~= nil and type(opts.view) ~= "string" then
    error("get: opts.view must be a string", 2)
  end
  local out = ffi.new("st_result_t*[1]")
  local got = ffi.new("uint64_t[1]")
  local flags = opts.readonly and 1 or 0   -- ST_GET_READONLY
  if lib.st_client_get_view(self._h, key, opts.version or 0, flags, opts.view, out, got) ~= 0 then
    return failure(self)
  end
  return wrap_result(out[0]), int_value(got[0])
end

-- Runs `fn(handle[, arg], out)` for a method whose result is a plain value.
local function value_method(self, fn, arg, arg2)
  local out = ffi.new("st_result_t*[1]")
  local rc
  if arg2 ~= nil then rc = fn(self._h, arg, arg2, out)
  elseif arg ~= nil then rc = fn(self._h, arg, out)
  else rc = fn(self._h, out) end
  if rc ~= 0 then return failure(self) end
  local res = wrap_result(out[0])
  local v = res.value
  res:free()
  return v
end

-- Any method of docs/protocol.md by name, with named parameters (a table,
-- or nil); returns a result ({value, :tensors(), :free()}), as call does,
-- so a method whose reply carries descriptors maps them too.
function Client:rpc(method, params)
  check_self(self, "rpc")
  check_name(method, "rpc")
  local a = params ~= nil and build_args(params, 2) or nil
  local out = ffi.new("st_result_t*[1]")
  if lib.st_client_rpc(self._h, method, a, out) ~= 0 then return failure(self) end
  return wrap_result(out[0])
end

function Client:info()
  check_self(self, "info")
  return value_method(self, lib.st_client_info)
end

function Client:peers()
  check_self(self, "peers")
  return value_method(self, lib.st_client_peers)
end

function Client:endpoints()
  check_self(self, "endpoints")
  return value_method(self, lib.st_client_endpoints)
end

-- Queues a build as a task; returns the task id.
function Client:submit(name, args)
  check_self(self, "submit")
  check_name(name, "submit")
  local a = build_args(args, 2)
  local id = ffi.new("uint64_t[1]")
  if lib.st_client_submit(self._h, name, a, id) ~= 0 then return failure(self) end
  return int_value(id[0])
end

-- The readers option ({ uids = {...}, gids = {...} }) as an st_readers_t
-- whose arrays the returned table keeps alive; nil for nil.
local function readers_of(r, what)
  if r == nil then return nil end
  if type(r) ~= "table" then error(what .. ": opts.readers must be a table { uids, gids }", 3) end
  local keep = { st = ffi.new("st_readers_t") }
  for _, k in ipairs({ "uids", "gids" }) do
    local list = r[k] or {}
    if type(list) ~= "table" then error(what .. ": opts.readers." .. k .. " must be a list", 3) end
    local arr = ffi.new("uint32_t[?]", math.max(#list, 1))
    for i, id in ipairs(list) do
      if type(id) ~= "number" or id < 0 or id ~= math.floor(id) or id >= 2^32 then
        error(("%s: opts.readers.%s[%d] must be an id (an integer >= 0)"):format(what, k, i), 3)
      end
      arr[i - 1] = id
    end
    keep[k] = arr
    keep.st[k] = arr
    keep.st["n" .. k] = #list
  end
  for k in pairs(r) do
    if k ~= "uids" and k ~= "gids" then
      error(what .. ": opts.readers takes uids and gids, not " .. tostring(k), 3)
    end
  end
  return keep
end

local function check_version(v, what)
  if v ~= nil and (type(v) ~= "number" or v < 1 or v ~= math.floor(v)) then
    error(what .. ": opts.version must be an integer >= 1", 3)
  end
end

local function check_string(v, what, name)
  if v ~= nil and (type(v) ~= "string" or v == "") then
    error(what .. ": opts." .. name .. " must be a non-empty string", 3)
  end
end

-- Copies `key` published on peer `from` (docs/multihost.md) into this
-- server as a task; returns the task id (follow it with wait, status,
-- result, cancel; the result's value is { key, version, origin = { peer,
-- key, version }, bytes, seconds }), or nil, err. opts (optional):
-- { version = N, as = "name here", device = "cpu" | "cuda" | "cuda:N",
--   policy = "pinned" | "evictable", readers = { uids, gids },
--   live = true (the peer's live key, followed: docs/multihost.md, "Live
--   replication"; unsubscribe and replicas below) }.
function Client:pull(key, from, opts)
  check_self(self, "pull")
  check_name(key, "pull")
  if type(from) ~= "string" or from == "" then error("pull: the peer id must be a non-empty string", 2) end
  opts = opts or {}
  if type(opts) ~= "table" then error("pull: opts must be a table", 2) end
  check_opts("pull", opts, { version = true, as = true, device = true, policy = true, readers = true,
                             live = true })
  if opts.live ~= nil and type(opts.live) ~= "boolean" then
    error("pull: opts.live must be true or false", 2)
  end
  check_version(opts.version, "pull")
  check_string(opts.as, "pull", "as")
  check_string(opts.device, "pull", "device")
  local policy = 0
  if opts.policy == "evictable" then policy = 1
  elseif opts.policy ~= nil and opts.policy ~= "pinned" then
    error("pull: opts.policy must be \"pinned\" or \"evictable\"", 2)
  end
  local readers = readers_of(opts.readers, "pull")
  local o = ffi.new("st_pull_opts_t")
  o.version = opts.version or 0
  o.as = opts.as
  o.device = opts.device
  o.policy = policy
  o.live = opts.live and 1 or 0
  if readers then o.readers = readers.st end
  local id = ffi.new("uint64_t[1]")
  local rc = lib.st_client_pull(self._h, key, from, o, id)
  local _ = readers   -- the arrays live until the call returned
  if rc ~= 0 then return failure(self) end
  return int_value(id[0])
end

-- Ends the subscription of live replica `key` (pull with live = true);
-- the key stays with its version, which is returned; or nil, err.
function Client:unsubscribe(key)
  check_self(self, "unsubscribe")
  check_name(key, "unsubscribe")
  local v = ffi.new("uint64_t[1]")
  if lib.st_client_unsubscribe(self._h, key, v) ~= 0 then return failure(self) end
  return int_value(v[0])
end

-- Who follows this server's key `key`, and what `key` here follows:
-- { key, subscribers = { { peer, version, since } }, source = { peer,
-- key, version, updates, torn, lost, why } or nil }; or nil, err.
function Client:replicas(key)
  check_self(self, "replicas")
  check_name(key, "replicas")
  return value_method(self, lib.st_client_replicas, key)
end

-- Pushes `key` of this server to each peer of `to` (a list of peer ids)
-- as a task; returns the task id, or nil, err. Each peer pulls it under
-- the uid its config names for this server (peer.peers[id].as_uid there).
-- The result's value, when every peer holds the version: { key, version,
-- peers = { [id] = { ok, version } } }; else the task fails naming each
-- peer's outcome.
-- opts (optional): { version = N, as = "name on the peers" }.
function Client:replicate(key, to, opts)
  check_self(self, "replicate")
  check_name(key, "replicate")
  if type(to) == "string" then to = { to } end
  if type(to) ~= "table" or #to == 0 then error("replicate: to must be a list of peer ids", 2) end
  opts = opts or {}
  if type(opts) ~= "table" then error("replicate: opts must be a table", 2) end
  check_opts("replicate", opts, { version = true, as = true })
  check_version(opts.version, "replicate")
  check_string(opts.as, "replicate", "as")
  local ids = ffi.new("const char *[?]", #to)
  for i, p in ipairs(to) do
    if type(p) ~= "string" or p == "" then error("replicate: to[" .. i .. "] must be a peer id", 2) end
    ids[i - 1] = p
  end
  local o = ffi.new("st_replicate_opts_t")
  o.version = opts.version or 0
  o.as = opts.as
  local id = ffi.new("uint64_t[1]")
  local rc = lib.st_client_replicate(self._h, key, ids, #to, o, id)
  local _ = to   -- the strings live until the call returned
  if rc ~= 0 then return failure(self) end
  return int_value(id[0])
end

function Client:status(id)
  check_self(self, "status")
  check_id(id, "status")
  return value_method(self, lib.st_client_task_status, id)
end

-- Waits until the task ends or `timeout_s` (default 30) passes; returns its
-- info either way (info.status tells which).
function Client:wait(id, timeout_s)
  check_self(self, "wait")
  check_id(id, "wait")
  if timeout_s ~= nil and type(timeout_s) ~= "number" then error("wait: timeout must be seconds", 2) end
  return value_method(self, lib.st_client_task_wait, id, timeout_s or 30)
end

-- The result of a finished task, like call's.
function Client:result(id)
  check_self(self, "result")
  check_id(id, "result")
  local out = ffi.new("st_result_t*[1]")
  if lib.st_client_task_result(self._h, id, out) ~= 0 then return failure(self) end
  return wrap_result(out[0])
end

function Client:cancel(id)
  check_self(self, "cancel")
  check_id(id, "cancel")
  return value_method(self, lib.st_client_task_cancel, id)
end

-- Gives back this connection's lease: { released, destroyed, refcount }.
-- wait == false sends it without waiting for the answer (true): the
-- server handles it before this client's next request.
function Client:release(object_id, wait)
  check_self(self, "release")
  check_id(object_id, "release")
  if wait == false then
    if lib.st_client_release(self._h, object_id, nil, nil, nil) ~= 0 then return failure(self) end
    return true
  end
  local rel, des, ref = ffi.new("int[1]"), ffi.new("int[1]"), ffi.new("int64_t[1]")
  if lib.st_client_release(self._h, object_id, rel, des, ref) ~= 0 then return failure(self) end
  return { released = rel[0] ~= 0, destroyed = des[0] ~= 0, refcount = tonumber(ref[0]) }
end

-- true when the object is still live on this server, else nil, err.
function Client:ensure_live(object_id, server_id)
  check_self(self, "ensure_live")
  check_id(object_id, "ensure_live")
  if lib.st_client_ensure_live(self._h, object_id, server_id) ~= 0 then return failure(self) end
  return true
end

-- With args: drops the cache entry of that call (returns whether one
-- existed). Without: drops every entry of the endpoint (returns the count).
function Client:invalidate(name, args)
  check_self(self, "invalidate")
  check_name(name, "invalidate")
  if args == nil then
    local count = ffi.new("int64_t[1]")
    if lib.st_client_invalidate_endpoint(self._h, name, count) ~= 0 then return failure(self) end
    return tonumber(count[0])
  end
  local a = build_args(args, 2)
  local dropped = ffi.new("int[1]")
  if lib.st_client_invalidate_call(self._h, name, a, dropped) ~= 0 then return failure(self) end
  return dropped[0] ~= 0
end

-- Reloads the endpoints; returns { ok, generation, error, changed, added, removed }.
-- Named buffers and streams (st.buffer, docs/streams.md): a Buffer, or
-- nil, err.
function Client:buffer_create(name, shape, opts)
  check_self(self, "buffer_create")
  return buffer.create(self, name, shape, opts)
end

function Client:buffer_open(name, opts)
  check_self(self, "buffer_open")
  return buffer.open(self, name, opts)
end

function Client:buffer_unlink(name)
  check_self(self, "buffer_unlink")
  return buffer.unlink(self, name)
end

function Client:reload()
  check_self(self, "reload")
  return value_method(self, lib.st_client_reload)
end

M.Tensor = tensor.Tensor
return M

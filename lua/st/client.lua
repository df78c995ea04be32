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
-- Rules (as in the C API, include/st/client.h):
--   * misuse (a wrong argument type, a closed client) raises an error;
--   * a runtime failure returns nil, "NAME: message" (NAME is the stable
--     error name of docs/errors.md), plus the name as a third value.
--   * Tensors are mapped, not copied: `t.data` is a pointer into shared
--     memory (a device address for CUDA tensors), valid while the result it
--     came from is alive. Each tensor table keeps its result alive.
--
-- The library is found through $ST_CLIENT_LIB (a path), else the system
-- loader's search for "stclient" (LD_LIBRARY_PATH, ldconfig).
local ffi = require("ffi")

ffi.cdef [[
typedef struct st_client st_client_t;
typedef struct st_args st_args_t;
typedef struct st_result st_result_t;
typedef struct st_tensor {
  const char *name; void *data; int dtype; int ndim;
  const int64_t *shape; const int64_t *strides;
  int64_t numel; size_t nbytes; int device; int device_index; const char *device_uuid;
} st_tensor_t;
typedef struct st_value st_value_t;
struct st_value {
  int kind;
  union {
    int boolean; int64_t integer; double number;
    struct { const char *ptr; size_t len; } str;
    struct { const st_value_t *items; size_t len; } array;
    struct { const st_value_t *keys; const st_value_t *values; size_t len; } map;
    const st_tensor_t *tensor;
    struct { const st_tensor_t *const *tensors; size_t len; const st_value_t *metadata; } module;
  } as;
};
typedef struct st_object_info {
  uint64_t id; const char *server_id; const char *cache_key; const char *device;
  int cached; int managed; int lease; int64_t refcount; uint64_t bytes;
} st_object_info_t;

const char *st_err_name(int err);
const char *st_dtype_name(int dtype);
double st_tensor_get(const st_tensor_t *t, int64_t linear);
const st_value_t *st_result_value(const st_result_t *r);
int st_result_object(const st_result_t *r, st_object_info_t *out);
void st_result_free(st_result_t *r);
st_args_t *st_args_new(void);
void st_args_free(st_args_t *a);
int st_args_nil(st_args_t *a, const char *key);
int st_args_bool(st_args_t *a, const char *key, int v);
int st_args_int(st_args_t *a, const char *key, int64_t v);
int st_args_float(st_args_t *a, const char *key, double v);
int st_args_string(st_args_t *a, const char *key, const char *v);
int st_args_parse_kv(st_args_t *a, const char *word, char *err, size_t errlen);
int st_client_connect(const char *path, st_client_t **out, char *err, size_t errlen);
int st_client_connect_device(const char *base, int device, st_client_t **out, char *err, size_t errlen);
void st_client_close(st_client_t *c);
const char *st_client_error(const st_client_t *c);
const char *st_client_error_name(const st_client_t *c);
void st_client_set_timeout(st_client_t *c, int timeout_ms);
const char *st_client_server_id(const st_client_t *c);
int st_client_ping(st_client_t *c, double *rtt_us);
int st_client_call(st_client_t *c, const char *endpoint, const st_args_t *args, st_result_t **out);
int st_client_info(st_client_t *c, st_result_t **out);
int st_client_endpoints(st_client_t *c, st_result_t **out);
int st_client_submit(st_client_t *c, const char *endpoint, const st_args_t *args, uint64_t *task_id);
int st_client_task_status(st_client_t *c, uint64_t id, st_result_t **info);
int st_client_task_wait(st_client_t *c, uint64_t id, double timeout_s, st_result_t **info);
int st_client_task_result(st_client_t *c, uint64_t id, st_result_t **out);
int st_client_task_cancel(st_client_t *c, uint64_t id, st_result_t **info);
int st_client_release(st_client_t *c, uint64_t object_id, int *released, int *destroyed, int64_t *refcount);
int st_client_ensure_live(st_client_t *c, uint64_t object_id, const char *server_id);
int st_client_invalidate_call(st_client_t *c, const char *endpoint, const st_args_t *args, int *dropped);
int st_client_invalidate_endpoint(st_client_t *c, const char *endpoint, int64_t *count);
int st_client_reload(st_client_t *c, st_result_t **out);
]]

local lib = ffi.load(os.getenv("ST_CLIENT_LIB") or "stclient")

local M = {}

-- Stands for msgpack nil inside arrays and maps (Lua tables cannot hold nil).
M.null = setmetatable({}, { __tostring = function() return "st.null" end })

local V = { NIL = 0, BOOL = 1, INT = 2, FLOAT = 3, STRING = 4, BINARY = 5, ARRAY = 6,
            MAP = 7, TENSOR = 8, MODULE = 9 }

-- ------------------------------------------------------------- tensors

local Tensor = {}
Tensor.__index = Tensor

-- Element `i` (0-based, row-major over the shape, strides honoured) as a
-- Lua number. CUDA tensors are copied element by element: for inspection.
function Tensor:get(i)
  if type(i) ~= "number" or i < 0 or i >= self.numel then
    error(("get: index %s outside 0..%d"):format(tostring(i), self.numel - 1), 2)
  end
  return lib.st_tensor_get(self._c, i)
end

-- The elements as a flat Lua array (row-major). For small tensors.
function Tensor:tolist()
  local out = {}
  for i = 0, self.numel - 1 do out[i + 1] = lib.st_tensor_get(self._c, i) end
  return out
end

-- `data` as a typed pointer, e.g. t:ptr("float") for a float32 CPU tensor.
function Tensor:ptr(ctype)
  return ffi.cast(ctype .. "*", self.data)
end

function Tensor:__tostring()
  return ("tensor(%s, {%s}, %s)"):format(self.dtype, table.concat(self.shape, ", "), self.device)
end

local function wrap_tensor(t, owner)
  local shape, strides = {}, {}
  for d = 0, t.ndim - 1 do
    shape[d + 1] = tonumber(t.shape[d])
    strides[d + 1] = tonumber(t.strides[d])
  end
  local device = t.device == 1 and ("cuda:" .. t.device_index) or "cpu"
  return setmetatable({
    name = ffi.string(t.name), data = t.data, dtype = ffi.string(lib.st_dtype_name(t.dtype)),
    shape = shape, strides = strides, numel = tonumber(t.numel), nbytes = tonumber(t.nbytes),
    device = device, uuid = ffi.string(t.device_uuid), _c = t, _owner = owner,
  }, Tensor)
end

-- ------------------------------------------------------------- values

local function int_value(v)
  local n = tonumber(v)
  -- Integers beyond 2^53 stay exact as int64 cdata.
  if n >= -2 ^ 53 and n <= 2 ^ 53 then return n end
  return v
end

local convert
-- Stack depth is bounded: the server refuses values nested deeper than 32.
convert = function(v, owner)
  local k = v.kind
  if k == V.NIL then return M.null end
  if k == V.BOOL then return v.as.boolean ~= 0 end
  if k == V.INT then return int_value(v.as.integer) end
  if k == V.FLOAT then return v.as.number end
  if k == V.STRING or k == V.BINARY then return ffi.string(v.as.str.ptr, v.as.str.len) end
  if k == V.ARRAY then
    local out = {}
    for i = 0, tonumber(v.as.array.len) - 1 do out[i + 1] = convert(v.as.array.items[i], owner) end
    return out
  end
  if k == V.MAP then
    local out = {}
    for i = 0, tonumber(v.as.map.len) - 1 do
      out[convert(v.as.map.keys[i], owner)] = convert(v.as.map.values[i], owner)
    end
    return out
  end
  if k == V.TENSOR then return wrap_tensor(v.as.tensor, owner) end
  if k == V.MODULE then
    local m = { names = {}, tensors = {}, metadata = convert(v.as.module.metadata[0], owner) }
    for i = 0, tonumber(v.as.module.len) - 1 do
      local t = wrap_tensor(v.as.module.tensors[i], owner)
      -- A module tensor's name is its path in the result ("weight", or
      -- "model.weight" inside a map); its own name is the last part.
      local short = t.name:match("([^.]+)$") or t.name
      m.names[#m.names + 1] = short
      m.tensors[short] = t
    end
    return m
  end
  error("st.client: unknown value kind " .. tostring(k))
end

-- ------------------------------------------------------------- results

local Result = {}
Result.__index = Result

local function object_of(r)
  local o = ffi.new("st_object_info_t")
  if lib.st_result_object(r, o) ~= 0 then return nil end
  return {
    id = int_value(o.id), server_id = ffi.string(o.server_id), cache_key = ffi.string(o.cache_key),
    device = ffi.string(o.device), cached = o.cached ~= 0, managed = o.managed ~= 0,
    lease = o.lease ~= 0, refcount = tonumber(o.refcount), bytes = tonumber(o.bytes),
  }
end

-- Wraps an owned st_result_t*: freed by res:free() or by the GC.
local function wrap_result(ptr)
  local handle = ffi.gc(ptr, lib.st_result_free)
  local res = setmetatable({ _h = handle }, Result)
  res.value = convert(lib.st_result_value(handle), res)
  res.object = object_of(handle)
  return res
end

-- Unmaps now (when no other result maps the same allocation). Tensors of
-- this result must not be used afterwards.
function Result:free()
  if self._h then
    lib.st_result_free(ffi.gc(self._h, nil))
    self._h = nil
  end
end

-- Every tensor of the result, depth-first, as { name = tensor } and a list.
function Result:tensors()
  local list, by_name = {}, {}
  local function walk(v)
    if getmetatable(v) == Tensor then
      list[#list + 1] = v
      by_name[v.name] = v
    elseif type(v) == "table" and v ~= M.null then
      if v.names and v.tensors then
        for _, n in ipairs(v.names) do walk(v.tensors[n]) end
      else
        for _, x in pairs(v) do walk(x) end
      end
    end
  end
  walk(self.value)
  return list, by_name
end

-- ------------------------------------------------------------- arguments

local function json_encode(v, depth)
  depth = depth or 0
  if depth > 32 then error("argument nested deeper than 32", 0) end
  local t = type(v)
  if v == M.null then return "null" end
  if t == "boolean" then return v and "true" or "false" end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then error("argument is not finite", 0) end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
  end
  if t == "string" then
    return '"' .. v:gsub('[%c"\\]', function(ch)
      return ("\\u%04x"):format(ch:byte())
    end) .. '"'
  end
  if t == "table" then
    local n = #v
    local is_array = n > 0 or next(v) == nil
    if is_array then
      for k in pairs(v) do
        if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then is_array = false; break end
      end
    end
    local parts = {}
    if is_array then
      for i = 1, n do parts[i] = json_encode(v[i], depth + 1) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    for k, x in pairs(v) do
      if type(k) ~= "string" then error("map keys must be strings", 0) end
      parts[#parts + 1] = json_encode(k) .. ":" .. json_encode(x, depth + 1)
    end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  error("cannot send a " .. t, 0)
end

-- A Lua table of named arguments as an owned st_args_t (GC-freed).
local function build_args(args, level)
  if args == nil then return nil end
  if type(args) ~= "table" then error("arguments must be a table of name = value", level + 1) end
  local a = ffi.gc(lib.st_args_new(), lib.st_args_free)
  local err = ffi.new("char[256]")
  for k, v in pairs(args) do
    if type(k) ~= "string" then error("argument names must be strings", level + 1) end
    local t, rc = type(v), 0
    if v == M.null then rc = lib.st_args_nil(a, k)
    elseif t == "boolean" then rc = lib.st_args_bool(a, k, v and 1 or 0)
    elseif t == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then rc = lib.st_args_int(a, k, v)
    elseif t == "number" then rc = lib.st_args_float(a, k, v)
    elseif t == "string" then rc = lib.st_args_string(a, k, v)
    elseif t == "table" then
      local ok, json = pcall(json_encode, v)
      if not ok then error(("argument '%s': %s"):format(k, json), level + 1) end
      rc = lib.st_args_parse_kv(a, k .. ":json=" .. json, err, 256)
      if rc ~= 0 then error(("argument '%s': %s"):format(k, ffi.string(err)), level + 1) end
    else
      error(("argument '%s': cannot send a %s"):format(k, t), level + 1)
    end
    if rc ~= 0 then error("out of memory building arguments", level + 1) end
  end
  return a
end

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
-- (default $SHARED_TENSOR_BASE_PATH, else /tmp/shared-tensor); opts.timeout_ms
-- bounds each reply (default: no bound). Returns a client, or nil, err.
function M.connect(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("connect: expected a table of options", 2) end
  local out = ffi.new("st_client_t*[1]")
  local err = ffi.new("char[512]")
  local rc
  if opts.path ~= nil then
    if type(opts.path) ~= "string" then error("connect: path must be a string", 2) end
    rc = lib.st_client_connect(opts.path, out, err, 512)
  else
    local device = opts.device or 0
    if type(device) ~= "number" or device < 0 or device ~= math.floor(device) then
      error("connect: device must be an integer >= 0", 2)
    end
    rc = lib.st_client_connect_device(opts.base_path, device, out, err, 512)
  end
  if rc ~= 0 then
    local name = ffi.string(lib.st_err_name(rc))
    return nil, name .. ": " .. ffi.string(err), name
  end
  local c = setmetatable({ _h = ffi.gc(out[0], lib.st_client_close) }, Client)
  if opts.timeout_ms then lib.st_client_set_timeout(c._h, opts.timeout_ms) end
  c.server_id = ffi.string(lib.st_client_server_id(c._h))
  return c
end

function Client:close()
  if self._h then
    lib.st_client_close(ffi.gc(self._h, nil))
    self._h = nil
  end
end

-- Round trip in microseconds, or nil, err.
function Client:ping()
  check_self(self, "ping")
  local rtt = ffi.new("double[1]")
  if lib.st_client_ping(self._h, rtt) ~= 0 then return failure(self) end
  return rtt[0]
end

-- Calls an endpoint; returns a result ({value, object, :tensors(), :free()}).
function Client:call(name, args)
  check_self(self, "call")
  check_name(name, "call")
  local a = build_args(args, 2)
  local out = ffi.new("st_result_t*[1]")
  if lib.st_client_call(self._h, name, a, out) ~= 0 then return failure(self) end
  return wrap_result(out[0])
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

function Client:info()
  check_self(self, "info")
  return value_method(self, lib.st_client_info)
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
function Client:release(object_id)
  check_self(self, "release")
  check_id(object_id, "release")
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
function Client:reload()
  check_self(self, "reload")
  return value_method(self, lib.st_client_reload)
end

M.Tensor = Tensor
return M

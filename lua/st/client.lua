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
int st_dtype_from_name(const char *name);
size_t st_dtype_size(int dtype);
void st_dtype_store(int dtype, void *base, size_t i, double v);
double st_tensor_get(const st_tensor_t *t, int64_t linear);
int st_tensor_alloc(const char *device, int dtype, int ndim, const int64_t *shape,
                    st_result_t **out, char *err, size_t errlen);
int st_args_tensor(st_args_t *a, const char *key, const st_tensor_t *t, char *err, size_t errlen);
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

local ERR_INVALID_ARGUMENT = -14   -- ST_ERR_INVALID_ARGUMENT

local wrap_tensor

local function check_tensor(t, what)
  if getmetatable(t) ~= Tensor then error(what .. ": call it as tensor:" .. what .. "(...)", 3) end
end

local function check_index(t, i, what)
  if type(i) ~= "number" or i ~= math.floor(i) or i < 0 or i >= t.numel then
    error(("%s: index %s outside 0..%d"):format(what, tostring(i), t.numel - 1), 3)
  end
end

-- Element offset from `data` of linear index i (row-major over the shape).
local function element_offset(t, i)
  local off = 0
  for d = #t.shape, 1, -1 do
    local size = t.shape[d]
    local r = i % size
    off = off + r * t.strides[d]
    i = (i - r) / size
  end
  return off
end

-- Element `i` (0-based, row-major over the shape, strides honoured) as a
-- Lua number. CUDA tensors are copied element by element: for inspection.
function Tensor:get(i)
  check_index(self, i, "get")
  return lib.st_tensor_get(self._c, i)
end

-- Stores `v` (a number; a boolean is 1 or 0) as element `i` (0-based,
-- row-major, strides honoured), converted to the tensor's dtype as the
-- server converts (st_dtype_store). CPU tensors only. Returns the tensor.
function Tensor:set(i, v)
  check_tensor(self, "set")
  check_index(self, i, "set")
  if type(v) == "boolean" then
    v = v and 1 or 0
  elseif type(v) ~= "number" then
    error("set: the value must be a number or a boolean", 2)
  end
  if self._c.device ~= 0 then
    error("set: " .. self.device .. " memory is written on the device, not element by element", 2)
  end
  lib.st_dtype_store(self._c.dtype, self.data, element_offset(self, i), v)
  return self
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

-- PyTorch's rule: dims of size 1 do not count.
function Tensor:is_contiguous()
  local expect = 1
  for d = #self.shape, 1, -1 do
    if self.shape[d] ~= 1 and self.strides[d] ~= expect then return false end
    expect = expect * self.shape[d]
  end
  return true
end

function Tensor:__tostring()
  return ("tensor(%s, {%s}, %s)"):format(self.dtype, table.concat(self.shape, ", "), self.device)
end

-- ------------------------------------------------------------- views
--
-- Views share the memory (and the result) of their source; dims are
-- 0-based and negative ones count from the end, as in endpoints
-- (docs/endpoints.md, "Tensor methods"). A view of a tensor from st.empty
-- passes to endpoints like the tensor itself.

-- A tensor table `offset` elements past self.data with another geometry.
local function make_view(self, offset, shape, strides)
  local n = #shape
  local dims = ffi.new("int64_t[?]", n > 0 and 2 * n or 1)
  local numel = 1
  for d = 1, n do
    dims[d - 1], dims[n + d - 1] = shape[d], strides[d]
    numel = numel * shape[d]
  end
  local src = self._c
  local esize = tonumber(lib.st_dtype_size(src.dtype))
  local c = ffi.new("st_tensor_t")
  c.name, c.dtype, c.ndim = src.name, src.dtype, n
  c.data = ffi.cast("char *", src.data) + offset * esize
  c.shape, c.strides = dims, dims + n
  c.numel, c.nbytes = numel, numel * esize
  c.device, c.device_index, c.device_uuid = src.device, src.device_index, src.device_uuid
  local t = wrap_tensor(c, self._owner)
  t._dims = dims   -- c points into it
  return t
end

local function dim_of(t, dim, what)
  local n = #t.shape
  if type(dim) ~= "number" or dim ~= math.floor(dim) or dim < -n or dim >= n then
    error(("%s: dim %s outside %d..%d"):format(what, tostring(dim), -n, n - 1), 3)
  end
  return dim < 0 and dim + n + 1 or dim + 1
end

local function integer(v, what, name)
  if type(v) ~= "number" or v ~= math.floor(v) then
    error(("%s: %s must be an integer"):format(what, name), 3)
  end
  return v
end

local function copy_list(l)
  local out = {}
  for i = 1, #l do out[i] = l[i] end
  return out
end

-- Elements start, start + step, ... below stop along `dim`: Python-style
-- bounds (negative ones count from the end; clamped), stop defaults to the
-- size, step > 0.
function Tensor:slice(dim, start, stop, step)
  check_tensor(self, "slice")
  local d = dim_of(self, dim, "slice")
  local size = self.shape[d]
  start = integer(start or 0, "slice", "start")
  stop = integer(stop or size, "slice", "stop")
  step = integer(step or 1, "slice", "step")
  if step < 1 then error("slice: step must be > 0", 2) end
  if start < 0 then start = start + size end
  if stop < 0 then stop = stop + size end
  start = math.min(math.max(start, 0), size)
  stop = math.min(math.max(stop, start), size)
  local shape, strides = copy_list(self.shape), copy_list(self.strides)
  shape[d] = math.floor((stop - start + step - 1) / step)
  strides[d] = self.strides[d] * step
  return make_view(self, start * self.strides[d], shape, strides)
end

-- `length` elements from `start` along `dim`.
function Tensor:narrow(dim, start, length)
  check_tensor(self, "narrow")
  local d = dim_of(self, dim, "narrow")
  start = integer(start, "narrow", "start")
  length = integer(length, "narrow", "length")
  local size = self.shape[d]
  if start < 0 then start = start + size end
  if start < 0 or length < 0 or start + length > size then
    error(("narrow: start %d + length %d exceeds size %d of dim %d"):format(start, length, size,
      d - 1), 2)
  end
  local shape = copy_list(self.shape)
  shape[d] = length
  return make_view(self, start * self.strides[d], shape, self.strides)
end

-- Dims d0 and d1 swapped.
function Tensor:transpose(d0, d1)
  check_tensor(self, "transpose")
  local a, b = dim_of(self, d0, "transpose"), dim_of(self, d1, "transpose")
  local shape, strides = copy_list(self.shape), copy_list(self.strides)
  shape[a], shape[b] = shape[b], shape[a]
  strides[a], strides[b] = strides[b], strides[a]
  return make_view(self, 0, shape, strides)
end

-- Copies src's elements into this tensor (same shape; values converted
-- through a double as st_dtype_store does; a byte copy when both are
-- contiguous with one dtype). CPU tensors only. Returns the tensor.
function Tensor:copy_(src)
  check_tensor(self, "copy_")
  if getmetatable(src) ~= Tensor then error("copy_: the source must be a tensor", 2) end
  local same = #src.shape == #self.shape
  for d = 1, #self.shape do same = same and src.shape[d] == self.shape[d] end
  if not same then
    error(("copy_: shapes differ: {%s} and {%s}"):format(table.concat(self.shape, ", "),
      table.concat(src.shape, ", ")), 2)
  end
  if self._c.device ~= 0 or src._c.device ~= 0 then error("copy_: CPU tensors only", 2) end
  if src.dtype == self.dtype and self:is_contiguous() and src:is_contiguous() then
    if self.nbytes > 0 then ffi.copy(self.data, src.data, self.nbytes) end
  else
    for i = 0, self.numel - 1 do
      lib.st_dtype_store(self._c.dtype, self.data, element_offset(self, i),
                         lib.st_tensor_get(src._c, i))
    end
  end
  return self
end

-- A Lua table for a borrowed st_tensor_t* (or an st_tensor_t cdata of a
-- view) of `owner`, which the table keeps alive.
wrap_tensor = function(t, owner)
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

-- ------------------------------------------------------------- allocation

-- A zero-filled contiguous tensor in memory that endpoints can take as an
-- argument (st_tensor_alloc: a sealed memfd on the CPU, an exported VMM
-- allocation on a GPU). shape: a table of sizes (or one number); opts.dtype
-- (default "float32"), opts.device ("cpu", default; "cuda"; "cuda:N").
local function alloc(what, shape, opts)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" then error(what .. ": shape must be a table of sizes", 3) end
  opts = opts or {}
  if type(opts) ~= "table" then error(what .. ": options must be a table {dtype=, device=}", 3) end
  local n = #shape
  if n > 16 then error(what .. ": at most 16 dims", 3) end
  local dims = ffi.new("int64_t[?]", n > 0 and n or 1)
  for d = 1, n do
    local size = shape[d]
    if type(size) ~= "number" or size < 0 or size ~= math.floor(size) then
      error(("%s: size %d must be an integer >= 0"):format(what, d), 3)
    end
    dims[d - 1] = size
  end
  local dtype = opts.dtype or "float32"
  if type(dtype) ~= "string" or lib.st_dtype_from_name(dtype) == 0 then
    error(what .. ": unknown dtype " .. tostring(dtype), 3)
  end
  local device = opts.device or "cpu"
  if type(device) ~= "string" then error(what .. ": device must be a string (\"cpu\", \"cuda:N\")", 3) end
  local out = ffi.new("st_result_t*[1]")
  local err = ffi.new("char[256]")
  local rc = lib.st_tensor_alloc(device, lib.st_dtype_from_name(dtype), n, dims, out, err, 256)
  if rc == ERR_INVALID_ARGUMENT then error(what .. ": " .. ffi.string(err), 3) end
  if rc ~= 0 then
    local name = ffi.string(lib.st_err_name(rc))
    return nil, name .. ": " .. ffi.string(err), name
  end
  return wrap_result(out[0]).value
end

-- A new tensor to pass to endpoints; its memory is zero-filled (as every
-- allocation is). Returns the tensor, or nil, err (no CUDA device, out of
-- memory); a malformed shape, dtype or device raises.
function M.empty(shape, opts)
  local t, err, name = alloc("empty", shape, opts)
  return t, err, name
end

-- The same as empty: the memory starts zeroed.
function M.zeros(shape, opts)
  local t, err, name = alloc("zeros", shape, opts)
  return t, err, name
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
    if getmetatable(v) == Tensor then
      error("a tensor goes only as an argument of its own (name = tensor), not inside a table", 0)
    end
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

-- The error for a tensor argument st_args_tensor refused.
local function tensor_arg_error(k, v, msg)
  if not msg:find("st_tensor_alloc", 1, true) then return ("argument '%s': %s"):format(k, msg) end
  return ("argument '%s': this %s tensor's memory was not allocated with st.empty or st.zeros " ..
    "(a result's tensors are the server's memory); only such memory passes to an endpoint: " ..
    "allocate it with st.empty(shape, { dtype =, device = }), or copy into one: " ..
    "st.empty(t.shape, { dtype = t.dtype }):copy_(t)"):format(k, v.device)
end

-- A Lua table of named arguments as an owned st_args_t (GC-freed). Tensor
-- values (from st.empty/st.zeros, or views of them) go by descriptor: the
-- map keeps their allocation until it is freed.
local function build_args(args, level)
  if args == nil then return nil end
  if type(args) ~= "table" then error("arguments must be a table of name = value", level + 1) end
  local a = ffi.gc(lib.st_args_new(), lib.st_args_free)
  local err = ffi.new("char[256]")
  for k, v in pairs(args) do
    if type(k) ~= "string" then error("argument names must be strings", level + 1) end
    local t, rc = type(v), 0
    if getmetatable(v) == Tensor then
      rc = lib.st_args_tensor(a, k, v._c, err, 256)
      if rc == ERR_INVALID_ARGUMENT then error(tensor_arg_error(k, v, ffi.string(err)), level + 1) end
    elseif v == M.null then rc = lib.st_args_nil(a, k)
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

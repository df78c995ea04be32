-- st.tensor: tensors of the Lua client: reading and writing elements,
-- views (slice, narrow, transpose), copies, and the memory endpoints can
-- take as arguments (st.empty, st.zeros). Part of st.client, which
-- re-exports what users need (docs/client.md, "Lua client").
--
-- A tensor is a Lua table over a borrowed st_tensor_t (`_c`) that keeps
-- its owner (`_owner`: the result it came from, or the allocation) alive:
-- `data` points into shared memory (a device address for CUDA tensors),
-- valid while the table lives.
local ffi = require("ffi")
local C = require("st.ffi")

local lib = C.lib
local CPU = lib.ST_DEVICE_CPU
local CUDA = lib.ST_DEVICE_CUDA

local M = {}

local Tensor = {}
Tensor.__index = Tensor
M.Tensor = Tensor

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

-- dtype code -> its name, asked of the library once per code.
local dtype_names = setmetatable({}, { __index = function(names, code)
  local n = ffi.string(lib.st_dtype_name(code))
  rawset(names, code, n)
  return n
end })

-- A Lua table for a borrowed st_tensor_t* (or an st_tensor_t cdata of a
-- view) of `owner`, which the table keeps alive.
function M.wrap(t, owner)
  local shape, strides = {}, {}
  for d = 0, t.ndim - 1 do
    shape[d + 1] = tonumber(t.shape[d])
    strides[d + 1] = tonumber(t.strides[d])
  end
  local device = t.device == CUDA and ("cuda:" .. t.device_index) or "cpu"
  return setmetatable({
    name = ffi.string(t.name), data = t.data, dtype = dtype_names[tonumber(t.dtype)],
    shape = shape, strides = strides, numel = tonumber(t.numel), nbytes = tonumber(t.nbytes),
    device = device, uuid = t.device == CUDA and ffi.string(t.device_uuid) or "", _c = t,
    _owner = owner,
  }, Tensor)
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
  if self._c.device ~= CPU then
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

-- PyTorch's rule: dims of size 1 do not count (st_tensor_is_contiguous).
function Tensor:is_contiguous()
  return lib.st_tensor_is_contiguous(self._c) ~= 0
end

function Tensor:__tostring()
  return ("tensor(%s, {%s}, %s)"):format(self.dtype, table.concat(self.shape, ", "), self.device)
end

-- ------------------------------------------------------------- views
--
-- Views share the memory (and the owner) of their source; dims are
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
  local t = M.wrap(c, self._owner)
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
  if self._c.device ~= CPU or src._c.device ~= CPU then error("copy_: CPU tensors only", 2) end
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

-- ------------------------------------------------------------- allocation

-- A zero-filled contiguous tensor in memory that endpoints can take as an
-- argument (st_tensor_alloc: a sealed memfd on the CPU, an exported VMM
-- allocation on a GPU). shape: a table of sizes (or one number); opts.dtype
-- (default "float32"), opts.device ("cpu", default; "cuda"; "cuda:N").
-- The tensor owns the allocation (freed with the last table using it).
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
  if rc ~= 0 then
    local name = C.err_name(rc)
    if name == "INVALID_ARGUMENT" then error(what .. ": " .. ffi.string(err), 3) end
    return nil, name .. ": " .. ffi.string(err), name
  end
  local owner = ffi.gc(out[0], lib.st_result_free)
  return M.wrap(lib.st_result_tensor(owner, 0), owner)
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

return M

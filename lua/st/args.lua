-- st.args: Lua values as call arguments, through the nested builder of
-- libstclient (st_args_begin_list / _map, st_args_end, ...). Part of
-- st.client (docs/client.md, "Lua client").
--
--   nil inside a table   st.null (Lua tables cannot hold nil; a hole in a
--                        list is refused)
--   booleans, strings    themselves (strings byte for byte, NULs included)
--   st.bytes(s)          binary (msgpack bin; strings go as msgpack str)
--   numbers              an integer when integral and in int64 range, else
--                        a float; int64_t / uint64_t cdata as integers
--   a table              a list when its keys are exactly 1..n (an empty
--                        table too), else a map whose keys must be strings;
--                        st.map(t) makes t a map even when empty
--   a tensor             only as an argument of its own (name = tensor):
--                        memory from st.empty / st.zeros, by descriptor
local ffi = require("ffi")
local C = require("st.ffi")
local tensor = require("st.tensor")
local result = require("st.result")

local lib = C.lib
local Tensor = tensor.Tensor
local null = result.null
local floor = math.floor
local INT64_MAX = 0x7fffffffffffffffULL

local M = {}

local map_mt = {}

-- Marks t to go as a map (an object) even when empty; returns t.
function M.map(t)
  if type(t) ~= "table" then error("st.map: expected a table", 2) end
  return setmetatable(t, map_mt)
end

-- "list", n for a table whose keys are exactly 1..n (or an unmarked empty
-- table), else "map", n; raises for keys a map cannot have.
local function shape_of(v)
  local n, max, ints = 0, 0, true
  for k in pairs(v) do
    n = n + 1
    if type(k) == "number" and k >= 1 and k == floor(k) then
      if k > max then max = k end
    else
      ints = false
    end
  end
  if n == 0 then return getmetatable(v) == map_mt and "map" or "list", 0 end
  if ints and max == n and getmetatable(v) ~= map_mt then return "list", n end
  for k in pairs(v) do
    if type(k) ~= "string" then
      if ints then
        for i = 1, max do
          if v[i] == nil then
            error(("a list cannot hold nil (index %d is missing): write st.null"):format(i), 0)
          end
        end
      end
      error(("map keys must be strings (found a %s key)"):format(type(k)), 0)
    end
  end
  return "map", n
end

local put

-- The library's failure as an error.
local function check(a, rc)
  if rc ~= 0 then error(ffi.string(lib.st_args_error(a)), 0) end
end

-- A map member: keys with NUL bytes go through st_args_key.
local function put_member(a, k, x)
  if k:find("\0", 1, true) then
    check(a, lib.st_args_key(a, k, #k))
    return put(a, nil, x)
  end
  return put(a, k, x)
end

-- Places value v under key (nil inside a list) in the open value of a.
put = function(a, key, v)
  local t = type(v)
  if v == null then return check(a, lib.st_args_nil(a, key)) end
  if t == "boolean" then return check(a, lib.st_args_bool(a, key, v and 1 or 0)) end
  if t == "number" then
    if v == floor(v) and v >= -2 ^ 63 and v < 2 ^ 63 then
      return check(a, lib.st_args_int(a, key, v))
    end
    return check(a, lib.st_args_float(a, key, v))
  end
  if t == "string" then return check(a, lib.st_args_str(a, key, v, #v)) end
  if t == "cdata" and (ffi.istype("int64_t", v) or ffi.istype("uint64_t", v)) then
    if ffi.istype("uint64_t", v) and v > INT64_MAX then
      error(("%s does not fit an int64"):format(tostring(v)), 0)
    end
    return check(a, lib.st_args_int(a, key, v))
  end
  if t == "userdata" and getmetatable(v) == result.Bytes then
    local s = tostring(v)
    return check(a, lib.st_args_bytes(a, key, s, #s))
  end
  if t == "table" then
    if getmetatable(v) == Tensor then
      error("a tensor goes only as an argument of its own (name = tensor), not inside a table", 0)
    end
    local kind, n = shape_of(v)
    if kind == "list" then
      check(a, lib.st_args_begin_list(a, key))
      for i = 1, n do put(a, nil, v[i]) end
    else
      check(a, lib.st_args_begin_map(a, key))
      for k, x in pairs(v) do put_member(a, k, x) end
    end
    return check(a, lib.st_args_end(a))
  end
  error("cannot send a " .. t, 0)
end

-- The error for a tensor argument whose memory st_args_tensor cannot take.
local function foreign_tensor(k, v)
  return ("argument '%s': this %s tensor's memory was not allocated with st.empty or st.zeros " ..
    "(a result's tensors are the server's memory); only such memory passes to an endpoint: " ..
    "allocate it with st.empty(shape, { dtype =, device = }), or copy into one: " ..
    "st.empty(t.shape, { dtype = t.dtype }):copy_(t)"):format(k, v.device)
end

-- msg about argument k, naming it once.
local function about(k, msg)
  if msg:find("^argument '") then return msg end
  return ("argument '%s': %s"):format(k, msg)
end

-- A Lua table of named arguments as an owned st_args_t (GC-freed), or nil
-- for nil. Tensor values (from st.empty/st.zeros, or views of them) go by
-- descriptor: the map keeps their allocation until it is freed. Raises at
-- `level` (of the caller) for what cannot be sent.
function M.build(args, level)
  if args == nil then return nil end
  if type(args) ~= "table" then error("arguments must be a table of name = value", level + 1) end
  local a = ffi.gc(lib.st_args_new(), lib.st_args_free)
  if a == nil then error("out of memory building arguments", level + 1) end
  for k, v in pairs(args) do
    if type(k) ~= "string" then error("argument names must be strings", level + 1) end
    if getmetatable(v) == Tensor then
      if lib.st_tensor_is_shareable(v._c) == 0 then error(foreign_tensor(k, v), level + 1) end
      local err = ffi.new("char[256]")
      if lib.st_args_tensor(a, k, v._c, err, 256) ~= 0 then
        error(about(k, ffi.string(err)), level + 1)
      end
    else
      local ok, msg = pcall(put, a, k, v)
      if not ok then error(about(k, msg), level + 1) end
    end
  end
  return a
end

return M

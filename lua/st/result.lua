-- st.result: replies of the Lua client as Lua values. Part of st.client
-- (docs/client.md, "Lua client").
--
-- A result owns its st_result_t (freed by res:free() or by the GC); its
-- tensors keep it alive. Values convert as:
--   nil -> st.null (a nil inside an array or map keeps its place; the
--   same sentinel goes back as nil in arguments), booleans, numbers
--   (integers beyond 2^53 stay exact as int64 cdata), strings -> strings,
--   binary -> st.bytes values (M.bytes, below), arrays and maps -> tables, tensors -> st.client tensors,
--   modules -> { names = {...}, tensors = { name = tensor }, metadata }.
local ffi = require("ffi")
local C = require("st.ffi")
local tensor = require("st.tensor")

local lib = C.lib
local Tensor = tensor.Tensor

local M = {}

-- Stands for msgpack nil inside arrays and maps (Lua tables cannot hold nil).
M.null = setmetatable({}, { __tostring = function() return "st.null" end })

-- Binary values (msgpack bin): Lua has one string type, so binary is a
-- userdata that remembers it, st.bytes(s), like the endpoints' st.bytes:
-- #b, tostring(b), b .. s, b == st.bytes(s) and the string methods
-- (b:sub(1, 2)) work on its bytes; as an argument it goes as binary.
local proto = newproxy(true)
local Bytes = getmetatable(proto)
local held = setmetatable({}, { __mode = "k" })   -- st.bytes value -> its string
local function str_of(x) return held[x] or x end
Bytes.__tostring = function(b) return held[b] end
Bytes.__len = function(b) return #held[b] end
Bytes.__eq = function(x, y) return held[x] == held[y] end
Bytes.__concat = function(x, y) return str_of(x) .. str_of(y) end
Bytes.__index = function(b, k)
  local f = string[k]
  if f then return function(self, ...) return f(str_of(self), ...) end end
end
Bytes.__metatable = Bytes
M.Bytes = Bytes

-- A binary value of string s (an st.bytes value is returned as it is).
function M.bytes(s)
  if held[s] then return s end
  if type(s) ~= "string" then error("st.bytes: expected a string, got " .. type(s), 2) end
  local b = newproxy(proto)
  held[b] = s
  return b
end

local NIL, BOOL, INT, FLOAT = lib.ST_VALUE_NIL, lib.ST_VALUE_BOOL, lib.ST_VALUE_INT,
  lib.ST_VALUE_FLOAT
local STRING, BINARY, ARRAY, MAP = lib.ST_VALUE_STRING, lib.ST_VALUE_BINARY, lib.ST_VALUE_ARRAY,
  lib.ST_VALUE_MAP
local TENSOR, MODULE = lib.ST_VALUE_TENSOR, lib.ST_VALUE_MODULE

-- A Lua number when exact (|n| <= 2^53), else the int64 cdata itself.
function M.int_value(v)
  local n = tonumber(v)
  if n >= -2 ^ 53 and n <= 2 ^ 53 then return n end
  return v
end
local int_value = M.int_value

local convert
-- Stack depth is bounded: the server refuses values nested deeper than 32.
convert = function(v, owner)
  local k = v.kind
  if k == NIL then return M.null end
  if k == BOOL then return v.as.boolean ~= 0 end
  if k == INT then return int_value(v.as.integer) end
  if k == FLOAT then return v.as.number end
  if k == STRING then return ffi.string(v.as.str.ptr, v.as.str.len) end
  if k == BINARY then return M.bytes(ffi.string(v.as.str.ptr, v.as.str.len)) end
  if k == ARRAY then
    local out = {}
    for i = 0, tonumber(v.as.array.len) - 1 do out[i + 1] = convert(v.as.array.items[i], owner) end
    return out
  end
  if k == MAP then
    local out = {}
    for i = 0, tonumber(v.as.map.len) - 1 do
      out[convert(v.as.map.keys[i], owner)] = convert(v.as.map.values[i], owner)
    end
    return out
  end
  if k == TENSOR then return tensor.wrap(v.as.tensor, owner) end
  if k == MODULE then
    local m = { names = {}, tensors = {}, metadata = convert(v.as.module.metadata[0], owner) }
    for i = 0, tonumber(v.as.module.len) - 1 do
      local t = tensor.wrap(v.as.module.tensors[i], owner)
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

local Result = {}
Result.__index = Result
M.Result = Result

local function object_of(o)
  return {
    id = int_value(o.id), server_id = ffi.string(o.server_id), cache_key = ffi.string(o.cache_key),
    device = ffi.string(o.device), cached = o.cached ~= 0, managed = o.managed ~= 0,
    lease = o.lease ~= 0, refcount = tonumber(o.refcount), bytes = tonumber(o.bytes),
  }
end

-- Results of objects converted in this process, by "server_id\0object_id",
-- held weakly: an entry lives while the result (and so its tensors) does.
local reuse = setmetatable({}, { __mode = "v" })
M._reuse = reuse   -- for tests

local summary_t = ffi.typeof("st_result_summary_t")
local result_ptr = ffi.typeof("st_result_t *")

-- A new top-level table for a reused value (a module's name and tensor
-- lists too), so that changing one result's table changes no other.
local function fresh_copy(v)
  if type(v) ~= "table" or getmetatable(v) ~= nil then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = x end
  if v.names and v.tensors then
    out.names, out.tensors = {}, {}
    for i, n in ipairs(v.names) do out.names[i] = n end
    for n, t in pairs(v.tensors) do out.tensors[n] = t end
  end
  return out
end

-- Wraps an owned st_result_t*: freed by res:free() or by the GC. `summary`
-- (an st_result_summary_t of ptr) may be nil. A result of an object whose
-- earlier result in this process is still alive and not freed, with the
-- same tensors (st_result_summary's identity), reuses that result's
-- tensors: the new result holds a reference of its own on the earlier
-- one's memory (st_result_ref), and ptr is freed at once. `lent`: the call
-- asked for ST_CALL_LEND_SAME, so a `same` reply's ptr is not ours (its
-- connection holds it until its next request): nothing to free, and a
-- reference of our own when we keep it.
function M.wrap(ptr, summary, lent)
  if summary == nil then
    summary = summary_t()
    lib.st_result_summary(ptr, summary)
  end
  local object = summary.has_object ~= 0 and object_of(summary.object) or nil
  local identity = summary.identity
  lent = lent and summary.same ~= 0
  local key
  if object and summary.ntensors > 0 then
    key = object.server_id .. "\0" .. tostring(object.id)
    local old = reuse[key]
    if old and old._h and old._identity == identity then
      lib.st_result_ref(old._h)
      if not lent then lib.st_result_free(ptr) end
      return setmetatable({ _h = ffi.gc(ffi.cast(result_ptr, old._h), lib.st_result_free),
                            _identity = identity, value = fresh_copy(old.value),
                            object = object }, Result)
    end
  end
  if lent then lib.st_result_ref(ptr) end
  local handle = ffi.gc(ptr, lib.st_result_free)
  local res = setmetatable({ _h = handle, _identity = identity }, Result)
  res.value = convert(summary.value, res)
  res.object = object
  if key then reuse[key] = res end
  return res
end

-- Unmaps now (when no other result maps the same allocation). Tensors of
-- this result must not be used afterwards.
function Result:free()
  C.drop(self, lib.st_result_free)
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

return M

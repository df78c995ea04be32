-- st.buffer: named buffers and streams from Lua (docs/streams.md), over
-- libstclient's st_buffer_* through the FFI. Part of st.client, whose
-- clients make them:
--
--   local b = assert(c:buffer_create("cam", { 480, 640, 3 },
--                                    { dtype = "uint8", slots = 4 }))
--   local frame = assert(st.empty({ 480, 640, 3 }, { dtype = "uint8" }))
--   assert(b:write(frame))                    -- copy into the next slot
--   local r = assert(c2:buffer_open("cam", { readonly = true }))
--   local x, seq = assert(r:read_new(1000))   -- wait (ms) for a newer write
--
-- Frames are host memory: a tensor of the frame's size (st.empty, a
-- mapped result, any table with `data` and `nbytes`) or a cdata pointer
-- with a byte count; a CUDA buffer's slots are copied to and from host
-- memory by the library. Rules as in st.client: misuse raises, a runtime
-- failure returns nil, "NAME: message", NAME.
local ffi = require("ffi")
local C = require("st.ffi")
local tensor = require("st.tensor")

local lib = C.lib

local M = {}

local Buffer = {}
Buffer.__index = Buffer
M.Buffer = Buffer

local seq_out = ffi.new("uint64_t[1]")
local time_out = ffi.new("int64_t[1]")

local function check_self(b, what)
  if getmetatable(b) ~= Buffer then error(what .. ": call it as buffer:" .. what .. "(...)", 3) end
  if not b._h then error(what .. ": buffer '" .. b.name .. "' is closed", 3) end
end

-- A handle function's failure (its message: st_buffer_error).
local function failure(b, rc)
  local name = C.err_name(rc)
  return nil, name .. ": " .. ffi.string(lib.st_buffer_error(b._h)), name
end

-- A failure of create/open/unlink: the client's message.
local function client_failure(c, rc)
  local name = C.err_name(rc)
  return nil, name .. ": " .. ffi.string(lib.st_client_error(c._h)), name
end

local function ms(v, what)
  if v == nil then return -1 end
  if type(v) ~= "number" or v < 0 then error(what .. ": timeout_ms must be a number >= 0", 3) end
  return math.floor(v)
end

-- Host memory of a frame: (pointer, bytes) of a tensor table or of a
-- cdata pointer with its byte count.
local function host(v, n, what)
  if type(v) == "table" and v.data ~= nil and v.nbytes ~= nil then
    if v.device ~= nil and v.device ~= "cpu" then
      error(what .. ": the frame must be host memory (a CPU tensor)", 3)
    end
    return v.data, v.nbytes
  end
  if type(v) == "cdata" and type(n) == "number" then return v, n end
  error(what .. ": expected a CPU tensor, or a pointer and a byte count", 3)
end

local function wrap(h, name)
  local info = ffi.new("st_buffer_info_t")
  lib.st_buffer_info(h, info)
  local shape = {}
  for d = 0, info.ndim - 1 do shape[d + 1] = tonumber(info.shape[d]) end
  return setmetatable({
    _h = ffi.gc(h, lib.st_buffer_close), name = name, shape = shape,
    dtype = ffi.string(lib.st_dtype_name(info.dtype)), slots = info.slots,
    frame_bytes = tonumber(info.frame_bytes), readonly = info.readonly ~= 0,
    device = info.device_index < 0 and "cpu" or ("cuda:" .. info.device_index),
  }, Buffer)
end

-- The client functions (st.client adds them as client methods).

-- Creates buffer `name` of `slots` frames of `shape` and opens it
-- read-write: opts.dtype (default "float32"), opts.device ("cpu" default,
-- "cuda", "cuda:N"), opts.slots (default 1), opts.readers ({ uids = {..},
-- gids = {..} }: those uids, and callers in those groups, may open it
-- read-only; docs/protocol.md, "Owners"). A Buffer, or nil, err.
function M.create(c, name, shape, opts)
  opts = opts or {}
  if type(name) ~= "string" then error("buffer_create: the name must be a string", 3) end
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or type(opts) ~= "table" then
    error("buffer_create: expected (name, {sizes}, {dtype=, device=, slots=, readers=})", 3)
  end
  local readers = nil
  if opts.readers ~= nil then
    if type(opts.readers) ~= "table" then
      error("buffer_create: readers must be a table { uids = {..}, gids = {..} }", 3)
    end
    readers = ffi.new("st_readers_t[1]")
    local keep = {}
    for _, k in ipairs({ "uids", "gids" }) do
      local ids = opts.readers[k] or {}
      if type(ids) ~= "table" then
        error("buffer_create: readers." .. k .. " must be a list of numbers", 3)
      end
      local arr = ffi.new("uint32_t[?]", #ids > 0 and #ids or 1)
      for i = 1, #ids do
        if type(ids[i]) ~= "number" then
          error("buffer_create: readers." .. k .. " must be a list of numbers", 3)
        end
        arr[i - 1] = ids[i]
      end
      keep[k] = arr
      readers[0][k] = arr
      readers[0]["n" .. k] = #ids
    end
    readers = { ptr = readers, keep = keep }
  end
  local n = #shape
  local dims = ffi.new("int64_t[?]", n > 0 and n or 1)
  for d = 1, n do
    if type(shape[d]) ~= "number" then error("buffer_create: sizes must be numbers", 3) end
    dims[d - 1] = shape[d]
  end
  local dtype = lib.st_dtype_from_name(opts.dtype or "float32")
  if dtype == 0 then error("buffer_create: unknown dtype " .. tostring(opts.dtype), 3) end
  local out = ffi.new("st_buffer_t*[1]")
  local rc = lib.st_buffer_create_ex(c._h, name, opts.device, dtype, n, dims, opts.slots or 1,
                                     readers and readers.ptr or nil, out)
  if rc ~= 0 then return client_failure(c, rc) end
  return wrap(out[0], name)
end

-- Opens buffer `name` (read-only with opts.readonly). A Buffer, or nil, err
-- (NOT_FOUND for no such buffer).
function M.open(c, name, opts)
  opts = opts or {}
  if type(name) ~= "string" then error("buffer_open: the name must be a string", 3) end
  local out = ffi.new("st_buffer_t*[1]")
  local rc = lib.st_buffer_open(c._h, name, opts.readonly and 1 or 0, out)
  if rc ~= 0 then return client_failure(c, rc) end
  return wrap(out[0], name)
end

-- Unlinks buffer `name`: true, or nil, err.
function M.unlink(c, name)
  if type(name) ~= "string" then error("buffer_unlink: the name must be a string", 3) end
  local rc = lib.st_buffer_unlink(c._h, name)
  if rc ~= 0 then return client_failure(c, rc) end
  return true
end

-- The Buffer's methods.

-- Copies a frame (a CPU tensor, or ptr and bytes) into the next slot and
-- publishes it; waits at most timeout_ms (default: no bound) for the
-- writer lock. The write's number, or nil, err.
function Buffer:write(v, n, timeout_ms)
  check_self(self, "write")
  if type(v) == "table" then n, timeout_ms = nil, n end
  local p, bytes = host(v, n, "write")
  local rc = lib.st_buffer_write(self._h, p, bytes, ms(timeout_ms, "write"), seq_out)
  if rc ~= 0 then return failure(self, rc) end
  return tonumber(seq_out[0])
end

-- Zeroes every slot, published as one more write (its number, or nil,
-- err); waits at most timeout_ms (default: no bound) for the writer lock.
function Buffer:clear(timeout_ms)
  check_self(self, "clear")
  local rc = lib.st_buffer_clear(self._h, ms(timeout_ms, "clear"), seq_out)
  if rc ~= 0 then return failure(self, rc) end
  return tonumber(seq_out[0])
end

local function read_with(self, fn, what, out, timeout_ms)
  check_self(self, what)
  if out == nil then
    local err, name
    out, err, name = tensor.empty(self.shape, { dtype = self.dtype })
    if not out then return nil, err, name end
  end
  local p, bytes = host(out, nil, what)
  local rc = fn(self._h, p, bytes, ms(timeout_ms, what), seq_out, time_out)
  if rc ~= 0 then return failure(self, rc) end
  return out, tonumber(seq_out[0]), tonumber(time_out[0])
end

-- The newest complete write, a consistent copy: into `out` (a CPU tensor
-- of the frame's size) or a new tensor; its write number and time (ns).
function Buffer:read(out, timeout_ms)
  return read_with(self, lib.st_buffer_read, "read", out, timeout_ms or 1000)
end

-- Waits at most timeout_ms (default: no bound) for a write newer than
-- the last this handle read, then reads it as read() does; nil,
-- "TIMEOUT: ..." when none came.
function Buffer:read_new(timeout_ms, out)
  return read_with(self, lib.st_buffer_read_new, "read_new", out, timeout_ms)
end

function Buffer:write_sequence()
  check_self(self, "write_sequence")
  return tonumber(lib.st_buffer_write_sequence(self._h))
end

-- CLOCK_REALTIME of the newest write in seconds (0: none yet).
function Buffer:write_time()
  check_self(self, "write_time")
  return tonumber(lib.st_buffer_write_time(self._h)) / 1e9
end

-- The writer lock: true, or false when timeout_ms passed (default: no
-- bound); nil, err on failure. Re-entrant: while this handle holds it,
-- acquire counts, and the release that balances the first frees it.
function Buffer:acquire(timeout_ms)
  check_self(self, "acquire")
  local rc = lib.st_buffer_acquire(self._h, ms(timeout_ms, "acquire"))
  if rc == 0 then return true end
  if C.err_name(rc) == "TIMEOUT" then return false end
  return failure(self, rc)
end

-- Undoes one acquire: true, or nil, err when this handle holds none.
function Buffer:release()
  check_self(self, "release")
  local rc = lib.st_buffer_release(self._h)
  if rc ~= 0 then return failure(self, rc) end
  return true
end

-- How many acquires of this handle are not yet released (0: it holds
-- no lock).
function Buffer:held()
  check_self(self, "held")
  return lib.st_buffer_held(self._h)
end

-- Who holds the writer lock: nil when nobody, else the owner's connection
-- id, its pid and whether it is this handle's connection.
function Buffer:locked()
  check_self(self, "locked")
  local owner, pid, mine = ffi.new("uint64_t[1]"), ffi.new("int[1]"), ffi.new("int[1]")
  if lib.st_buffer_locked(self._h, owner, pid, mine) == 0 then return nil end
  return tonumber(owner[0]), pid[0], mine[0] ~= 0
end

-- This handle goes (a writer lock it holds is freed); the buffer stays
-- until unlinked. Idempotent.
function Buffer:close()
  if getmetatable(self) ~= Buffer then error("close: call it as buffer:close()", 2) end
  if self._h then
    local h = self._h
    self._h = nil
    lib.st_buffer_close(ffi.gc(h, nil))
  end
end

function Buffer:__tostring()
  return ("buffer '%s' (%s %s x%d on %s%s%s)"):format(self.name, self.dtype,
    table.concat(self.shape, "x"), self.slots, self.device, self.readonly and ", read-only" or "",
    self._h and "" or ", closed")
end

return M

-- st.zerobranch: one Lua file that declares endpoints AND runs the program
-- that calls them, in three roles chosen by the environment
-- (docs/zero-branch.md):
--
--   local app = require("st.zerobranch").app()
--   app:endpoint { name = "scaled_ones", params = { n = 4, k = 2.0 },
--                  build = function(a) return st.full { a.n, value = a.k } end }
--   app:main(function(c)            -- c: an st.client connection
--     local r = assert(c:call("scaled_ones", { n = 3 }))
--   end)
--
--   SHARED_TENSOR_ENABLED unset, "", 0, false, no, off  in-process: app:main
--       starts the server engine (libstembed) on a background thread of this
--       process, on a private socket, serving this file's endpoints, and
--       runs the main function against it; the server stops when main ends.
--   SHARED_TENSOR_ROLE=server (and enabled)  server: app() turns this
--       process into the server for this file's endpoints on the usual
--       socket (SHARED_TENSOR_BASE_PATH, SHARED_TENSOR_DEVICE); it serves
--       until SIGTERM/SIGINT (SIGHUP reloads the file) and exits. The main
--       function never runs.
--   otherwise (enabled, role unset or "client")  client: app:main connects
--       to the running server and runs the main function against it.
--
-- The server loads this same file as its endpoint file, in its sandbox,
-- where require("st.zerobranch") is a built-in twin of this module
-- (src/lua/zerobranch.c): app:endpoint is st.endpoint, and app:main ends
-- the file there (nothing after it runs on the server). Build functions
-- only ever run on the server; the top level up to app:main runs in both
-- places and must stay sandbox-safe (io, os.getenv and friends belong in
-- the main function or after it).
--
-- Rules (as in st.client): misuse raises (app:endpoint after app:main,
-- app:main twice, a bad option or environment value); so does a main that
-- cannot start (no server in the client role, an endpoint file the server
-- refuses), since the program cannot go on without it.
--
-- libstembed is found through $ST_EMBED_LIB (a path), else the system
-- loader's search for "stembed"; only the in-process and server roles
-- load it. libstclient as st.client finds it.
local ffi = require("ffi")
local client = require("st.client")

ffi.cdef [[
typedef struct st_embed st_embed_t;
typedef struct st_embed_options {
  const char *endpoints; const char *config; const char *base_path;
  int device; int workers; const char *log_level;
} st_embed_options_t;
int st_embed_start(const st_embed_options_t *opts, st_embed_t **out, char *err, size_t errlen);
const char *st_embed_socket_path(const st_embed_t *e);
int st_embed_stop(st_embed_t *e);
int st_embed_serve(const st_embed_options_t *opts, char *err, size_t errlen);
]]

local M = {}

-- ------------------------------------------------------------- libraries

local embed_lib

local function embed()
  if embed_lib then return embed_lib end
  local lib = require("st.ffi").load_library("libstembed.so.0", "ST_EMBED_LIB")
  embed_lib = lib
  return lib
end

-- Stable error names (docs/errors.md) from libstclient, as st.client has them.
local err_name = require("st.ffi").err_name

-- ------------------------------------------------------------- environment

local function env(name)
  local v = os.getenv(name)
  if v == "" then return nil end
  return v
end

-- Which role this process plays, from SHARED_TENSOR_ENABLED and
-- SHARED_TENSOR_ROLE. Raises on a role it does not know.
local function role_from_env()
  local enabled = env("SHARED_TENSOR_ENABLED")
  local off = { ["0"] = true, ["false"] = true, ["no"] = true, ["off"] = true }
  if enabled == nil or off[enabled:lower()] then return "in-process" end
  local role = env("SHARED_TENSOR_ROLE")
  role = role and role:lower()
  if role == nil or role == "client" then return "client" end
  if role == "server" then return "server" end
  error(("SHARED_TENSOR_ROLE must be \"server\" or \"client\" (or unset), got %q")
        :format(os.getenv("SHARED_TENSOR_ROLE")), 0)
end

local function device_from_env()
  local v = env("SHARED_TENSOR_DEVICE")
  if v == nil then return 0 end
  local n = tonumber(v)
  if not n or n < 0 or n > 4095 or n ~= math.floor(n) or not v:match("^%s*%d+%s*$") then
    error(("SHARED_TENSOR_DEVICE must be a socket index from 0 to 4095, got %q"):format(v), 0)
  end
  return n
end

-- ------------------------------------------------------------- the st global

-- Endpoint declarations are read on the server; in this process they are
-- only recorded, so the script's top level needs what a declaration names
-- (st.required, st.tensor_param{...}, st.array) and nothing that builds.
local function install_st_stub()
  if rawget(_G, "st") ~= nil then return end
  local required = setmetatable({}, { __tostring = function() return "st.required" end })
  local stub = {
    required = required,
    endpoint = function(t) return t end,
    array = function(t) return t end,
    tensor_param = function(t) return t or {} end,
  }
  rawset(_G, "st", setmetatable(stub, {
    __index = function(_, k)
      error(("st.%s is only available on the server, inside build functions (this " ..
             "process runs the script's main part)"):format(tostring(k)), 2)
    end,
    __newindex = function(_, k)
      error(("attempt to modify st (field '%s')"):format(tostring(k)), 2)
    end,
  }))
end

-- ------------------------------------------------------------- the app

local App = {}
App.__index = App

local function check_self(self, what)
  if getmetatable(self) ~= App then
    error(("app:%s: call it as app:%s(...)"):format(what, what), 3)
  end
end

-- Builds the options of libstembed. The strings live in `keep` (the
-- struct only points at them).
local function embed_options(self, keep)
  local o = ffi.new("st_embed_options_t")
  keep[1], keep[2] = self.file, self.config
  o.endpoints = keep[1]
  o.config = keep[2]
  keep[3] = env("SHARED_TENSOR_BASE_PATH")
  o.base_path = keep[3]
  o.device = self.device
  o.workers = self.workers or 0
  o.log_level = nil
  return o
end

-- Server role: this process serves the file until SIGTERM/SIGINT, then
-- exits with 0 (clean stop) or 1 (could not start: the server logged why).
local function serve(self)
  local lib = embed()
  local keep = {}
  local o = embed_options(self, keep)
  local err = ffi.new("char[4096]")
  local rc = lib.st_embed_serve(o, err, 4096)
  io.stdout:flush()
  os.exit(rc == 0 and 0 or 1)
end

-- Creates the app of this script. opts (all optional): file = the script
-- that declares the endpoints (default: the file that calls app()),
-- workers = worker threads of the in-process and server roles,
-- config = a config.lua for the server (docs/operations.md). In the
-- server role this call does not return: the process serves and exits.
function M.app(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("app: options must be a table, got " .. type(opts), 2)
  end
  opts = opts or {}
  for k, v in pairs(opts) do
    if k == "file" or k == "config" then
      if type(v) ~= "string" or v == "" then error(("app: %s must be a path"):format(k), 2) end
    elseif k == "workers" then
      if type(v) ~= "number" or v < 1 or v > 1024 or v ~= math.floor(v) then
        error("app: workers must be an integer from 1 to 1024", 2)
      end
    else
      error(("app: unknown option '%s' (options: file, workers, config)"):format(tostring(k)), 2)
    end
  end
  local file = opts.file
  if not file then
    local src = debug.getinfo(2, "S").source
    if src:sub(1, 1) ~= "@" then
      error("app: cannot tell which file declares the endpoints (the caller was not loaded " ..
            "from a file): pass app{ file = ... }", 2)
    end
    file = src:sub(2)
  end
  local self = setmetatable({
    file = file, config = opts.config, workers = opts.workers,
    role_name = role_from_env(), device = device_from_env(),
    endpoints = {}, main_started = false,
  }, App)
  if self.role_name == "server" then serve(self) end
  install_st_stub()
  return self
end

-- "in-process", "server" or "client".
function App:role()
  check_self(self, "role")
  return self.role_name
end

-- Declares an endpoint: the same table as st.endpoint{...} (docs/endpoints.md).
-- Here it is only recorded (names in app.endpoints); the server reads
-- it from the file. Returns the declaration.
function App:endpoint(decl)
  check_self(self, "endpoint")
  if self.main_started then
    error("app:endpoint: called after app:main (declare every endpoint before main)", 2)
  end
  if type(decl) ~= "table" then
    error("app:endpoint expects one table: app:endpoint{ name = ..., build = ... }", 2)
  end
  if type(decl.name) ~= "string" then error("app:endpoint: name must be a string", 2) end
  self.endpoints[#self.endpoints + 1] = decl.name
  return decl
end

-- Runs fn(c) with c connected; closes c afterwards, and re-raises fn's
-- error unchanged. Returns fn's results packed (n = their count).
local function run_main(fn, c, cleanup)
  local res = { n = 0 }
  local function keep(ok, ...)
    res.n = select("#", ...)
    for i = 1, res.n do res[i] = select(i, ...) end
    return ok
  end
  local ok = keep(pcall(fn, c))
  c:close()
  if cleanup then cleanup() end
  if not ok then error(res[1], 0) end
  return res
end

-- Errors below are raised at level 3: the line of app:main in the script.

local function main_in_process(self, fn)
  local lib = embed()
  local keep = {}
  local o = embed_options(self, keep)
  local out = ffi.new("st_embed_t*[1]")
  local err = ffi.new("char[8192]")
  local rc = lib.st_embed_start(o, out, err, 8192)
  if rc ~= 0 then
    error(("the in-process server did not start: %s: %s")
          :format(err_name(rc), ffi.string(err)), 3)
  end
  -- The GC stops a server whose main was cut short by something worse
  -- than an error; the normal path stops it at once.
  local handle = ffi.gc(out[0], lib.st_embed_stop)
  local path = ffi.string(lib.st_embed_socket_path(handle))
  local function stop() lib.st_embed_stop(ffi.gc(handle, nil)) end
  local c, cerr = client.connect { path = path }
  if not c then
    stop()
    error(("cannot connect to the in-process server: %s"):format(cerr), 3)
  end
  return run_main(fn, c, stop)
end

local function main_client(self, fn)
  -- The library finds the socket: $SHARED_TENSOR_BASE_PATH's, else the
  -- first that exists of the default places (st_socket_path).
  local c, err, name = client.connect { device = self.device }
  if not c then
    if name == "IO" then
      local where = err:match("^IO: cannot connect to (.-): ") or err:match("no socket at (.*)$")
      error(("no server at %s: start one with SHARED_TENSOR_ENABLED=1 SHARED_TENSOR_ROLE=server luajit %s")
            :format(where or ("device " .. self.device), self.file), 3)
    end
    error(("cannot connect to the server of device %d: %s"):format(self.device, err), 3)
  end
  return run_main(fn, c, nil)
end

-- The program: fn(c) runs with c, an st.client connection to the server
-- of this role (in-process: a private one started for it). Returns what fn
-- returns; an error of fn propagates after the connection (and the
-- in-process server) are gone.
function App:main(fn)
  check_self(self, "main")
  if type(fn) ~= "function" then error("app:main expects a function, got " .. type(fn), 2) end
  if self.main_started then error("app:main: called twice", 2) end
  self.main_started = true
  -- Not tail calls: the error levels above count this frame.
  local res
  if self.role_name == "in-process" then res = main_in_process(self, fn)
  else res = main_client(self, fn) end
  return unpack(res, 1, res.n)
end

function App:__tostring()
  return ("st.zerobranch app (%s, %s)"):format(self.role_name, self.file)
end

return M

-- Functional-test harness for busted specs: starts a real stserver in a
-- private temp dir and drives it with the real stcli binary.
--
--   local H = require("st_harness")
--   local srv = H.server{ endpoints = { ["e.lua"] = "return st.endpoint{...}" },
--                         config = "workers = 2," }
--   local out, rc, err = srv:cli("call", "e", "n=3")
--   srv:finish()  -- stops it and raises unless it exited cleanly (status 0)
--
-- Paths come from the environment ctest sets (ST_SERVER_BIN, ST_CLI_BIN,
-- ST_SOURCE_DIR). Never sleeps blindly: start() polls `ping` with a deadline.
local H = {}

-- The project's Lua modules (lua/st/...) for specs that use them. busted's
-- --lpath takes one entry (its re-exec under --lua splits on ';'), so the
-- harness adds this one itself.
package.path = (os.getenv("ST_SOURCE_DIR") or ".") .. "/lua/?.lua;" .. package.path

local function env(name)
  local v = os.getenv(name)
  assert(v and v ~= "", name .. " is not set: run the specs through ctest")
  return v
end

H.server_bin = function() return env("ST_SERVER_BIN") end
H.cli_bin = function() return env("ST_CLI_BIN") end
H.source_dir = function() return env("ST_SOURCE_DIR") end

local function shquote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
H.shquote = shquote

-- Runs a shell command; returns stdout, exit status, stderr.
function H.run(cmd)
  local errfile = os.tmpname()
  local p = assert(io.popen("(" .. cmd .. ") 2>" .. errfile .. "; echo \"__rc=$?\""))
  local out = p:read("*a")
  p:close()
  local f = io.open(errfile)
  local err = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(errfile)
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  out = out:gsub("__rc=%d+%s*$", "")
  return out, rc, err
end

-- Runs a luajit script (text) in its own process with the client library
-- of this build and the Lua modules of this tree (core dumps off); returns
-- stdout, status, stderr.
function H.luajit(text)
  local path = os.tmpname()
  H.write(path, text)
  local out, rc, err = H.run(table.concat({
    "ulimit -c 0;",
    "LUA_PATH=" .. shquote(H.source_dir() .. "/lua/?.lua;;"),
    "ST_CLIENT_LIB=" .. shquote(env("ST_CLIENT_LIB")),
    "luajit", shquote(path) }, " "))
  os.remove(path)
  return out, rc, err
end

function H.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

function H.read(path)
  local f = io.open(path)
  if not f then return nil end
  local t = f:read("*a")
  f:close()
  return t
end

-- Wall-clock seconds (fractional).
function H.now()
  -- os.clock measures CPU time; use the shell's clock for wall time.
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("*a"))
  p:close()
  return t
end

local Server = {}
Server.__index = Server

-- STT_LOOP_THREADS=N runs every test server on N loop threads (the suite
-- runs so with 1 and 4); a spec's own config comes later and wins.
local function loop_threads()
  local n = tonumber(os.getenv("STT_LOOP_THREADS") or "")
  return n and string.format("  loop_threads = %d,\n", n) or ""
end

-- opts.endpoints: map file name -> text (else the repo's endpoints/)
-- opts.config: extra Lua fields inside the config table
-- opts.config_file: run on this config file instead (socket under the temp dir)
function H.server(opts)
  opts = opts or {}
  local dir = H.run("mktemp -d /tmp/stspec-XXXXXX"):gsub("%s+$", "")
  local self = setmetatable({ dir = dir, base = dir .. "/st" }, Server)
  self.socket = self.base .. "-0.sock"
  self.log = dir .. "/server.log"
  local epdir = H.source_dir() .. "/endpoints"
  if opts.endpoints then
    epdir = dir .. "/endpoints"
    H.run("mkdir -p " .. shquote(epdir))
    for name, text in pairs(opts.endpoints) do H.write(epdir .. "/" .. name, text) end
  end
  self.endpoints = epdir
  if opts.config_file then
    -- An existing config (the repository's own): only the socket moves.
    self.config = opts.config_file
    self.args = "--base-path " .. shquote(self.base)
  else
    self.config = dir .. "/config.lua"
    H.write(self.config, string.format(
      "return {\n  base_path = %q,\n  endpoints = %q,\n  workers = 2,\n  log_level = 'debug',\n  default_device = 'cpu',\n%s\n}\n",
      self.base, epdir, loop_threads() .. (opts.config or "")))
  end
  if opts.start ~= false then self:start() end
  return self
end

function Server:start()
  -- The subshell records the exit status so stop() can assert a clean exit.
  -- Its output goes to files, not to our popen pipe, or run() would wait
  -- for the server to exit.
  H.run(string.format("(%s --config %s %s >>%s 2>&1; echo $? > %s) >/dev/null 2>&1 & echo $! > %s",
    shquote(H.server_bin()), shquote(self.config), self.args or "", shquote(self.log),
    shquote(self.dir .. "/exit"), shquote(self.dir .. "/wrapper.pid")))
  local deadline = H.now() + 10
  while H.now() < deadline do
    local _, rc = H.run(shquote(H.cli_bin()) .. " --socket " .. shquote(self.socket) .. " ping")
    if rc == 0 then
      local info = self:cli("--json", "info")
      self.pid = tonumber(info:match('"pid"%s*:%s*(%d+)'))
      return self
    end
    if H.read(self.dir .. "/exit") then break end
  end
  error("stserver did not start; log:\n" .. (H.read(self.log) or ""))
end

-- Runs stcli against this server; returns stdout, exit status, stderr.
function Server:cli(...)
  local args = { shquote(H.cli_bin()), "--socket", shquote(self.socket) }
  for _, a in ipairs({ ... }) do args[#args + 1] = shquote(a) end
  return H.run(table.concat(args, " "))
end

-- Sends a signal to the server process.
function Server:signal(sig)
  assert(self.pid, "server pid unknown")
  H.run("kill -" .. sig .. " " .. self.pid)
end

-- Stops with SIGTERM and returns the exit status (waits up to 10 s).
function Server:stop()
  if self.pid then self:signal("TERM") end
  local deadline = H.now() + 10
  local status
  while H.now() < deadline do
    status = H.read(self.dir .. "/exit")
    if status and status:match("%d") then break end
  end
  status = tonumber(status)
  self.exit_status = status
  return status
end

function Server:cleanup()
  if not os.getenv("STT_KEEP") then H.run("rm -rf " .. shquote(self.dir)) end
end

-- Raises unless the server still answers `stcli ping` (after a refused
-- request, say).
function Server:check_serving()
  local _, rc, err = self:cli("ping")
  if rc ~= 0 then error(("ping exited with %s: %s"):format(tostring(rc), err), 2) end
end

-- Runs stcli with the arguments in `args`: raises unless it fails (exit
-- 1) with a stderr that matches every Lua pattern of `patterns` and the
-- server still answers ping.
function Server:check_refused(args, patterns)
  local _, rc, err = self:cli(unpack(args))
  if rc ~= 1 then error(("stcli exited with %s, not 1: %s"):format(tostring(rc), err), 2) end
  for _, p in ipairs(patterns) do
    if not err:find(p) then error(("stderr %q does not match %q"):format(err, p), 2) end
  end
  self:check_serving()
end

-- For a teardown: stops the server, removes its directory and raises an
-- error (quoting the log) unless it exited cleanly (status 0).
function Server:finish()
  local status = self:stop()
  local log = H.read(self.log) or ""
  self:cleanup()
  if status ~= 0 then error(("stserver exited with %s; log:\n%s"):format(tostring(status), log)) end
end

-- For a describe block: a server with these endpoints and an st.client
-- connection to it. `start` (for setup) fills in `srv` and `c`; `stop`
-- (for teardown) closes both and checks a clean exit:
--   local env = H.serving(endpoints)
--   setup(env.start)
--   teardown(env.stop)
-- `config`: more config.lua fields for the server (H.server's opts.config).
function H.serving(endpoints, config)
  local env = {}
  function env.start()
    env.srv = H.server{ endpoints = endpoints, config = config }
    env.c = assert(require("st.client").connect{ path = env.srv.socket })
  end
  function env.stop()
    if env.c then env.c:close() end
    if env.srv then env.srv:finish() end
  end
  return env
end

return H

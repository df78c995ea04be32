-- Zero-branch scripts (lua/st/zerobranch.lua, docs/zero-branch.md): one
-- file that declares endpoints and runs the program that calls them, in
-- the in-process, server and client roles; the example; the sandbox's
-- require rules. Every script runs in its own luajit process, as a user
-- runs it. Never sleeps blindly: waits poll with deadlines.
local H = require("st_harness")

local q = H.shquote

local function now()
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("*a"))
  p:close()
  return t
end

-- A private directory per spec: scripts, sockets and $TMPDIR (where the
-- in-process servers make their socket directories).
local dir, tmpdir, base

local function lib_env()
  return table.concat({
    "LUA_PATH=" .. q(H.source_dir() .. "/lua/?.lua;;"),
    "ST_CLIENT_LIB=" .. q(assert(os.getenv("ST_CLIENT_LIB"))),
    "ST_EMBED_LIB=" .. q(assert(os.getenv("ST_EMBED_LIB"), "ST_EMBED_LIB is not set")),
    "TMPDIR=" .. q(tmpdir),
  }, " ")
end

-- Runs `luajit script` with the environment entries of `vars` (a table;
-- false removes a variable); returns stdout, status, stderr.
local function luajit(script, vars)
  local parts = { "env", "-u SHARED_TENSOR_ENABLED", "-u SHARED_TENSOR_ROLE",
                  "-u SHARED_TENSOR_DEVICE", "SHARED_TENSOR_BASE_PATH=" .. q(base) }
  for k, v in pairs(vars or {}) do parts[#parts + 1] = k .. "=" .. q(v) end
  return H.run("cd " .. q(dir) .. " && " .. lib_env() .. " " .. table.concat(parts, " ") ..
               " luajit " .. q(script))
end

local function cli(...)
  local args = { q(H.cli_bin()), "--base-path", q(base) }
  for _, a in ipairs({ ... }) do args[#args + 1] = q(a) end
  return H.run(table.concat(args, " "))
end

local function tmp_entries()
  local out = H.run("ls -A " .. q(tmpdir))
  return out
end

-- A server-role process in the background: its log, exit status and pid.
local function start_server_role(script, extra, device)
  local sock = ("%s-%d.sock"):format(base, device or 0)
  local log, exitf = dir .. "/server.log", dir .. "/server.exit"
  os.remove(exitf)
  H.run(string.format(
    "(cd %s && %s env SHARED_TENSOR_ENABLED=1 SHARED_TENSOR_ROLE=server " ..
    "SHARED_TENSOR_BASE_PATH=%s %s luajit %s >%s 2>&1; echo $? >%s) >/dev/null 2>&1 &",
    q(dir), lib_env(), q(base), extra or "", q(script), q(log), q(exitf)))
  local deadline = now() + 10
  while now() < deadline do
    local _, rc = H.run(q(H.cli_bin()) .. " --socket " .. q(sock) .. " ping")
    if rc == 0 then
      local info = H.run(q(H.cli_bin()) .. " --socket " .. q(sock) .. " --json info")
      return { pid = tonumber(info:match('"pid"%s*:%s*(%d+)')), log = log, exitf = exitf }
    end
    if H.read(exitf) then break end
  end
  error("the server role did not start; log:\n" .. (H.read(log) or ""))
end

local function stop_server_role(s)
  H.run("kill -TERM " .. s.pid)
  local deadline, status = now() + 10, nil
  while now() < deadline do
    status = H.read(s.exitf)
    if status and status:match("%d") then break end
  end
  return tonumber(status)
end

local SCRIPT = [[
local app = require("st.zerobranch").app()
app:endpoint { name = "scaled", params = { n = 4, k = 2.5, tag = st.required }, cache = true,
               build = function(a) return { t = st.full { a.n, value = a.k }, tag = a.tag } end }
app:endpoint { name = "where", build = function() return "built on the server" end }
print("top level ran, role " .. app:role())
local got = app:main(function(c)
  local r = assert(c:call("scaled", { n = 3, tag = "x" }))
  print(("main: role %s, values %s, tag %s, object %d"):format(app:role(),
    table.concat(r.value.t:tolist(), " "), r.value.tag, r.object.id))
  print("main: " .. assert(c:call("where")).value)
  return "main's result", 42
end)
print("after main: " .. got)
]]

describe("zero-branch scripts", function()
  setup(function()
    dir = H.run("mktemp -d /tmp/stzb-XXXXXX"):gsub("%s+$", "")
    tmpdir = dir .. "/tmp"
    base = dir .. "/st"
    H.run("mkdir " .. q(tmpdir))
    H.write(dir .. "/app.lua", SCRIPT)
  end)
  teardown(function()
    if not os.getenv("STT_KEEP") then H.run("rm -rf " .. q(dir)) end
  end)

  it("run in-process without any server, and leave nothing behind", function()
    -- No socket exists at $SHARED_TENSOR_BASE_PATH: the script needs none.
    for _, enabled in ipairs({ false, "", "0", "false", "No", "OFF" }) do
      local vars = {}
      if enabled then vars.SHARED_TENSOR_ENABLED = enabled end
      vars.SHARED_TENSOR_ROLE = "server"           -- ignored when disabled
      local out, rc, err = luajit("app.lua", vars)
      assert.are.equal(0, rc, err)
      assert.matches("top level ran, role in%-process", out)
      assert.matches("main: role in%-process, values 2.5 2.5 2.5, tag x, object 1", out)
      assert.matches("main: built on the server", out)
      assert.matches("after main: main's result", out)
      assert.are.equal("", err)                    -- warn and above only: nothing
      assert.are.equal("", tmp_entries())          -- socket directory removed
    end
  end)

  it("in-process: os.exit inside main still stops the server", function()
    H.write(dir .. "/exit.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "x", build = function() return 1 end }
app:main(function(c) assert(c:call("x")) os.exit(7) end)
]])
    local _, rc = luajit("exit.lua")
    assert.are.equal(7, rc)
    assert.are.equal("", tmp_entries())
  end)

  it("in-process: an endpoint error and a main error are reported", function()
    H.write(dir .. "/boom.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "boom", build = function() error("kaput") end }
app:main(function(c)
  local r, err = c:call("boom")
  print(err)
  error("main gave up")
end)
]])
    local out, rc, err = luajit("boom.lua")
    assert.are_not.equal(0, rc)
    assert.matches("ENDPOINT: boom%.lua:2: kaput", out)
    assert.matches("boom%.lua:6: main gave up", err)
    assert.are.equal("", tmp_entries())
  end)

  it("in-process: a bad endpoint file fails with file:line", function()
    H.write(dir .. "/bad.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "x", timout = 1, build = function() return 1 end }
app:main(function(c) end)
]])
    local _, rc, err = luajit("bad.lua")
    assert.are_not.equal(0, rc)
    assert.matches("bad%.lua:3: the in%-process server did not start: CONFIGURATION: " ..
                   "bad%.lua:2: unknown option 'timout'", err)
    assert.are.equal("", tmp_entries())
  end)

  it("a result freed by a finalizer at exit does not crash the host", function()
    -- lua_close finalizes the FFI library objects too: libstclient and
    -- libstembed must stay mapped until their last caller is done.
    H.write(dir .. "/late_free.lua", [[
local holder = {}
local p = newproxy(true)                   -- finalized after the libraries
getmetatable(p).__gc = function() holder.r:free() end
holder.p = p
local app = require("st.zerobranch").app { file = "app.lua" }
holder.r = app:main(function(c) return assert(c:call("where")) end)
holder.r._h = require("ffi").gc(holder.r._h, nil)   -- only the proxy frees it
print(holder.r.value)
]])
    local out, rc, err = luajit("late_free.lua")
    assert.are.equal(0, rc, err)
    assert.matches("built on the server", out)
  end)

  it("client role with no server says how to start one", function()
    local _, rc, err = luajit("app.lua", { SHARED_TENSOR_ENABLED = "1" })
    assert.are_not.equal(0, rc)
    assert.matches("app%.lua:6: no server at " .. base:gsub("%p", "%%%0") .. "%-0%.sock: " ..
                   "start one with SHARED_TENSOR_ENABLED=1 SHARED_TENSOR_ROLE=server " ..
                   "luajit app%.lua", err)
    local _, rc2, err2 = luajit("app.lua", { SHARED_TENSOR_ENABLED = "yes",
                                             SHARED_TENSOR_ROLE = "client",
                                             SHARED_TENSOR_DEVICE = "3" })
    assert.are_not.equal(0, rc2)
    assert.matches("no server at .*st%-3%.sock", err2)
  end)

  it("server role serves other clients; client role runs main against it", function()
    local s = start_server_role("app.lua")
    -- stcli, and the Lua client from this process
    local out, rc, err = cli("call", "scaled", "n=2", "tag=cli", "--values")
    assert.are.equal(0, rc, err)
    assert.matches("values: 2.5 2.5", out)
    local st = require("st.client")
    local c = assert(st.connect { base_path = base })
    local r = assert(c:call("where"))
    assert.are.equal("built on the server", r.value)
    assert.are.equal(s.pid, assert(c:info()).pid)
    c:close()
    -- the script in the client role, twice: the second gets the cached object
    for _ = 1, 2 do
      out, rc, err = luajit("app.lua", { SHARED_TENSOR_ENABLED = "1" })
      assert.are.equal(0, rc, err)
      assert.matches("top level ran, role client", out)
      assert.matches("main: role client, values 2.5 2.5 2.5, tag x, object 2", out)
      assert.matches("after main: main's result", out)
    end
    -- the server role runs the top level in its sandbox only (print goes
    -- to its log) and never main
    local log = H.read(s.log)
    assert.matches("app%.lua:5: top level ran, role server", log)
    assert.not_matches("main:", log)
    assert.matches("server: ready", log)
    assert.are.equal(0, stop_server_role(s))
    assert.is_nil(H.read(base .. "-0.sock"))
    assert.matches("shutting down", H.read(s.log))
  end)

  it("server role reloads the script on SIGHUP, keeping it on a bad edit", function()
    H.write(dir .. "/hup.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "one", build = function() return 1 end }
]])
    local s = start_server_role("hup.lua")
    local out = cli("endpoints")
    assert.matches("one", out)
    assert.not_matches("two", out)
    H.write(dir .. "/hup.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "one", build = function() return 1 end }
app:endpoint { name = "two", build = function() return 2 end }
app:main(function(c) end)
]])
    H.run("kill -HUP " .. s.pid)
    local deadline, rc = now() + 10, nil
    repeat out, rc = cli("call", "two") until rc == 0 or now() > deadline
    assert.are.equal(0, rc)
    H.write(dir .. "/hup.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "one", build = function() return 1 end }
app:endpoint { name = "three", timout = 1, build = function() return 3 end }
]])
    H.run("kill -HUP " .. s.pid)
    deadline = now() + 10
    local info
    repeat info = cli("--json", "info") until info:match('"ok"%s*:%s*false') or now() > deadline
    assert.matches("hup%.lua:3: unknown option 'timout'", info)
    out, rc = cli("call", "two")                    -- the old generation serves on
    assert.are.equal(0, rc)
    assert.are.equal(0, stop_server_role(s))
  end)

  it("server role: SHARED_TENSOR_DEVICE picks the socket; a bad script exits 1", function()
    local log, exitf = dir .. "/dev.log", dir .. "/dev.exit"
    H.write(dir .. "/nothing.lua", "local app = require('st.zerobranch').app()\n")
    local _, rc = H.run(string.format("cd %s && %s env SHARED_TENSOR_ENABLED=on " ..
      "SHARED_TENSOR_ROLE=SERVER SHARED_TENSOR_BASE_PATH=%s luajit nothing.lua >%s 2>&1",
      q(dir), lib_env(), q(base), q(log)))
    assert.are.equal(1, rc)
    assert.matches("nothing%.lua: the script makes an app but declares no endpoint", H.read(log))
    local s = start_server_role("app.lua", "SHARED_TENSOR_DEVICE=2", 2)
    local out, crc, err = luajit("app.lua", { SHARED_TENSOR_ENABLED = "1", SHARED_TENSOR_DEVICE = "2" })
    assert.are.equal(0, crc, err)
    assert.matches("main: role client", out)
    assert.are.equal(0, stop_server_role(s))
    assert.is_nil(H.read(base .. "-2.sock"))
    os.remove(exitf)
  end)

  it("raises on misuse", function()
    H.write(dir .. "/good.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "x", build = function() return 1 end }
]])
    local cases = {
      -- The server loads good.lua (app{file=}), so these get past the
      -- first main and the Lua side finds the misuse.
      { "late.lua", [[
local app = require("st.zerobranch").app { file = "good.lua" }
app:endpoint { name = "x", build = function() return 1 end }
app:main(function(c) assert(c:call("x")) end)
app:endpoint { name = "y", build = function() return 1 end }
]], "late%.lua:4: app:endpoint: called after app:main" },
      { "twice.lua", [[
local app = require("st.zerobranch").app { file = "good.lua" }
app:main(function(c) end)
app:main(function(c) end)
]], "twice%.lua:3: app:main: called twice" },
      -- The server stops reading at main: the Lua side finds it.
      { "late2.lua", [[
local app = require("st.zerobranch").app()
app:endpoint { name = "x", build = function() return 1 end }
app:main(function(c) end)
app:endpoint { name = "y", build = function() return 1 end }
]], "late2%.lua:4: app:endpoint: called after app:main" },
      { "notfn.lua", [[
local app = require("st.zerobranch").app()
app:main("go")
]], "notfn%.lua:2: app:main expects a function, got string" },
      { "opt.lua", [[
local app = require("st.zerobranch").app { wokers = 2 }
]], "opt%.lua:1: app: unknown option 'wokers'" },
      { "stbody.lua", [[
local app = require("st.zerobranch").app()
local z = st.zeros { 2 }
]], "stbody%.lua:2: st%.zeros is only available on the server" },
    }
    for _, c in ipairs(cases) do
      H.write(dir .. "/" .. c[1], c[2])
      local _, rc, err = luajit(c[1])
      assert.are_not.equal(0, rc, c[1])
      assert.matches(c[3], err)
    end
    local _, rc, err = luajit("app.lua", { SHARED_TENSOR_ENABLED = "1", SHARED_TENSOR_ROLE = "both" })
    assert.are_not.equal(0, rc)
    assert.matches('SHARED_TENSOR_ROLE must be "server" or "client" %(or unset%), got "both"', err)
    _, rc, err = luajit("app.lua", { SHARED_TENSOR_ENABLED = "1", SHARED_TENSOR_DEVICE = "gpu" })
    assert.are_not.equal(0, rc)
    assert.matches('SHARED_TENSOR_DEVICE must be a socket index from 0 to 4095, got "gpu"', err)
    assert.are.equal("", tmp_entries())
  end)

  it("runs the example in all three roles", function()
    local out, rc, err = H.run("ST_BUILD_DIR=" .. q(os.getenv("ST_BUILD_DIR")) .. " " ..
                               q(H.source_dir() .. "/examples/zero_branch/run.sh"))
    assert.are.equal(0, rc, err)
    assert.matches("role in%-process: server pid %d+ %(this process%)", out)
    assert.matches("again: object 1, the same memory, from the cache", out)
    assert.matches("no server at .*: start one with", out)
    assert.matches("role client: server pid %d+ %(another process%)", out)
    assert.matches("linear%s+direct%s+parallel%s+managed cache", out)
    assert.matches("server stopped cleanly", out)
    local ys = {}
    for y in out:gmatch("y%[%d%] = [-%d.]+") do ys[#ys + 1] = y end
    assert.are.equal(6, #ys)                       -- in-process, then two clients
    assert.are.same({ ys[1], ys[2] }, { ys[3], ys[4] })
    assert.are.same({ ys[1], ys[2] }, { ys[5], ys[6] })
  end)
end)

describe("the sandbox's st.zerobranch", function()
  local srv
  setup(function()
    srv = H.server { endpoints = {
      ["script.lua"] = [[
local zb = require("st.zerobranch")
local app = zb.app { workers = 2 }
app:endpoint { name = "role", build = function() return app:role() end }
app:endpoint { name = "same", build = function() return require("st.zerobranch") == zb end }
app:endpoint { name = "nested", build = function() app:endpoint { name = "n2", build = print } end }
app:endpoint { name = "pmain", params = { twice = false }, build = function(a)
  local ok, err = pcall(app.main, app, function() end)
  return err
end }
app:main(function(c) error("main never runs on the server") end)
error("nor does anything after main")
]],
      ["plain.lua"] = "return st.endpoint { name = 'plain', build = function() return 'p' end }\n",
      ["req.lua"] = [[
return {
  st.endpoint { name = "req_client", build = function() return require("st.client") end },
  st.endpoint { name = "req_path", build = function() return require("st.../../etc/passwd") end },
  st.endpoint { name = "req_st", build = function() return require("st") == st end },
  st.endpoint { name = "mutate", build = function() require("st.zerobranch").app = nil end },
}
]],
    } }
  end)
  teardown(function()
    if srv then srv:finish() end
  end)

  it("is the one module besides st that require knows", function()
    local out, rc = srv:cli("call", "role")
    assert.are.equal(0, rc)
    assert.matches('"server"', out)
    out, rc = srv:cli("call", "same")
    assert.are.equal(0, rc)
    assert.matches("true", out)
    out, rc = srv:cli("call", "req_st")
    assert.matches("true", out)
    out, rc = srv:cli("call", "plain")
    assert.are.equal(0, rc)
    for _, name in ipairs({ "req_client", "req_path" }) do
      local _, crc, err = srv:cli("call", name)
      assert.are_not.equal(0, crc)
      assert.matches("ENDPOINT", err)
      assert.matches("req%.lua:%d+: require: module 'st%.[^']*' is not available in " ..
                     "endpoints %(only 'st' and 'st%.zerobranch'%)", err)
    end
    local _, nrc, nerr = srv:cli("call", "nested")
    assert.are_not.equal(0, nrc)
    assert.matches("script%.lua:5: app:endpoint: only at the top level of a script", nerr)
    out = srv:cli("call", "pmain")                 -- a body cannot end a file
    assert.matches("script%.lua:7: app:main: only at the top level of a script", out)
    local _, mrc, merr = srv:cli("call", "mutate")
    assert.are_not.equal(0, mrc)
    assert.matches("read%-only", merr)
  end)
end)

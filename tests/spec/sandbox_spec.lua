-- Every way out of the endpoint sandbox, tried by a real endpoint running in
-- a real stserver and called over the socket with stcli. Each must fail with
-- an ENDPOINT error that names the file and line, and the server must keep
-- serving afterwards.
local H = require("st_harness")

local escapes = {
  io_open          = [[return io.open("/etc/passwd")]],
  os_execute       = [[return os.execute("true")]],
  os_exit          = [[os.exit(3)]],
  os_getenv        = [[return os.getenv("HOME")]],
  os_remove        = [[return os.remove("/tmp/x")]],
  require_ffi      = [[return require("ffi")]],
  require_io       = [[return require("io")]],
  require_os       = [[return require("os")]],
  require_st_client = [[return require("st.client")]],        -- only st, st.zerobranch
  require_st_path  = [[return require("st.../../../etc/passwd")]],
  zerobranch_mutation = [[require("st.zerobranch").app = nil return 1]],
  ffi_global       = [[return ffi.C]],
  debug_global     = [[return debug.getinfo(1)]],
  jit_global       = [[return jit.version]],
  package_loadlib  = [[return package.loadlib("libc.so.6", "system")]],
  dofile           = [[return dofile("/etc/passwd")]],
  loadfile         = [[return loadfile("/etc/passwd")]],
  loadstring       = [[return loadstring("return 1")]],
  load_bytecode    = [[return load("\27LJ\2\0")]],
  string_dump      = [[return string.dump(function() end)]],
  new_global       = [[leaked = 1 return 1]],
  undeclared_read  = [[return undeclared_thing + 1]],
  setfenv          = [[return setfenv(1, {})]],
  getfenv          = [[return getfenv(0)]],
  rawset_G         = [[rawset(_G, "x", 1) return 1]],
  st_mutation      = [[st.zeros = nil return 1]],
  string_meta      = [[getmetatable("").__index = nil return 1]],
  collectgarbage   = [[collectgarbage("stop") return 1]],
  newproxy         = [[return newproxy(true)]],
  coroutine_wrap_io = [[return coroutine.wrap(function() return io end)()]],
}

describe("endpoint sandbox", function()
  local srv
  setup(function()
    local eps = {}
    for name, body in pairs(escapes) do
      eps[name .. ".lua"] = string.format(
        "return st.endpoint{ name = %q, build = function(a)\n%s\nend }\n", name, body)
    end
    eps["ok.lua"] = "return st.endpoint{ name = 'ok', build = function() return 'fine' end }\n"
    eps["zb_ok.lua"] = "return st.endpoint{ name = 'zb_ok', build = function()\n" ..
      "  return type(require('st.zerobranch').app) .. ' ' .. tostring(require('st') == st)\n" ..
      "end }\n"
    srv = H.server{ endpoints = eps }
  end)
  teardown(function()
    if srv then srv:finish() end
  end)

  it("lets require reach st and the built-in st.zerobranch, nothing else", function()
    local out, rc, err = srv:cli("--json", "call", "zb_ok")
    assert.are.equal(0, rc, err)
    assert.matches("function true", out)
    local _, _, cerr = srv:cli("call", "require_st_client")
    assert.matches("module 'st.client' is not available in endpoints %(only 'st' and " ..
                   "'st.zerobranch'%)", cerr)
  end)

  for name in pairs(escapes) do
    it("refuses " .. name, function()
      local out, rc, err = srv:cli("call", name)
      assert.are_not.equal(0, rc, "escape " .. name .. " succeeded: " .. out)
      assert.matches("ENDPOINT", err)
      assert.matches(name .. "%.lua:%d+", err)
      -- and the server still serves everyone
      local ok_out, ok_rc = srv:cli("--json", "call", "ok")
      assert.are.equal(0, ok_rc)
      assert.matches("fine", ok_out)
    end)
  end
end)

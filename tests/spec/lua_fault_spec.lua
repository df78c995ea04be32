-- A write to read-only memory from the Lua client (lua/st/client.lua over
-- libstclient) names what it hit before the process dies (docs/client.md,
-- "A write to read-only memory"): a luajit process writes to the result
-- of an endpoint declared readonly, and to a cached object it called
-- read-only; it dies of SIGSEGV as before (status 139) and its stderr
-- names the endpoint. A write to a writable result does not die.
local H = require("st_harness")

local luajit = H.luajit

describe("Lua writes to read-only memory", function()
  local srv
  local env = H.serving({
    ["rozeros.lua"] = [[
return st.endpoint{ name = "rozeros", cache = true, readonly = true,
  build = function() return { w = st.zeros{16} } end }
]],
    ["zeros.lua"] = [[
return st.endpoint{ name = "zeros", cache = true,
  build = function() return { w = st.zeros{16} } end }
]] })
  setup(function() env.start(); srv = env.srv end)
  teardown(env.stop)

  local function write_to(call)
    return luajit(([[
      local st = require("st.client")
      local c = assert(st.connect{ path = %q })
      local res = assert(%s)
      res.value.w:set(0, 1)
      print("wrote")
    ]]):format(srv.socket, call))
  end

  it("names the endpoint of a result declared readonly, then dies as before", function()
    local out, rc, err = write_to('c:call("rozeros")')
    assert.are.equal(139, rc, err)
    assert.are.equal("", out)
    assert.matches("sharedtensor: write to read-only memory of the result of endpoint 'rozeros' at 0x",
                   err, 1, true)
    assert.matches("Re-raising SIGSEGV.", err, 1, true)
  end)

  it("names the endpoint of an object called read-only; a writable one is written", function()
    local out, rc, err = write_to('c:call("zeros", nil, { readonly = true })')
    assert.are.equal(139, rc, err)
    assert.matches("of the result of endpoint 'zeros'", err, 1, true)
    out, rc, err = write_to('c:call("zeros")')
    assert.are.equal(0, rc, err)
    assert.are.equal("wrote\n", out)
    assert.are.equal("", err)
  end)
end)

-- The Lua client (lua/st/client.lua, LuaJIT FFI over libstclient) against a
-- real stserver: values, modules, arguments, objects, tasks and errors.
local H = require("st_harness")
local st = require("st.client")

local endpoints = {
  ["t.lua"] = [[
return st.endpoint{ name = "t", params = { n = 4, scale = 0.5 },
  build = function(a)
    local t = st.arange{a.n, dtype = "float32"}
    return { x = t, n = a.n, scale = a.scale, tag = "ok", list = { 1, 2, 3 } }
  end }
]],
  ["mod.lua"] = [[
return st.endpoint{ name = "mod", managed = true, cache_format_key = "mod:{rows}",
  params = { rows = 2 },
  build = function(a)
    return st.module{ weight = st.ones{a.rows, 3}, bias = st.zeros{a.rows} }
  end }
]],
  ["echo.lua"] = [[
return st.endpoint{ name = "echo", params = { value = st.required },
  build = function(a) return a.value end }
]],
  ["task.lua"] = [[
return st.endpoint{ name = "slow", execution = "task", params = { s = 0.05 },
  build = function(a) st.progress(0.5, "half") st.sleep(a.s) return st.full{2, value = 7} end }
]],
  ["bad.lua"] = [[
return st.endpoint{ name = "bad",
  build = function(a)
    error("boom")
  end }
]],
}

describe("the Lua client", function()
  local srv, c
  setup(function()
    srv = H.server{ endpoints = endpoints }
    c = assert(st.connect{ path = srv.socket })
  end)
  teardown(function()
    if c then c:close() end
    if srv then
      assert.are.equal(0, srv:stop())
      srv:cleanup()
    end
  end)

  it("connects and pings", function()
    assert.matches("^%x+$", c.server_id)
    local rtt = assert(c:ping())
    assert.is_true(rtt > 0)
  end)

  it("calls with arguments and maps the tensor", function()
    local res = assert(c:call("t", { n = 6, scale = 2.5 }))
    local v = res.value
    assert.are.equal(6, v.n)
    assert.are.equal(2.5, v.scale)
    assert.are.equal("ok", v.tag)
    assert.are.same({ 1, 2, 3 }, v.list)
    local x = v.x
    assert.are.equal("float32", x.dtype)
    assert.are.same({ 6 }, x.shape)
    assert.are.equal("cpu", x.device)
    assert.are.same({ 0, 1, 2, 3, 4, 5 }, x:tolist())
    assert.are.equal(5, x:ptr("float")[5])   -- the mapped memory itself
    res:free()
  end)

  it("round-trips nested arguments", function()
    local v = { a = { 1, 2.5, "x" }, b = true, c = { d = "e" } }
    local res = assert(c:call("echo", { value = v }))
    assert.are.same(v, res.value)
  end)

  it("gets a managed module with one lease, and releases it", function()
    local res = assert(c:call("mod", { rows = 3 }))
    local m = res.value
    assert.are.same({ "bias", "weight" }, m.names)
    assert.are.same({ 3, 3 }, m.tensors.weight.shape)
    assert.are.equal(1, m.tensors.weight:get(8))
    assert.is_truthy(res.object)
    assert.is_true(res.object.lease)
    assert.are.equal("mod:3", res.object.cache_key)
    assert.is_true(c:ensure_live(res.object.id))
    local r = assert(c:release(res.object.id))
    assert.is_true(r.released)
    assert.is_false(r.destroyed)            -- still cached
    assert.is_false(assert(c:release(res.object.id)).released)   -- idempotent
    assert.is_true(c:invalidate("mod", { rows = 3 }))
    local ok, err = c:ensure_live(res.object.id)
    assert.is_nil(ok)
    assert.matches("^STALE_HANDLE", err)
    -- The mapping outlives the object.
    assert.are.equal(1, m.tensors.weight:get(0))
    res:free()
  end)

  it("submits, waits and fetches a task result", function()
    local id = assert(c:submit("slow", { s = 0.05 }))
    local info = assert(c:wait(id, 10))
    assert.are.equal("completed", info.status)
    assert.are.equal("half", info.note)
    local res = assert(c:result(id))
    assert.are.same({ 7, 7 }, res.value:tolist())
    local _, err = c:result(id)
    assert.matches("^TASK", err)   -- a result is handed over once
  end)

  it("returns nil, err for runtime failures", function()
    local r, err, name = c:call("nope")
    assert.is_nil(r)
    assert.are.equal("UNKNOWN_ENDPOINT", name)
    r, err = c:call("bad")
    assert.is_nil(r)
    assert.matches("^ENDPOINT: .*bad%.lua:3", err)
    r, err = c:call("t", { bogus = 1 })
    assert.matches("^INVALID_ARGUMENT", err)
    local none, cerr = st.connect{ path = srv.dir .. "/nothing.sock" }
    assert.is_nil(none)
    assert.matches("^IO", cerr)
  end)

  it("raises on misuse", function()
    assert.has_error(function() c:call(42) end)
    assert.has_error(function() c:call("t", "n=3") end)
    assert.has_error(function() c:call("t", { f = function() end }) end)
    assert.has_error(function() st.connect{ device = -1 } end)
    local d = assert(st.connect{ path = srv.socket })
    d:close()
    assert.has_error(function() d:ping() end)
  end)
end)

-- Arguments keep their exact values, from the Lua client (lua/st/args.lua
-- over the nested builder of libstclient) and from stcli (key=value words
-- and JSON text), through a real stserver: what the endpoint sees (st.null
-- for a nil inside a table) and what comes back.
local H = require("st_harness")
local st = require("st.client")
local C = require("st.ffi")
local ffi = require("ffi")

local endpoints = {
  ["echo.lua"] = [[
return st.endpoint{ name = "echo", params = { value = st.required },
  build = function(a) return a.value end }
]],
  -- What the endpoint sees, rendered on the server.
  ["seen.lua"] = H.read(H.source_dir() .. "/tests/spec/seen_endpoint.lua"),
  -- Returns st.null in every place a result can hold it.
  ["nulls.lua"] = [[
return st.endpoint{ name = "nulls",
  build = function() return { list = { 1, st.null, 3 }, map = { a = st.null }, top = st.null } end }
]],
}

-- The echoed value as the C library's JSON (tells [] from {}).
local function json_of(res)
  local p = C.lib.st_value_json(C.lib.st_result_value(res._h), 0)
  local s = ffi.string(p)
  ffi.C.free(p)
  return s
end
ffi.cdef [[ void free(void *); ]]

local function message(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  return tostring(err)
end

describe("arguments", function()
  local env = H.serving(endpoints)
  setup(env.start)
  teardown(env.stop)

  local function echo(v)
    local res = assert(env.c:call("echo", { value = v }))
    local out, json = res.value, json_of(res)
    res:free()
    return out, json
  end

  local function seen(v)
    return assert(env.c:call("seen", { value = v })).value
  end

  it("round-trips every type from Lua", function()
    local cases = {
      { 42, "42" }, { -7, "-7" }, { 2 ^ 53, "9007199254740992" }, { 0.5, "0.5" },
      { -1.5e300, "-1.5e+300" }, { true, "true" }, { false, "false" },
      { "a\0b", '"a\\u0000b"' }, { "", '""' },
      { { 1, st.null, 3 }, "[1,null,3]" }, { { st.null }, "[null]" },
      { { a = 1, b = st.null }, '{"a":1,"b":null}' },
      { { x = { y = { 1, { z = st.null } } } }, '{"x":{"y":[1,{"z":null}]}}' },
      { {}, "[]" }, { st.map({}), "{}" }, { { "k\0z" }, '["k\\u0000z"]' },
    }
    for _, case in ipairs(cases) do
      local out, json = echo(case[1])
      assert.are.equal(case[2], json)
      if type(case[1]) ~= "table" then assert.are.equal(case[1], out) end
    end
    local out = echo({ 1, st.null, 3 })
    assert.are.same({ 1, st.null, 3 }, out)
    assert.are.equal(st.null, out[2])
    out = echo({ a = 1, b = st.null })
    assert.are.equal(st.null, out.b)
    -- A top-level nil result is st.null too, as before.
    assert.are.equal(st.null, (echo(st.null)))
    -- int64 cdata go as integers; beyond 2^53 they come back as cdata.
    out = echo(ffi.new("int64_t", 2) ^ 62)
    assert.are.equal(4611686018427387904LL, out)
    -- A map key with a NUL byte keeps it.
    local _, json = echo({ ["k\0"] = 1 })
    assert.are.equal('{"k\\u0000":1}', json)
  end)

  it("shows the endpoint st.null for a nil inside a table", function()
    assert.are.equal("[1,null,3]", seen({ 1, st.null, 3 }))
    assert.are.equal("[null]", seen({ st.null }))
    assert.are.equal("{a=1,b=null}", seen({ a = 1, b = st.null }))
    assert.are.equal('"a\\0b"', seen("a\0b"))
    -- An argument that is nil itself stays nil.
    assert.are.equal("nil", seen(st.null))
    -- st.null returned by an endpoint is nil on the wire, in every place.
    local res = assert(env.c:call("nulls"))
    assert.are.equal('{"list":[1,null,3],"map":{"a":null},"top":null}', json_of(res))
    res:free()
  end)

  it("nests 28 levels of lists and maps in an argument, and refuses 29", function()
    -- A request holds 32 levels of containers; 4 are its own.
    local v = { 1 }
    for _ = 2, 28 do v = { v } end
    local _, json = echo(v)
    assert.are.equal(string.rep("[", 28) .. "1" .. string.rep("]", 28), json)
    assert.are.equal(string.rep("[", 28) .. "1" .. string.rep("]", 28), seen(v))
    assert.matches("argument 'value': lists and maps nested deeper than 28 levels",
      message(function() env.c:call("echo", { value = { v } }) end), 1, true)
    local cycle = {}
    cycle[1] = cycle
    assert.matches("nested deeper than 28 levels", message(function()
      env.c:call("echo", { value = cycle })
    end), 1, true)
    assert.is_true(env.c:ping() > 0)   -- refused before anything was sent
  end)

  it("refuses what has no exact form", function()
    assert.matches("argument 'value': a list cannot hold nil (index 2 is missing): write st.null",
      message(function() env.c:call("echo", { value = { 1, nil, 3 } }) end), 1, true)
    assert.matches("argument 'value': map keys must be strings (found a number key)",
      message(function() env.c:call("echo", { value = { 1, x = 2 } }) end), 1, true)
    assert.matches("argument 'value': cannot send a function",
      message(function() env.c:call("echo", { value = { print } }) end), 1, true)
    assert.matches("does not fit an int64",
      message(function() env.c:call("echo", { value = 0xffffffffffffffffULL }) end), 1, true)
    assert.matches("st.map: expected a table", message(function() st.map(1) end), 1, true)
    assert.is_true(env.c:ping() > 0)   -- nothing was sent
  end)

  it("round-trips every type from stcli", function()
    local cases = {
      { "value=42", "42" }, { "value=-7", "-7" }, { "value=9007199254740993", "9007199254740992" },
      { "value=0.5", "0.5" }, { "value=true", "true" }, { "value=null", "null" },
      { "value=x", '"x"' }, { "value:json=\"a\\u0000b\"", '"a\\u0000b"' },
      { "value:json=[1,null,3]", "[1,null,3]" }, { "value:json=[null]", "[null]" },
      { 'value:json={"a":1,"b":null}', '{"a":1,"b":null}' },
      { "value:json=[]", "[]" }, { "value:json={}", "{}" },
      { 'value:json={"x":{"y":[1,{"z":null}]}}', '{"x":{"y":[1,{"z":null}]}}' },
    }
    for _, case in ipairs(cases) do
      local out, rc = env.srv:cli("--json", "call", "echo", case[1])
      assert.are.equal(0, rc)
      assert.are.equal(case[2], (out:gsub("%s", "")))
    end
    local out, rc = env.srv:cli("--json", "call", "echo", "--args-json",
      '{"value": [1, null, {"b": null}]}')
    assert.are.equal(0, rc)
    assert.are.equal('[1,null,{"b":null}]', (out:gsub("%s", "")))
    out, rc = env.srv:cli("call", "seen", "value:json=[1,null,3]")
    assert.are.equal(0, rc)
    assert.matches("[1,null,3]", out, 1, true)
  end)
end)

-- The Lua client (lua/st/client.lua, LuaJIT FFI over libstclient) against a
-- real stserver: values, modules, arguments, objects, tasks and errors, and
-- tensor arguments (st.empty/st.zeros memory passed to endpoints in place).
local H = require("st_harness")
local st = require("st.client")
local ffi = require("ffi")

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
  ["scale.lua"] = [[
return st.endpoint{ name = "scale", params = { x = st.tensor_param{}, k = 2.5 },
  build = function(a) return a.x:mul_(a.k) end }
]],
  ["sum64.lua"] = [[
return st.endpoint{ name = "sum64",
  params = { x = st.tensor_param{ dtype = "float64", device = "cpu" } },
  build = function(a)
    local s = 0
    for i = 0, a.x:numel() - 1 do s = s + a.x:get(i) end
    return s
  end }
]],
  ["geometry.lua"] = [[
return st.endpoint{ name = "geometry", params = { x = st.tensor_param{} },
  build = function(a)
    return { shape = a.x:shape(), stride = a.x:stride(), first = a.x:get(0, 0),
             dtype = a.x:dtype(), device = a.x:device() }
  end }
]],
  ["cached.lua"] = [[
return st.endpoint{ name = "cached", cache = true, params = { x = st.required },
  build = function(a) return 1 end }
]],
  ["c4.lua"] = [[
return st.endpoint{ name = "c4", cache = true,
  build = function() return st.arange{4, dtype = "float32"} end }
]],
  ["full.lua"] = [[
return st.endpoint{ name = "full", cache = true, params = { v = 1 },
  build = function(a) return st.module{ w = st.full{3, value = a.v} } end }
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
  local env = H.serving(endpoints)
  setup(function() env.start(); srv, c = env.srv, env.c end)
  teardown(env.stop)

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

  it("sends any method by name", function()
    local res = assert(c:rpc("keys", { prefix = "nothing-here/" }))
    assert.are.same({}, res.value)
    res:free()
    res = assert(c:rpc("endpoints"))
    local names = {}
    for _, e in ipairs(res.value) do names[e.name] = true end
    assert.is_true(names.t)
    res:free()
    local r, err = c:rpc("no_such_method")
    assert.is_nil(r)
    assert.matches("unknown method 'no_such_method'", tostring(err))
  end)

  it("round-trips nested arguments", function()
    local v = { a = { 1, 2.5, "x" }, b = true, c = { d = "e" } }
    local res = assert(c:call("echo", { value = v }))
    assert.are.same(v, res.value)
  end)

  it("keeps binary apart from strings, in values and cache keys", function()
    local b = st.bytes("\255\0")
    local got = assert(c:call("echo", { value = { b, "\255\0" } })).value
    assert.are.equal(b, got[1])                  -- binary back as st.bytes
    assert.are.equal("\255\0", tostring(got[1]))
    assert.are.equal(2, #got[1])
    assert.are.equal("string", type(got[2]))
    local kb = assert(c:call("cached", { x = st.bytes("ab") })).object.cache_key
    local ks = assert(c:call("cached", { x = "ab" })).object.cache_key
    assert.are.equal('{"x":b"ab"}', kb)
    assert.are.equal('{"x":"ab"}', ks)
    local kn = assert(c:call("cached", { x = st.bytes("\255\0") })).object.cache_key
    assert.are.equal('{"x":b"\\xff\\x00"}', kn)
  end)

  it("refuses options it does not know", function()
    local ok, msg = pcall(function() return c:call("echo", { value = 1 }, { readnly = true }) end)
    assert.is_false(ok)
    assert.matches("call: unknown option 'readnly' (allowed: readonly, view)", msg, 1, true)
    ok, msg = pcall(function() return c:get("k", { readonly = "yes" }) end)
    assert.is_false(ok)
    assert.matches("get: opts.readonly must be true or false, not yes", msg, 1, true)
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

  it("gets a held managed object again as the same tensors, with a lease each call", function()
    local a = assert(c:call("mod", { rows = 4 }))
    local b = assert(c:call("mod", { rows = 4 }))   -- a `same` reply: nothing decoded
    assert.are.equal(a.object.id, b.object.id)
    assert.is_true(a.object.lease and b.object.lease)
    assert.are.same({ 1, 2 }, { a.object.refcount, b.object.refcount })
    assert.are.equal(a.value.tensors.weight, b.value.tensors.weight)   -- the same tensor
    assert.are.equal(1, assert(c:release(b.object.id)).refcount)
    assert.are.equal(0, assert(c:release(a.object.id)).refcount)
    a:free()
    b:free()
  end)

  it("releases without waiting for the answer", function()
    local a = assert(c:call("mod", { rows = 5 }))
    local b = assert(c:call("mod", { rows = 5 }))
    assert.is_true(c:release(b.object.id, false))
    -- The next request already finds that lease given back.
    assert.are.equal(0, assert(c:release(a.object.id)).refcount)
    assert.is_true(c:release(a.object.id, false))   -- none left: nothing changes
    assert.is_true(c:ensure_live(a.object.id))       -- still cached
    a:free()
    b:free()
  end)

  it("sees a result through a view, and reports a bad one", function()
    local res = assert(c:call("mod", { rows = 3 }, { view = "weight:shard(0,1,3)|transpose(0,1)" }))
    local w = res.value.tensors.weight
    assert.are.same({ 3, 1 }, w.shape)
    assert.are.equal(1, w:get(2))
    assert.is_true(res.object.lease)
    assert(c:release(res.object.id))
    res:free()
    res = assert(c:call("t", { n = 6 }, { view = "x:slice(0,1,6,2)|contiguous" }))
    assert.are.same({ 3 }, res.value.x.shape)
    assert.are.same({ 1, 3, 5 }, { res.value.x:get(0), res.value.x:get(1), res.value.x:get(2) })
    res:free()
    local ok, err = c:call("t", {}, { view = "x:shard(0,4,4)" })
    assert.is_nil(ok)
    assert.matches("^INVALID_ARGUMENT: shard%(0,4,4%): rank 4 is not below world 4 %(tensor 'x'%)", err)
    assert.has_error(function() c:call("t", {}, { view = 3 }) end, "call: opts.view must be a string")
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

  it("checks the uid the server runs as before it sends anything", function()
    local me = tonumber(io.popen("id -u"):read("*l"))
    local d = assert(st.connect{ path = srv.socket, server_uid = me })
    d:close()
    local none, err, name = st.connect{ path = srv.socket, server_uid = me + 1 }
    assert.is_nil(none)
    assert.are.equal("AUTH", name)
    assert.matches("runs as uid " .. me .. "; this client expects uid " .. (me + 1), err, 1, true)
    assert.has_error(function() st.connect{ path = srv.socket, server_uid = -1 } end)
  end)

  it("bounds connecting with timeout_ms (a listener that never answers)", function()
    pcall(ffi.cdef, [[
      int socket(int domain, int type, int protocol);
      int bind(int fd, const void *addr, unsigned len);
      int listen(int fd, int backlog);
      int close(int fd);
      struct spec_sockaddr_un { unsigned short family; char path[108]; };
    ]])
    local path = srv.dir .. "/silent.sock"
    local sa = ffi.new("struct spec_sockaddr_un", { family = 1 })   -- AF_UNIX
    ffi.copy(sa.path, path)
    local fd = ffi.C.socket(1, 1, 0)                                  -- SOCK_STREAM
    assert(fd >= 0 and ffi.C.bind(fd, sa, ffi.sizeof(sa)) == 0 and ffi.C.listen(fd, 8) == 0)
    local t0 = H.now()
    local none, err, name = st.connect{ path = path, timeout_ms = 300 }
    local took = H.now() - t0
    ffi.C.close(fd)
    assert.is_nil(none)
    assert.are.equal("TIMEOUT", name)
    assert.matches("did not answer hello within 300 ms", err, 1, true)
    assert.is_true(took >= 0.29 and took < 2.3, "took " .. took .. " s")
    assert.has_error(function() st.connect{ path = path, timeout_ms = -1 } end)
  end)

  -- A float32 tensor of the given shape holding 0, 1, 2, ...
  local function counting(shape, dtype)
    local x = assert(st.zeros(shape, { dtype = dtype }))
    for i = 0, x.numel - 1 do x:set(i, i) end
    return x
  end

  it("allocates zeroed tensors that endpoints can take", function()
    local x = assert(st.zeros({ 3, 5 }, { dtype = "int32" }))
    assert.are.equal("int32", x.dtype)
    assert.are.same({ 3, 5 }, x.shape)
    assert.are.same({ 5, 1 }, x.strides)
    assert.are.equal(15, x.numel)
    assert.are.equal(60, x.nbytes)
    assert.are.equal("cpu", x.device)
    for i = 0, 14 do assert.are.equal(0, x:get(i)) end
    x:set(7, -3.9)                          -- stored as int32: truncated
    assert.are.equal(-3, x:get(7))
    assert.are.equal(-3, x:ptr("int32_t")[7])
    local e = assert(st.empty(4))           -- float32, zeroed as well
    assert.are.equal("float32", e.dtype)
    assert.are.same({ 0, 0, 0, 0 }, e:tolist())
    local b = assert(st.zeros({ 2 }, { dtype = "bool" }))
    b:set(1, true)
    assert.are.same({ 0, 1 }, b:tolist())
    -- No GPU: nil, "CAPABILITY: ..."; with one, a tensor on cuda:0.
    local g, err = st.empty({ 2 }, { device = "cuda" })
    if g then
      assert.are.equal("cuda:0", g.device)
      assert.has_error(function() g:set(0, 1) end)
    else
      assert.matches("^CAPABILITY", err)
    end
  end)

  it("raises on a malformed allocation", function()
    local function message(fn)
      local ok, err = pcall(fn)
      assert.is_false(ok)
      return err
    end
    assert.matches("unknown dtype", message(function() st.empty({ 2 }, { dtype = "float5" }) end))
    assert.matches("must be an integer", message(function() st.zeros({ 2, -1 }) end))
    assert.matches("must be an integer", message(function() st.zeros({ 1.5 }) end))
    assert.matches("cuda:N", message(function() st.zeros({ 2 }, { device = "gpu" }) end))
    assert.matches("shape must be a table", message(function() st.zeros("2") end))
    local x = assert(st.zeros({ 2, 3 }))
    assert.matches("index 6 outside", message(function() x:set(6, 1) end))
    assert.matches("dim 2 outside", message(function() x:transpose(0, 2) end))
    assert.matches("exceeds size 2", message(function() x:narrow(0, 1, 2) end))
  end)

  it("lets an endpoint scale the caller's tensor in place", function()
    local x = counting({ 2, 3 })
    local res = assert(c:call("scale", { x = x, k = 3 }))
    assert.are.same({ 0, 3, 6, 9, 12, 15 }, x:tolist())
    assert.are.equal(15, x:ptr("float")[5])
    -- the reply is the caller's own memory at its own address (named by
    -- the argument's index: no descriptor, no second mapping)
    local back = res.value
    assert.are.same({ 2, 3 }, back.shape)
    assert.are.equal(tonumber(ffi.cast("uintptr_t", x:ptr("float"))),
                     tonumber(ffi.cast("uintptr_t", back:ptr("float"))))
    back:set(0, 42)
    assert.are.equal(42, x:get(0))
    res:free()
    -- and a second call scales again (default k = 2.5)
    assert(c:call("scale", { x = x }))
    assert.are.equal(37.5, x:get(5))
  end)

  it("gets its own memory back from echo", function()
    local x = counting({ 4 })
    local res = assert(c:call("echo", { value = x }))
    local e = res.value
    assert.are.same({ 0, 1, 2, 3 }, e:tolist())
    e:set(2, -7)
    assert.are.equal(-7, x:get(2))
    x:set(3, 11)
    assert.are.equal(11, e:get(3))
  end)

  it("passes views with their offset and strides", function()
    local x = counting({ 4, 6 })
    -- rows 1..2, transposed: shape {6, 2}, strides {1, 6}, first element 6
    local v = x:narrow(0, 1, 2):transpose(0, 1)
    assert.are.same({ 6, 2 }, v.shape)
    assert.are.same({ 1, 6 }, v.strides)
    local g = assert(c:call("geometry", { x = v })).value
    assert.are.same({ 6, 2 }, g.shape)
    assert.are.same({ 1, 6 }, g.stride)
    assert.are.equal(6, g.first)
    assert.are.equal("float32", g.dtype)
    assert.are.equal("cpu", g.device)
    -- every other column of row 3, negated in place; nothing else moves
    assert(c:call("scale", { x = x:narrow(0, 3, 1):slice(1, 0, 6, 2), k = -1 }))
    local want = {}
    for i = 0, 23 do want[i + 1] = (i >= 18 and i % 2 == 0) and -i or i end
    assert.are.same(want, x:tolist())
    -- echo hands the view back, same geometry, same memory
    local e = assert(c:call("echo", { value = v })).value
    assert.are.same({ 6, 2 }, e.shape)
    assert.are.same({ 1, 6 }, e.strides)
    assert.are.equal(12, e:get(1))
  end)

  it("submits a task with a tensor argument", function()
    local x = counting({ 3 })
    local id = assert(c:submit("scale", { x = x, k = -1 }))
    local info = assert(c:wait(id, 10))
    assert.are.equal("completed", info.status)
    assert(c:result(id))
    assert.are.same({ 0, -1, -2 }, x:tolist())
  end)

  it("reports refused tensor arguments", function()
    local f32 = counting({ 4 })
    local r, err = c:call("sum64", { x = f32 })
    assert.is_nil(r)
    assert.matches("^INVALID_ARGUMENT: .*argument 'x' has dtype float32; the endpoint wants float64", err)
    local s = assert(c:call("sum64", { x = counting({ 4 }, "float64") }))
    assert.are.equal(6, s.value)
    r, err = c:call("cached", { x = f32 })
    assert.is_nil(r)
    assert.matches("cannot be part of a key", err)
    r, err = c:invalidate("cached", { x = f32 })
    assert.is_nil(r)
    assert.matches("tensor arguments go only to call, submit and put", err)
    assert.is_true(c:ping() > 0)
    -- a result's tensor is the server's memory: misuse, raised with the route
    local res = assert(c:call("t", { n = 3 }))
    local ok, msg = pcall(function() return c:call("scale", { x = res.value.x }) end)
    assert.is_false(ok)
    assert.matches("argument 'x': this cpu tensor's memory was not allocated with st.empty", msg)
    assert.matches("copy_%(t%)", msg)
    local copy = assert(st.empty({ 3 })):copy_(res.value.x)
    assert(c:call("scale", { x = copy, k = 2 }))
    assert.are.same({ 0, 2, 4 }, copy:tolist())
    -- tensors go as arguments of their own, not inside tables
    ok, msg = pcall(function() return c:call("echo", { value = { f32 } }) end)
    assert.is_false(ok)
    assert.matches("not inside a table", msg)
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

  it("reuses a live result of an object, never a freed or replaced one", function()
    local r1 = assert(c:call("full", { v = 2 }))
    local r2 = assert(c:call("full", { v = 2 }))
    assert.are.equal(r1.object.id, r2.object.id)
    -- the same tensor tables, in a table of the result's own
    assert.are.equal(r1.value.tensors.w, r2.value.tensors.w)
    assert.are_not.equal(r1.value, r2.value)
    r2.value.tensors.w = nil
    assert.is_not_nil(r1.value.tensors.w)
    -- r2 holds the memory on its own: freeing r1 leaves r2's tensors valid
    r1:free()
    collectgarbage()
    assert.are.equal(2, r1.value.tensors.w:get(2))
    -- r1 freed: the next result converts anew
    local r3 = assert(c:call("full", { v = 2 }))
    assert.are_not.equal(r1.value.tensors.w, r3.value.tensors.w)
    assert.are.equal(2, r3.value.tensors.w:get(0))
    -- a replaced object (a new build) is never served from the old one
    r3.value.tensors.w:set(0, 9)
    assert.is_true(c:invalidate("full", { v = 2 }))
    local r4 = assert(c:call("full", { v = 2 }))
    assert.are_not.equal(r3.object.id, r4.object.id)
    assert.are_not.equal(r3.value.tensors.w, r4.value.tensors.w)
    assert.are.equal(2, r4.value.tensors.w:get(0))
    assert.are.equal(9, r3.value.tensors.w:get(0))
    r2:free()
    r3:free()
    r4:free()
  end)

  it("takes a `same` reply's lent result with one reference, and lets it go", function()
    local ffi = require("ffi")
    local lib = require("st.ffi").lib
    -- Whether the connection's next reply of c4 is `same` (a raw call).
    local function next_is_same()
      local out, s = ffi.new("st_result_t*[1]"), ffi.new("st_result_summary_t")
      assert.are.equal(0, lib.st_client_call_summary(c._h, "c4", nil, 0, out, s))
      lib.st_result_free(out[0])
      return s.same ~= 0
    end
    local r1 = assert(c:call("c4"))
    local r2 = assert(c:call("c4"))   -- lent: r1's result, one more reference
    assert.are.equal(r1.value, r2.value)
    r1:free()
    collectgarbage()
    assert.are.same({ 0, 1, 2, 3 }, r2.value:tolist())
    assert.is_true(next_is_same())
    r2:free()
    collectgarbage()
    assert(c:ping())   -- the lent reference goes first: the server is told
    assert.is_false(next_is_same())
    assert(c:ping())
    local r3 = assert(c:call("c4"))
    assert.are.same({ 0, 1, 2, 3 }, r3.value:tolist())
    r3:free()
  end)
end)

-- Named buffers from the Lua client (lua/st/buffer.lua) against a real
-- stserver: a writer in another luajit process and readers here, read_new
-- waking on its writes and timing out cleanly, read-only handles, the
-- writer lock (re-entrant per handle), clear, unsigned element types
-- (in buffers and from an endpoint), close and unlink, read grants
-- (opts.readers) sent and checked.
local H = require("st_harness")
local st = require("st.client")

local luajit = H.luajit

describe("Lua buffers", function()
  local srv, c
  local env = H.serving({ ["u.lua"] = [[
return st.endpoint{ name = "u", params = { dtype = "uint16" },
  build = function(a) return st.zeros{3, dtype = a.dtype}:set(0, 2^16 - 1):set(1, 7) end }
]] }, "memory_budget = { cpu = 64 * 2^20 },")
  setup(function() env.start(); srv, c = env.srv, env.c end)
  teardown(env.stop)

  it("passes frames from a writer process to a reader, read_new wakes and times out", function()
    local b = assert(c:buffer_create("lua.frames", { 4, 8 }, { dtype = "int32", slots = 2 }))
    assert.are.same({ 4, 8 }, b.shape)
    assert.are.equal("int32", b.dtype)
    assert.are.equal(2, b.slots)
    assert.are.equal(128, b.frame_bytes)
    assert.are.equal(0, b:write_sequence())
    local x, seq = assert(b:read())             -- write 0: zeros
    assert.are.equal(0, seq)
    assert.are.equal(0, x:get(31))
    local none, err, name = b:read_new(50)
    assert.is_nil(none)
    assert.are.equal("TIMEOUT", name)
    assert.matches("no write after 0", err)

    -- Three writes from another process: frame k holds k * 100 + i.
    local out, rc, errout = luajit(([[
      local st = require("st.client")
      local c = assert(st.connect{ path = %q })
      local b = assert(c:buffer_open("lua.frames"))
      local f = assert(st.empty({ 4, 8 }, { dtype = "int32" }))
      for k = 1, 3 do
        for i = 0, 31 do f:set(i, k * 100 + i) end
        print(assert(b:write(f, 1000)))
      end
      b:close()
      c:close()
    ]]):format(srv.socket))
    assert.are.equal(0, rc, errout)
    assert.are.equal("1\n2\n3\n", out)
    local got, s = assert(b:read_new(1000))     -- newer than write 0: the newest
    assert.are.equal(3, s)
    assert.are.equal(331, got:get(31))
    assert.is_true(b:write_time() > 0)
    b:close()
    assert.has_error(function() b:read() end, "read: buffer 'lua.frames' is closed")
    assert.is_true(c:buffer_unlink("lua.frames"))
    local gone, e2, n2 = c:buffer_open("lua.frames")
    assert.is_nil(gone)
    assert.are.equal("NOT_FOUND", n2, e2)
  end)

  it("refuses writes through a read-only handle and shares the writer lock", function()
    local w = assert(c:buffer_create("lua.lock", 16))
    local c2 = assert(st.connect{ path = srv.socket })
    local r = assert(c2:buffer_open("lua.lock", { readonly = true }))
    assert.is_true(r.readonly)
    local f = assert(st.zeros(16))
    local ok, err, name = r:write(f)
    assert.is_nil(ok)
    assert.are.equal("INVALID_ARGUMENT", name, err)
    assert.is_true(w:acquire(100))
    local owner, pid, mine = w:locked()
    assert.is_number(owner)
    assert.is_true(mine)
    local _, _, mine2 = r:locked()
    assert.is_false(mine2)
    local w2 = assert(c2:buffer_open("lua.lock"))
    assert.is_false(w2:acquire(30))             -- held by c's connection
    assert.is_true(w:release())
    assert.is_nil((w:locked()))
    assert.is_true(w2:acquire(100))
    w2:close()                                   -- frees the lock it holds
    assert.is_nil((w:locked()))
    assert.has_error(function() w:write("x") end)
    r:close()
    w:close()
    c2:close()
    assert.is_true(c:buffer_unlink("lua.lock"))
    assert.matches("shape", select(2, c:buffer_create("lua.bad", { 0 })) or "")
  end)

  it("sends opts.readers with buffer_create (st_buffer_create_ex)", function()
    local b = assert(c:buffer_create("lua.granted", 4, { readers = { uids = { 65534 },
                                                                    gids = { 65534 } } }))
    b:close()
    assert.is_true(c:buffer_unlink("lua.granted"))
    local many = {}
    for i = 1, 17 do many[i] = i end
    local none, err, name = c:buffer_create("lua.many", 4, { readers = { uids = many } })
    assert.is_nil(none)
    assert.are.equal("INVALID_ARGUMENT", name, err)
    assert.matches("at most 16", err)
    assert.has_error(function() c:buffer_create("lua.bad", 4, { readers = "65534" }) end)
    assert.has_error(function() c:buffer_create("lua.bad", 4, { readers = { uids = { "x" } } }) end)
  end)

  it("counts acquires per handle, clears every slot, and carries unsigned types", function()
    local b = assert(c:buffer_create("lua.u", 4, { dtype = "uint32", slots = 2 }))
    assert.are.equal("uint32", b.dtype)
    local f = assert(st.empty(4, { dtype = "uint32" }))
    for i = 0, 3 do f:set(i, 4294967295 - i) end
    assert.are.equal(1, b:write(f))
    local x = assert(b:read())
    assert.are.same({ 4294967295, 4294967294, 4294967293, 4294967292 }, x:tolist())
    assert.is_true(b:acquire(100))
    assert.is_true(b:acquire(100))              -- re-entrant: counts
    assert.are.equal(2, b:held())
    assert.is_true(b:release())
    assert.is_true((select(3, b:locked())))     -- one acquire still open
    assert.are.equal(2, b:clear())              -- under the held lock
    assert.is_true(b:release())
    assert.is_nil((b:locked()))
    local ok, err, name = b:release()
    assert.is_nil(ok)
    assert.are.equal("INVALID_ARGUMENT", name, err)
    assert.are.same({ 0, 0, 0, 0 }, assert(b:read()):tolist())
    b:close()
    assert.is_true(c:buffer_unlink("lua.u"))
    for _, dt in ipairs({ "uint16", "uint32", "uint64" }) do
      local res = assert(c:call("u", { dtype = dt }))
      assert.are.equal(dt, res.value.dtype)
      assert.are.same({ 65535, 7, 0 }, res.value:tolist())
      res:free()
    end
  end)
end)

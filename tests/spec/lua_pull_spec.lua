-- c:pull (lua/st/client.lua) between two stservers on loopback that are
-- peers: "alpha" listens and exports the keys under w/, "beta" dials it;
-- the bytes over UCX on lo. A pull followed with c:wait and c:result, its
-- bytes read back; a key not exported failing the task with AUTH; a
-- stranger refused at once; misuse raising.
local ffi = require("ffi")
local H = require("st_harness")
local st = require("st.client")
local C = require("st.ffi")
local build_args = require("st.args").build

ffi.cdef("int setenv(const char *name, const char *value, int overwrite);")

-- Puts { x = a float32 tensor of n elements, x[i] = i * k } under `key`.
local function put(c, key, n, k, flags)
  local x = assert(st.zeros({ n }, { dtype = "float32" }))
  for i = 0, n - 1 do x:set(i, i * k) end
  local v = ffi.new("uint64_t[1]")
  assert(C.lib.st_client_put(c._h, key, build_args({ x = x }), 0, flags or 0, v) == 0,
         ffi.string(C.lib.st_client_error(c._h)))
  return tonumber(v[0])
end

describe("c:pull", function()
  local alpha, beta, ca, cb, keydir

  setup(function()
    ffi.C.setenv("UCX_TLS", "tcp", 1)
    ffi.C.setenv("UCX_NET_DEVICES", "lo", 1)
    keydir = H.run("mktemp -d /tmp/stspec-key-XXXXXX"):gsub("%s+$", "")
    local key = keydir .. "/cluster.key"
    H.write(key, H.run("od -An -tx1 -N32 /dev/urandom"):gsub("%s", "") .. "\n")
    H.run("chmod 600 " .. key)
    alpha = H.server{ endpoints = {}, config = ("peer = { id = 'alpha', listen = '127.0.0.1:0', "
      .. "secret = %q, peers = { beta = {} }, export = { 'w/*' } },"):format(key) }
    ca = assert(st.connect{ path = alpha.socket })
    local addr = ca:info().peer.listen
    beta = H.server{ endpoints = {}, config = ("peer = { id = 'beta', secret = %q, "
      .. "peers = { alpha = %q } },"):format(key, addr) }
    cb = assert(st.connect{ path = beta.socket })
    local deadline = H.now() + 20
    while H.now() < deadline do
      local p = cb:peers()[1]
      if p.state == "up" and #p.engines > 0 then break end
    end
  end)

  teardown(function()
    if ca then ca:close() end
    if cb then cb:close() end
    if beta then beta:finish() end
    if alpha then alpha:finish() end
    if keydir then H.run("rm -rf " .. keydir) end
  end)

  it("copies a key, followed with wait and result", function()
    assert.are.equal(1, put(ca, "w/k", 1000, 0.5))
    local id = assert(cb:pull("w/k", "alpha", { as = "copy/k", policy = "evictable" }))
    local info = cb:wait(id, 60)
    assert.are.equal("completed", info.status)
    local res = assert(cb:result(id))
    local v = res.value
    assert.are.equal("copy/k", v.key)
    assert.are.equal(1, v.version)
    assert.are.equal("alpha", v.origin.peer)
    assert.are.equal("w/k", v.origin.key)
    assert.are.equal(1, v.origin.version)
    assert.is_true(v.bytes >= 4000)
    local got = assert(cb:get("copy/k"))
    local x = got.value.x
    assert.are.equal(1000, x.shape[1])
    for i = 0, 999 do assert.are.equal(i * 0.5, x:get(i)) end
  end)

  it("follows a live key, and ends that with unsubscribe", function()
    assert.are.equal(1, put(ca, "w/live", 100, 2, 2))   -- 2: ST_PUT_LIVE
    local id = assert(cb:pull("w/live", "alpha", { live = true }))
    assert.are.equal("completed", cb:wait(id, 60).status)
    local v = assert(cb:result(id)).value
    assert.is_true(v.live)
    assert.are.equal(1, v.version)
    local rep = assert(cb:replicas("w/live"))
    assert.are.equal("alpha", rep.source.peer)
    assert.is_false(rep.source.lost)
    assert.are.equal("beta", assert(ca:replicas("w/live")).subscribers[1].peer)
    assert.are.equal(1, assert(cb:unsubscribe("w/live")))
    local ok, err = cb:unsubscribe("w/live")
    assert.is_nil(ok)
    assert.matches("^NOT_FOUND", err)
    assert.has_error(function() cb:pull("w/live", "alpha", { live = "yes" }) end,
                     "pull: opts.live must be true or false")
  end)

  it("fails the task with AUTH for a key not exported", function()
    put(ca, "secret", 10, 1)
    local id = assert(cb:pull("secret", "alpha"))
    assert.are.equal("failed", cb:wait(id, 60).status)
    local res, err, name = cb:result(id)
    assert.is_nil(res)
    assert.are.equal("AUTH", name)
    assert.truthy(err:find("key 'secret' is not exported to peers", 1, true))
  end)

  it("refuses a stranger at once, and raises on misuse", function()
    local id, err, name = cb:pull("w/k", "gamma")
    assert.is_nil(id)
    assert.are.equal("NOT_FOUND", name)
    assert.truthy(err:find("'gamma' is not a peer of this server", 1, true))
    assert.has_error(function() cb:pull("w/k", "alpha", { bogus = 1 }) end)
    assert.has_error(function() cb:pull("w/k", "alpha", { version = 0 }) end)
    assert.has_error(function() cb:pull("w/k", "alpha", { policy = "sticky" }) end)
    assert.has_error(function() cb:pull("w/k", 7) end)
    assert.has_error(function() cb:replicate("w/k", {}) end)
  end)
end)

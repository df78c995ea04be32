-- A zero-branch script: the endpoints and the program that calls them in
-- one file, run unchanged in three roles (docs/zero-branch.md).
--
--   luajit app.lua                                        in-process
--   SHARED_TENSOR_ENABLED=1 SHARED_TENSOR_ROLE=server luajit app.lua   server
--   SHARED_TENSOR_ENABLED=1 luajit app.lua                client
--
-- (with LUA_PATH="<repo>/lua/?.lua;;", and ST_CLIENT_LIB / ST_EMBED_LIB
-- naming libstclient.so / libstembed.so unless they are installed.)
local app = require("st.zerobranch").app()

-- Everything above main runs twice: here, and in the server's sandbox,
-- which reads this file as its endpoint file. Build functions run only on
-- the server.
app:endpoint {
  name = "scaled_ones",
  doc = "n ones, times k",
  params = { n = 4, k = 2.5 },
  cache = true,
  build = function(a) return st.full { a.n, value = a.k } end,
}

app:endpoint {
  name = "linear",
  doc = "a linear layer, built once per shape and shared",
  params = { input_dim = 8, output_dim = 2 },
  device = "cpu",           -- main reads it through host pointers
  managed = true,
  cache_format_key = "linear:{input_dim}:{output_dim}",
  build = function(a)
    return st.module {
      weight = st.randn { a.output_dim, a.input_dim, seed = 7 },
      bias = st.full { a.output_dim, value = 0.5 },
    }
  end,
}

-- The program: runs in the in-process and client roles, never on the
-- server, so it may use io, os and the FFI.
app:main(function(c)
  local ffi = require("ffi")
  ffi.cdef "int getpid(void);"
  local info = assert(c:info())
  local own = info.pid == ffi.C.getpid()
  print(("role %s: server pid %d (%s)"):format(app:role(), info.pid,
    own and "this process" or "another process"))

  local r = assert(c:call("scaled_ones", { n = 3 }))
  print(("scaled_ones n=3: %s = {%s}, object %d"):format(tostring(r.value),
    table.concat(r.value:tolist(), ", "), r.object.id))
  local again = assert(c:call("scaled_ones", { n = 3 }))   -- a cache hit: no build
  print(("again: object %d, %s"):format(again.object.id,
    again.object.id == r.object.id and "the same memory, from the cache" or "rebuilt"))
  r:free()
  again:free()

  local m = assert(c:call("linear", { input_dim = 8, output_dim = 2 }))
  local W, B = m.value.tensors.weight, m.value.tensors.bias
  local w, b = W:ptr("float"), B:ptr("float")       -- the mapped memory, no copy
  for o = 0, W.shape[1] - 1 do                       -- y = W * ones(8) + b
    local y = b[o * B.strides[1]]
    for i = 0, W.shape[2] - 1 do y = y + w[o * W.strides[1] + i * W.strides[2]] end
    print(("y[%d] = %.6f"):format(o, y))
  end
  print(("linear: object %d, refcount %d (our lease)"):format(m.object.id, m.object.refcount))
  assert(c:release(m.object.id))
  m:free()
end)

-- Lua consumer: the same forward pass as the C consumer, through the Lua
-- client (lua/st/client.lua, LuaJIT FFI over libstclient).
--   luajit examples/lua_consumer/consumer.lua SOCKET
local st = require("st.client")

local c = assert(st.connect{ path = arg[1] })
local res = assert(c:call("load_linear", { input_dim = 16, output_dim = 4 }))
local m = res.value
local W, B = m.tensors.weight, m.tensors.bias
local w, b = W:ptr("float"), B:ptr("float")          -- the mapped memory
for o = 0, W.shape[1] - 1 do
  local y = b[o * B.strides[1]]
  for i = 0, W.shape[2] - 1 do y = y + w[o * W.strides[1] + i * W.strides[2]] end
  print(("y[%d] = %.6f"):format(o, y))
end
if res.object then
  local r = assert(c:release(res.object.id))
  print(("released object %d (refcount now %d)"):format(res.object.id, r.refcount))
end
res:free()
c:close()

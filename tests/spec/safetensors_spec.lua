-- st.load_safetensors through a real server: a file written here is loaded
-- by an endpoint, served as one module, and read back with stcli; paths
-- outside the configured data_dirs are refused.
local H = require("st_harness")

-- A safetensors file: 8-byte little-endian header length, JSON header, data.
local function u64le(n)
  local t = {}
  for i = 1, 8 do t[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(t)
end

local function f32le(x)   -- exact for the small integers used here
  if x == 0 then return "\0\0\0\0" end
  local sign = x < 0 and 1 or 0
  x = math.abs(x)
  local e = math.floor(math.log(x) / math.log(2))
  local m = x / 2 ^ e - 1
  local bits = sign * 2 ^ 31 + (e + 127) * 2 ^ 23 + math.floor(m * 2 ^ 23 + 0.5)
  local t = {}
  for i = 1, 4 do t[i] = string.char(bits % 256); bits = math.floor(bits / 256) end
  return table.concat(t)
end

local function write_safetensors(path)
  local w, b = {}, {}
  for i = 1, 6 do w[i] = f32le(i) end          -- weight 2x3 = 1..6
  for i = 1, 2 do b[i] = f32le(-i) end         -- bias {-1, -2}
  local data = table.concat(w) .. table.concat(b)
  local header = '{"__metadata__":{"format":"pt"},' ..
    '"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},' ..
    '"bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}}'
  H.write(path, u64le(#header) .. header .. data)
end

describe("st.load_safetensors over the socket", function()
  local srv, dir, outside
  setup(function()
    srv = H.server{
      start = false,
      endpoints = {
        ["load.lua"] = [[
return st.endpoint{ name = "load", params = { path = st.required, dtype = "" },
  build = function(a)
    return st.load_safetensors(a.path, { dtype = a.dtype ~= "" and a.dtype or nil })
  end }
]],
      },
    }
    dir = srv.dir .. "/models"
    H.run("mkdir -p " .. H.shquote(dir))
    write_safetensors(dir .. "/tiny.safetensors")
    outside = os.tmpname()
    write_safetensors(outside)
    -- data_dirs confines loads to the models directory.
    local cfg = H.read(srv.config):gsub("}%s*$", string.format("  data_dirs = { %q },\n}\n", dir))
    H.write(srv.config, cfg)
    srv:start()
  end)
  teardown(function()
    os.remove(outside)
    if srv then srv:finish() end
  end)

  it("serves the file as one module with its names, shapes and values", function()
    local out, rc, err = srv:cli("call", "load", "path=" .. dir .. "/tiny.safetensors", "--values")
    assert.are.equal(0, rc, err)
    assert.matches("weight%s+float32%s+%[2, 3%]", out)
    assert.matches("values: 1 2 3 4 5 6", out)
    assert.matches("bias%s+float32%s+%[2%]", out)
    assert.matches("values: %-1 %-2", out)
  end)

  it("converts dtypes on load", function()
    local out, rc, err = srv:cli("call", "load", "path=" .. dir .. "/tiny.safetensors",
      "dtype=float16", "--values")
    assert.are.equal(0, rc, err)
    assert.matches("weight%s+float16%s+%[2, 3%]", out)
    assert.matches("values: 1 2 3 4 5 6", out)
  end)

  it("refuses a path outside data_dirs and keeps serving", function()
    srv:check_refused({ "call", "load", "path=" .. outside }, { "ENDPOINT", "data_dirs" })
  end)

  it("reports a truncated file clearly", function()
    local f = io.open(dir .. "/tiny.safetensors", "rb")
    local whole = f:read("*a")
    f:close()
    H.write(dir .. "/cut.safetensors", whole:sub(1, #whole - 5))
    local _, rc, err = srv:cli("call", "load", "path=" .. dir .. "/cut.safetensors")
    assert.are.equal(1, rc)
    assert.matches("cut%.safetensors", err)
  end)
end)

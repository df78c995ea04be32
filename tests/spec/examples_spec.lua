-- Every example runs with its one documented command and says what it
-- should (examples/README.md).
local H = require("st_harness")

local function run_example(name)
  local script = H.source_dir() .. "/examples/" .. name .. "/run.sh"
  return H.run("ST_BUILD_DIR=" .. H.shquote(os.getenv("ST_BUILD_DIR")) .. " " .. H.shquote(script))
end

describe("examples", function()
  it("basic_service passes the client's tensor to echo and scale without a copy", function()
    local out, rc, err = run_example("basic_service")
    assert.are.equal(0, rc, err)
    assert.matches("x %(tensor%(float32, any%)%), k=2.5", out)
    assert.matches("mine%[0%] is now 10.00 %(same memory%)", out)
    assert.matches("after scale k=0.5:%s+5.00%s+1.00%s+1.50", out)
    assert.matches("argument 'x' has dtype int32; the endpoint wants float32", out)
  end)

  it("model_service builds once for two concurrent clients", function()
    local out, rc, err = run_example("model_service")
    assert.are.equal(0, rc, err)
    assert.matches("both clients got object 1", out)
    assert.matches("w1%s+float32%s+%[64, 32%]", out)
    assert.matches("singleflight joins 1", out)
    assert.matches("object 2 %(lease", out)     -- rebuilt after invalidate
  end)

  it("async_service waits with progress and cancels", function()
    local out, rc, err = run_example("async_service")
    assert.are.equal(0, rc, err)
    assert.matches("task 1 submitted", out)
    assert.matches("sum: 60", out)              -- rows 1..5, four columns each
    assert.matches("status%s+cancelled", out)
  end)

  it("the C and Lua consumers compute the same forward pass", function()
    local c_out, c_rc, c_err = run_example("c_consumer")
    assert.are.equal(0, c_rc, c_err)
    assert.matches("%(no copy%)", c_out)
    local l_out, l_rc, l_err = run_example("lua_consumer")
    assert.are.equal(0, l_rc, l_err)
    local function ys(s)
      local t = {}
      for line in s:gmatch("y%[%d+%] = [-%d.]+") do t[#t + 1] = line end
      return t
    end
    assert.are.equal(4, #ys(c_out))
    assert.are.same(ys(c_out), ys(l_out))
    assert.matches("released object %d+ %(refcount now 0%)", l_out)
  end)

  it("zero_branch runs one script in-process, as the server and as its client", function()
    local out, rc, err = run_example("zero_branch")
    assert.are.equal(0, rc, err)
    assert.matches("role in%-process: server pid %d+ %(this process%)", out)
    assert.matches("role client: server pid %d+ %(another process%)", out)
    assert.matches("server stopped cleanly", out)
  end)

  it("the PyTorch consumer runs the same forward pass on shared weights", function()
    local _, has_torch = H.run("/usr/bin/python3 -c 'import torch' 2>/dev/null || python3 -c 'import torch'")
    if has_torch ~= 0 then
      pending("python3 with torch is not installed")
      return
    end
    local c_out = run_example("c_consumer")
    local out, rc, err = run_example("pytorch_consumer")
    assert.are.equal(0, rc, err)
    assert.matches("shared, not copied", out)
    local function ys(s)
      local t = {}
      for line in s:gmatch("y%[%d+%] = [-%d.]+") do t[#t + 1] = line end
      return t
    end
    assert.are.equal(4, #ys(out))
    assert.are.same(ys(c_out), ys(out))
  end)
end)

-- Every example runs with its one documented command and says what it
-- should (examples/README.md).
local H = require("st_harness")

local function run_example(name)
  local script = H.source_dir() .. "/examples/" .. name .. "/run.sh"
  return H.run("ST_BUILD_DIR=" .. H.shquote(os.getenv("ST_BUILD_DIR")) .. " " .. H.shquote(script))
end

-- Runs the example: it exits 0 and its output matches every pattern.
-- Returns the output.
local function example_says(name, patterns)
  local out, rc, err = run_example(name)
  assert.are.equal(0, rc, err)
  for _, p in ipairs(patterns) do assert.matches(p, out) end
  return out
end

-- The lines "y[i] = v" of a consumer's output.
local function ys(s)
  local t = {}
  for line in s:gmatch("y%[%d+%] = [-%d.]+") do t[#t + 1] = line end
  return t
end

describe("examples", function()
  it("basic_service passes the client's tensor to echo and scale without a copy", function()
    example_says("basic_service", {
      "x %(tensor%(float32, any%)%), k=2.5",
      "mine%[0%] is now 10.00 %(same memory%)",
      "after scale k=0.5:%s+5.00%s+1.00%s+1.50",
      "argument 'x' has dtype int32; the endpoint wants float32",
    })
  end)

  it("model_service builds once for two concurrent clients", function()
    example_says("model_service", {
      "both clients got object 1",
      "w1%s+float32%s+%[64, 32%]",
      "singleflight joins 1",
      "object 2 %(lease",     -- rebuilt after invalidate
    })
  end)

  it("async_service waits with progress and cancels", function()
    example_says("async_service", {
      "task 1 submitted",
      "sum: 60",              -- rows 1..5, four columns each
      "status%s+cancelled",
    })
  end)

  it("the C and Lua consumers compute the same forward pass", function()
    local c_out = example_says("c_consumer", { "%(no copy%)" })
    local l_out = example_says("lua_consumer", {})
    assert.are.equal(4, #ys(c_out))
    assert.are.same(ys(c_out), ys(l_out))
    assert.matches("released object %d+ %(refcount now 0%)", l_out)
  end)

  it("zero_branch runs one script in-process, as the server and as its client", function()
    example_says("zero_branch", {
      "role in%-process: server pid %d+ %(this process%)",
      "role client: server pid %d+ %(another process%)",
      "server stopped cleanly",
    })
  end)

  it("the PyTorch consumer runs the same forward pass on shared weights", function()
    local _, has_torch = H.run("/usr/bin/python3 -c 'import torch' 2>/dev/null || python3 -c 'import torch'")
    if has_torch ~= 0 then
      pending("python3 with torch is not installed")
      return
    end
    local c_out = run_example("c_consumer")
    local out = example_says("pytorch_consumer", { "shared, not copied" })
    assert.are.equal(4, #ys(out))
    assert.are.same(ys(c_out), ys(out))
  end)
end)

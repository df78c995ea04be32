-- The README's "Try it" section, run as written against the repository's
-- own config.lua and endpoints/: a new user's first commands must work.
local H = require("st_harness")

describe("quick start with the default config", function()
  local srv
  setup(function()
    srv = H.server{ config_file = H.source_dir() .. "/config.lua" }
  end)
  teardown(function()
    if srv then srv:finish() end
  end)

  it("answers ping", function()
    local out, rc = srv:cli("ping")
    assert.are.equal(0, rc)
    assert.matches("^pong from %x+ in [%d.]+ us", out)
  end)

  it("lists the default endpoints", function()
    local out, rc = srv:cli("endpoints")
    assert.are.equal(0, rc)
    for _, name in ipairs{ "echo", "hello", "load_linear", "make_tensor" } do
      assert.matches("\n" .. name .. " ", out)
    end
  end)

  it("prints a tensor with its values", function()
    local out, rc = srv:cli("call", "make_tensor", "--values")
    assert.are.equal(0, rc)
    assert.matches("float32%s+%[4, 8%]%s+cpu%s+128 bytes", out)
    assert.matches("values: 0 1 2 3 4 5 6 7", out)
    assert.matches("sum: 496", out)
    local only, rc0 = srv:cli("call", "make_tensor", "--values=0")
    assert.are.equal(0, rc0)
    assert.is_nil(only:find("values:", 1, true))   -- the checksums only
    assert.matches("sum: 496", only)
  end)

  it("builds the linear module with arguments, deterministically", function()
    local a, rc = srv:cli("call", "load_linear", "input_dim=8", "output_dim=2", "--values=4")
    assert.are.equal(0, rc)
    assert.matches("weight%s+float32%s+%[2, 8%]", a)
    assert.matches("bias%s+float32%s+%[2%]", a)
    local b = srv:cli("call", "load_linear", "input_dim=8", "output_dim=2", "--values=4")
    assert.are.equal(a, b)   -- same seed, same numbers, same checksums
  end)

  it("rejects a bad argument with a clear error and keeps serving", function()
    srv:check_refused({ "call", "make_tensor", "rows=x" }, { "INVALID_ARGUMENT", "rows" })
  end)

  it("drives tasks, objects, invalidation and reload from the shell", function()
    local id, rc = srv:cli("submit", "load_linear", "input_dim=4", "output_dim=4")
    assert.are.equal(0, rc)
    id = id:match("^(%d+)%s*$")
    assert.is_not_nil(id, "submit prints the task id")
    local out, wrc = srv:cli("wait", id)
    assert.are.equal(0, wrc)
    assert.matches("weight%s+float32%s+%[4, 4%]", out)
    assert.matches("cache key linear:4:4", out)
    local st_out = srv:cli("status", id)
    assert.matches("status%s+completed", st_out)
    assert.matches("progress%s+100%%%s+done", st_out)
    local objs = srv:cli("objects")
    assert.matches("linear:4:4", objs)
    local inv, irc = srv:cli("invalidate", "load_linear", "--all")
    assert.are.equal(0, irc)
    assert.matches("dropped %d+ cache entr", inv)
    assert.is_nil(srv:cli("objects"):match("linear:4:4"))
    local rl, rrc = srv:cli("reload")
    assert.are.equal(0, rrc)
    assert.matches("reload ok: generation 2", rl)
    local stats = srv:cli("stats")
    assert.matches("tasks%s+pending 0, running 0, completed %d+", stats)
  end)

  it("passes the stserver --check of the shipped config", function()
    local out, rc, err = H.run(H.shquote(H.server_bin()) .. " --check --config " ..
      H.shquote(H.source_dir() .. "/config.lua"))
    assert.are.equal(0, rc, err)
    assert.matches("load_linear", out .. err)
  end)
end)

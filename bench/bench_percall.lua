-- bench_percall (Lua): the per-call rows through st.client, for
-- bench/bench_percall.py, which starts the server and prints these rows
-- next to the Python and C ones.
--
--   ST_CLIENT_LIB=build/lib/libstclient.so.0 luajit bench/bench_percall.lua SOCKET [ITERS [KEY,...]]
--
-- Prints "row KEY N P50 P99" (microseconds) per row; the endpoints are
-- bench_percall.py's. info_full times info against the task table the C
-- side's row of that name filled. Timings are printed, never asserted.
local here = arg[0]:match("^(.*)/[^/]*$") or "."
package.path = here .. "/../lua/?.lua;" .. package.path

local ffi = require("ffi")
local st = require("st.client")

ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk, bench_timespec *ts);
]]
local ts = ffi.new("bench_timespec")
local function now_us()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

local sock, iters = arg[1], tonumber(arg[2] or "2000")
local only = nil
if arg[3] then
  only = {}
  for k in arg[3]:gmatch("[^,]+") do only[k] = true end
end
local c = assert(st.connect { path = sock })

local function row(key, n, fn)
  if only and not only[key] then return end
  local us = {}
  for i = -99, n do
    local t0 = now_us()
    fn()
    if i > 0 then us[#us + 1] = now_us() - t0 end
  end
  table.sort(us)
  print(string.format("row %s %d %.2f %.2f", key, #us, us[math.floor(#us / 2) + 1],
                      us[math.floor(#us * 0.99) + 1]))
end

local function call(name, args)
  return assert(c:call(name, args))
end

row("ping", iters, function() assert(c:ping()) end)
local keep = call("cached16")
row("cached_kept", iters, function() call("cached16") end)
keep:free()
row("cached_dropped", iters, function() call("cached16"):free() end)
row("fresh", iters, function() call("fresh4"):free() end)
local function managed(name)
  return function()
    local r = call(name)
    assert(c:release(r.object.id, false))
    r:free()
  end
end
row("mcached_release", iters, managed("mcached16"))
row("managed_release", iters, managed("managed16"))
row("submit_wait", iters, function() assert(c:wait(assert(c:submit("quick")))) end)
local x = assert(st.zeros({ 1024 }, { dtype = "float32" }))
row("targ_4k", iters, function() call("echo", { x = x }):free() end)
row("int_arg", iters, function() call("echo_int", { x = 1024 }) end)
keep = call("module300")
row("module300", math.max(1, math.floor(iters / 4)), function() call("module300") end)
keep:free()
if not only or only.mmodule300_held_release then
  keep = call("mmodule300")   -- held, with its lease
  row("mmodule300_held_release", math.max(1, math.floor(iters / 4)), managed("mmodule300"))
  assert(c:release(keep.object.id))
  keep:free()
end
row("info", iters, function() assert(c:info()) end)
-- The task table as bench_percall.c's info_full row left it (full).
row("info_full", iters, function() assert(c:info()) end)
c:close()

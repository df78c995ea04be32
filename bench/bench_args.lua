-- bench_args (Lua): what building a call's arguments costs, per call.
--
--   ST_CLIENT_LIB=build/lib/libstclient.so luajit bench/bench_args.lua [reps]
--
-- Times st.client's argument map (st_args_new, the values through the
-- nested builder; the map is freed by the GC) for a few shapes of
-- arguments, with no server: the part of a call that runs in Lua before
-- the request goes. Prints the best of `reps` runs (default 7), in
-- microseconds per call. Timings are printed, never asserted;
-- bench/bench_args.py is the Python twin.
local here = arg[0]:match("^(.*)/[^/]*$") or "."
package.path = here .. "/../lua/?.lua;" .. package.path

local st = require("st.client")
local build = require("st.args").build

local function range(n, f)
  local t = {}
  for i = 1, n do t[i] = f(i - 1) end
  return t
end

local map100 = {}
for i = 0, 99 do map100["k" .. i] = i end

local cases = {
  { "4 scalars", { a = 1, b = 2.5, c = "x", d = true } },
  { "small nested", { cfg = { a = 1, b = { 1, 2, 3 }, c = "x", d = st.null } } },
  { "list of 16 ints", { x = range(16, function(i) return i end) } },
  { "list of 1000 ints", { x = range(1000, function(i) return i end) } },
  { "list of 1000 floats", { x = range(1000, function(i) return i * 0.5 + 0.25 end) } },
  { "list of 100 strings", { x = range(100, function(i) return "s" .. i end) } },
  { "map of 100 keys", { x = map100 } },
}

local reps = tonumber(arg[1]) or 7
print(("%-22s %12s"):format("arguments", "us per call"))
for _, case in ipairs(cases) do
  local n = case[1]:find("1000") and 200 or 2000
  local best
  for _ = 1, reps do
    collectgarbage()
    local t0 = os.clock()
    for _ = 1, n do build(case[2], 1) end
    local dt = (os.clock() - t0) / n * 1e6
    best = best and math.min(best, dt) or dt
  end
  print(("%-22s %12.2f"):format(case[1], best))
end

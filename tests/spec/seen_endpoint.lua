-- seen: what an endpoint sees of its `value` argument, rendered on the
-- server as text: nil, st.null ("null"), strings as %q, binary values
-- (st.bytes) as b%q, lists [a,b],
-- tables {k=v} with sorted keys. Shared by tests/spec/args_spec.lua and
-- tests/python/test_args.py.
local function show(v)
  if v == nil then return "nil" end
  if v == st.null then return "null" end
  local t = type(v)
  if t == "string" then return ("%q"):format(v) end
  if t == "userdata" and v == st.bytes(tostring(v)) then return "b" .. ("%q"):format(tostring(v)) end
  if t ~= "table" then return tostring(v) end
  local parts = {}
  if #v > 0 then
    for i = 1, #v do parts[i] = show(v[i]) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. show(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end
return st.endpoint{ name = "seen", params = { value = st.required },
  build = function(a) return show(a.value) end }

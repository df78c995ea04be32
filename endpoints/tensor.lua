-- make_tensor: one tensor of a chosen shape, dtype and contents.
--
--   stcli call make_tensor                              4x8 float32, 0..31
--   stcli call make_tensor rows=2 cols=3 kind=randn seed=7 --values
--
-- Parameters (the defaults below are also the types: rows must be an
-- integer, kind a string, ...):
--   rows, cols   the shape
--   dtype        any dtype name: float32, bfloat16, int64, ...
--   kind         "arange" (0, 1, 2, ... row-major), "zeros", "ones",
--                "rand" (uniform [0, 1)) or "randn" (standard normal);
--                rand and randn need a floating dtype
--   seed         the random stream for rand/randn: the same seed gives the
--                same values on every host
-- The tensor is a fresh shared-memory arena that the client maps; the
-- server keeps nothing once the reply is sent.
local kinds = { arange = true, zeros = true, ones = true, rand = true, randn = true }

return st.endpoint {
  name = "make_tensor",
  doc = "A rows x cols tensor: arange, zeros, ones, rand or randn",
  params = { rows = 4, cols = 8, dtype = "float32", kind = "arange", seed = 0 },
  build = function(a)
    if not kinds[a.kind] then
      error("kind must be arange, zeros, ones, rand or randn, got '" .. a.kind .. "'")
    end
    if a.kind == "arange" then
      local t = st.arange { a.rows * a.cols, dtype = a.dtype }
      return t:view { a.rows, a.cols }
    end
    local t = st[a.kind] { a.rows, a.cols, dtype = a.dtype,
                           seed = (a.kind == "rand" or a.kind == "randn") and a.seed or nil }
    return t
  end,
}

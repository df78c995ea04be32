-- soak_cached: cached by k (a few dozen keys: hits and fresh builds), every
-- element k. Invalidated by clients and dropped when this file changes on a
-- reload (the soak driver rewrites the version below).
local version = 0
return st.endpoint {
  name = "soak_cached",
  cache = true,
  params = { k = 0, n = 256 },
  build = function(a)
    return { version = version, t = st.full { a.n, value = a.k } }
  end,
}

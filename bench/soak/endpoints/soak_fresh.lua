-- soak_fresh: a new arena per call (plain result: the server keeps nothing).
-- Element i is i + k, so a client can check what it mapped.
return st.endpoint {
  name = "soak_fresh",
  params = { n = 16, k = 0 },
  build = function(a)
    return st.arange { a.n, dtype = "float32" }:add_(a.k)
  end,
}

-- A two-layer MLP state dict, built once per hidden size and shared:
--   cache_format_key  one cache entry per hidden size ("mlp:64")
--   managed           every caller holds a lease until it releases or exits
--   singleflight      concurrent first callers join one build
--   serialized        one build at a time (model builds are heavy)
return st.endpoint {
  name = "mlp",
  doc = "w1 [hidden, in], b1 [hidden], w2 [out, hidden], b2 [out], seeded",
  concurrency = "serialized",
  managed = true,
  singleflight = true,
  cache_format_key = "mlp:{hidden}",
  params = { input = 32, hidden = 64, output = 8 },
  build = function(a)
    st.sleep(0.2)   -- stands for reading weights from disk
    return st.module({
      { "w1", st.randn { a.hidden, a.input, seed = 1 } },
      { "b1", st.zeros { a.hidden } },
      { "w2", st.randn { a.output, a.hidden, seed = 2 } },
      { "b2", st.zeros { a.output } },
    }, { arch = "mlp", hidden = a.hidden })
  end,
}

-- load_linear: the weights of one linear layer as a module (an ordered
-- state dict). Both tensors live in ONE arena at aligned offsets, so a
-- client maps the whole module with one file descriptor.
--
--   stcli call load_linear input_dim=8 output_dim=2 --values=4
--   stcli objects          # the cached object, its key and refcount
--
-- weight is output_dim x input_dim, standard normal from seed 0 (the same
-- numbers on every host); bias is zeros.
--
-- The options make it a shared model: built once per (input_dim,
-- output_dim) and cached under "linear:<in>:<out>", managed (each caller
-- holds a lease until it releases or disconnects), one build at a time
-- (serialized), concurrent callers of one key join a single build
-- (singleflight), and run as a task (`stcli submit load_linear` returns at
-- once; `call` waits for it).
return st.endpoint {
  name = "load_linear",
  doc = "A linear layer {weight = randn(out, in), bias = zeros(out)} as one module",
  execution = "task",
  concurrency = "serialized",
  managed = true,
  singleflight = true,
  cache_format_key = "linear:{input_dim}:{output_dim}",
  params = { input_dim = 16, output_dim = 4 },
  build = function(a)
    st.progress(0.5, "weights")
    local m = st.module {
      weight = st.randn { a.output_dim, a.input_dim, dtype = "float32", seed = 0 },
      bias = st.zeros { a.output_dim },
    }
    st.progress(1.0, "done")
    return m
  end,
}

-- load_linear: the weights of one linear layer as a module (an ordered
-- state dict). Both tensors live in ONE arena at aligned offsets, so a
-- client maps the whole module with one file descriptor.
--
--   stcli call load_linear input_dim=8 output_dim=2 --values=4
--
-- weight is output_dim x input_dim, standard normal from seed 0 (the same
-- numbers on every host); bias is zeros. The declaration may also carry
-- execution = "task", concurrency = "serialized", managed = true and a
-- cache_format_key such as "linear:{input_dim}:{output_dim}": they are
-- validated today, and serving them is documented in docs/endpoints.md.
return st.endpoint {
  name = "load_linear",
  doc = "A linear layer {weight = randn(out, in), bias = zeros(out)} as one module",
  params = { input_dim = 16, output_dim = 4 },
  build = function(a)
    local m = st.module {
      weight = st.randn { a.output_dim, a.input_dim, dtype = "float32", seed = 0 },
      bias = st.zeros { a.output_dim },
    }
    return m
  end,
}

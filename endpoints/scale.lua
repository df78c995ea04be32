-- scale: multiplies the caller's tensor in place and returns it. The tensor
-- is an argument that travels as a file descriptor, not as bytes: the body
-- writes into the caller's own memory (CPU shared memory or GPU memory).
--
--   C:       st_tensor_alloc + st_args_tensor       (docs/client.md)
--   Python:  t = sharedtensor.empty((4,), device="cuda"); c.call("scale", x=t, k=0.5)
--   Lua:     see docs/client.md, "Tensor arguments"
--
-- x must be float32 (st.tensor_param refuses another dtype with a clear
-- error before the body runs); any device, any view (strides, offset).
return st.endpoint {
  name = "scale",
  doc = "Multiplies float32 tensor x by k in place (x is the caller's memory) and returns it",
  params = { x = st.tensor_param { dtype = "float32" }, k = 2.5 },
  build = function(a)
    return a.x:mul_(a.k)
  end,
}

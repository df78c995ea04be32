-- soak_scale: multiplies the caller's tensor argument in place (CPU or CUDA).
return st.endpoint {
  name = "soak_scale",
  params = { x = st.tensor_param { dtype = "float32" }, k = 2 },
  build = function(a)
    a.x:mul_(a.k)
    return a.x:numel()
  end,
}

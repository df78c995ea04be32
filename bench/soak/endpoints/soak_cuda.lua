-- soak_cuda: a fresh arena on the socket's CUDA device (used only when the
-- server has one; elsewhere calling it is CAPABILITY and the soak skips it).
return st.endpoint {
  name = "soak_cuda",
  device = "cuda",
  params = { n = 1024, k = 0 },
  build = function(a)
    return st.full { a.n, value = a.k }
  end,
}

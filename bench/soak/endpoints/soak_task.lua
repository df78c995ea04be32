-- soak_task: a task (submit, wait, result) whose result is a fresh tensor.
return st.endpoint {
  name = "soak_task",
  execution = "task",
  params = { n = 32, k = 0 },
  build = function(a)
    st.progress(0.5, "half")
    return st.full { a.n, value = a.k }
  end,
}

-- A delayed build that reports its progress and honours cancellation:
--   stcli submit prepare steps=5      -> a task id at once
--   stcli wait ID                     -> a progress bar, then the tensor
--   stcli cancel ID                   -> the body sees st.cancelled()
return st.endpoint {
  name = "prepare",
  doc = "Builds a [steps, 4] table one row per step, step_s seconds each",
  execution = "task",
  params = { steps = 5, step_s = 0.1 },
  build = function(a)
    local t = st.zeros { a.steps, 4 }
    for i = 0, a.steps - 1 do
      if st.cancelled() then error("cancelled at step " .. i) end
      st.sleep(a.step_s)
      t:narrow(0, i, 1):fill(i + 1)
      st.progress((i + 1) / a.steps, ("step %d of %d"):format(i + 1, a.steps))
    end
    return t
  end,
}

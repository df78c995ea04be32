-- echo: returns its argument unchanged. Handy to check a connection, the
-- argument syntax of a client, or what survives a round trip:
--
--   stcli call echo value=42
--   stcli call echo 'value={"a": [1, 2.5, "x"]}'
--
-- `value` is required (st.required) and accepts any type.
return st.endpoint {
  name = "echo",
  doc = "Returns `value` unchanged",
  params = { value = st.required },
  build = function(a)
    return a.value
  end,
}

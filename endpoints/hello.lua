-- hello: a small map with a string, a number and a tensor, to see how
-- results look in a client:
--
--   stcli call hello name=operator --values
--
-- The tensor travels as a descriptor plus a file descriptor; everything
-- else is plain msgpack.
return st.endpoint {
  name = "hello",
  doc = "A greeting, the server version and the numbers 0..n-1 as an int64 tensor",
  params = { name = "world", n = 10 },
  build = function(a)
    local numbers = st.arange { a.n }
    return {
      message = "hello, " .. a.name,
      version = st.version,
      numbers = numbers,
    }
  end,
}

-- soak_managed: a managed, cached, singleflight object per k: each call
-- takes a lease that the client gives back with `release` (or by
-- disconnecting, or by being killed).
return st.endpoint {
  name = "soak_managed",
  managed = true,
  singleflight = true,
  cache_format_key = "soak:{k}",
  params = { k = 0 },
  build = function(a)
    return st.module { w = st.full { 64, value = a.k }, b = st.zeros { 8 } }
  end,
}

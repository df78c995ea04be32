/* Endpoint files that several tests serve, as Lua text
 * for stt_endpoint_t tables (fixture.h). Tests assert on their file:line
 * ("bad.lua:3"), so the line breaks are part of the contract. */
#ifndef STT_ENDPOINTS_H
#define STT_ENDPOINTS_H

/* blob: cached under "blob:{n}", n (1) zero bytes (uint8). */
#define STT_EP_BLOB                                                  \
  "return st.endpoint{ name = 'blob', cache_format_key = 'blob:{n}',\n" \
  "  params = { n = 1 },\n"                                           \
  "  build = function(a) return st.zeros{a.n, dtype = 'uint8'} end }\n"

/* held: managed, n (1) zero bytes (uint8). */
#define STT_EP_HELD                                                  \
  "return st.endpoint{ name = 'held', managed = true, params = { n = 1 },\n" \
  "  build = function(a) return st.zeros{a.n, dtype = 'uint8'} end }\n"

/* t: float32 arange of n (4). */
#define STT_EP_T                                                     \
  "return st.endpoint{ name = \"t\", params = { n = 4 },\n"          \
  "  build = function(a) return st.arange{a.n, dtype = \"float32\"} end }\n"

/* bad: raises "boom" at line 3. */
#define STT_EP_BAD                                                   \
  "return st.endpoint{ name = \"bad\",\n"                            \
  "  build = function(a)\n"                                          \
  "    error(\"boom\")\n"                                            \
  "  end }\n"

/* slow: sleeps s (2) seconds. */
#define STT_EP_SLOW                                                  \
  "return st.endpoint{ name = \"slow\", params = { s = 2 },\n"       \
  "  build = function(a) st.sleep(a.s) return 1 end }\n"

/* mod: a module {weight = ones 2x2, bias = zeros 2}. */
#define STT_EP_MOD                                                   \
  "return st.endpoint{ name = \"mod\",\n"                            \
  "  build = function(a) return st.module{ weight = st.ones{2, 2}, bias = st.zeros{2} } end }\n"

/* lin: managed, cached under "lin:{n}", float32 arange of n (4). */
#define STT_EP_LIN                                                   \
  "return st.endpoint{ name = \"lin\", managed = true, cache_format_key = \"lin:{n}\",\n" \
  "  params = { n = 4 },\n"                                          \
  "  build = function(a) return st.arange{a.n, dtype = \"float32\"} end }\n"

/* plain: float32 arange of n (2), no object. */
#define STT_EP_PLAIN_ARANGE                                          \
  "return st.endpoint{ name = \"plain\", params = { n = 2 },\n"      \
  "  build = function(a) return st.arange{a.n, dtype = \"float32\"} end }\n"

/* steps: n (4) steps of dt (0.05) s, each reported with st.progress. */
#define STT_EP_STEPS                                                 \
  "return st.endpoint{ name = \"steps\", params = { n = 4, dt = 0.05 },\n" \
  "  build = function(a)\n"                                          \
  "    for i = 1, a.n do st.progress(i / a.n, \"step \" .. i) st.sleep(a.dt) end\n" \
  "    return st.arange{3, dtype = \"float32\"}\n"                   \
  "  end }\n"

/* sleeper: up to s (10) seconds, returning early once cancelled. */
#define STT_EP_SLEEPER                                               \
  "return st.endpoint{ name = \"sleeper\", params = { s = 10 },\n"   \
  "  build = function(a)\n"                                          \
  "    for i = 1, a.s * 100 do\n"                                    \
  "      if st.cancelled() then return nil end\n"                    \
  "      st.sleep(0.01)\n"                                           \
  "    end\n"                                                        \
  "    return 1\n"                                                   \
  "  end }\n"

/* echo: returns its required argument `value`. */
#define STT_EP_ECHO                                                  \
  "return st.endpoint{ name = \"echo\", params = { value = st.required },\n" \
  "  build = function(a) return a.value end }\n"

#endif

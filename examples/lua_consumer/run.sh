#!/bin/sh
# Lua consumer: load_linear's weights mapped into LuaJIT. Run from anywhere
# (after building):  examples/lua_consumer/run.sh
. "$(dirname "$0")/../lib.sh"
start_server "$repo/examples/c_consumer/config.lua"
LUA_PATH="$repo/lua/?.lua;;" ST_CLIENT_LIB="$build/lib/libstclient.so" \
  luajit "$repo/examples/lua_consumer/consumer.lua" "$base-0.sock"

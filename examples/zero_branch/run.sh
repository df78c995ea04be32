#!/bin/sh
# Zero-branch script: examples/zero_branch/app.lua run in its three roles.
# Run from anywhere (after building):  examples/zero_branch/run.sh
. "$(dirname "$0")/../lib.sh"
app="$repo/examples/zero_branch/app.lua"
export LUA_PATH="$repo/lua/?.lua;;"
export ST_CLIENT_LIB="$build/lib/libstclient.so" ST_EMBED_LIB="$build/lib/libstembed.so"
export SHARED_TENSOR_BASE_PATH="$base"

echo "== in-process (SHARED_TENSOR_ENABLED unset): no server needed"
luajit "$app"

echo "== client with no server: a clear error"
if SHARED_TENSOR_ENABLED=1 luajit "$app" 2>"$base.err"; then
  echo "the client ran without a server" >&2; exit 1
fi
grep -o "no server at .*" "$base.err"

echo "== server (SHARED_TENSOR_ROLE=server): the same file, served on $base-0.sock"
start_command env SHARED_TENSOR_ENABLED=1 SHARED_TENSOR_ROLE=server luajit "$app"
stcli endpoints

echo "== client (SHARED_TENSOR_ENABLED=1), twice: both get the objects the server built once"
SHARED_TENSOR_ENABLED=1 luajit "$app"
SHARED_TENSOR_ENABLED=1 luajit "$app"
stcli objects

echo "== stopping the server (SIGTERM)"
stop_server
echo "server stopped cleanly"

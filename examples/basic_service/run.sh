#!/bin/sh
# Basic service: a client passes its own tensor to `echo` and to `scale`
# without copying it; `scale` writes into the client's memory. Run from
# anywhere (after building):
#   examples/basic_service/run.sh
. "$(dirname "$0")/../lib.sh"
start_server "$repo/examples/basic_service/config.lua"
stcli endpoints | grep -E '^(echo|scale)\b'
"$build/examples/basic_client" "$base-0.sock"

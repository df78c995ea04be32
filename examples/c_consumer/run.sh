#!/bin/sh
# C consumer: a forward pass of load_linear's weights, mapped from the
# server. Run from anywhere (after building):
#   examples/c_consumer/run.sh
. "$(dirname "$0")/../lib.sh"
start_server "$repo/examples/c_consumer/config.lua"
"$build/examples/c_consumer" "$base-0.sock" 16 4

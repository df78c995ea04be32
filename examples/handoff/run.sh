#!/bin/sh
# Hand-off between processes: a producer passes a tensor per request to two
# consumers through a pool the server owns. Needs python3 with torch.
# Run from anywhere (after building):  examples/handoff/run.sh [--device cuda]
#   [--requests N] [--bench]   (arguments go to handoff.py)
. "$(dirname "$0")/../lib.sh"
python="${ST_PYTHON:-python3}"
[ -x /usr/bin/python3 ] && [ -z "${ST_PYTHON:-}" ] && python=/usr/bin/python3
start_server "$repo/examples/handoff/config.lua"
PYTHONPATH="$repo/python" ST_CLIENT_LIB="$build/lib/libstclient.so" \
  "$python" "$repo/examples/handoff/handoff.py" "$base-0.sock" "$@"

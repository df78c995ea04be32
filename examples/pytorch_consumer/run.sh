#!/bin/sh
# PyTorch consumer: an nn.Linear whose parameters are the server's tensors.
# Needs python3 with torch (Debian: python3-torch). Run from anywhere
# (after building):  examples/pytorch_consumer/run.sh
. "$(dirname "$0")/../lib.sh"
python="${ST_PYTHON:-python3}"
[ -x /usr/bin/python3 ] && [ -z "${ST_PYTHON:-}" ] && python=/usr/bin/python3
start_server "$repo/examples/c_consumer/config.lua"
PYTHONPATH="$repo/python" ST_CLIENT_LIB="$build/lib/libstclient.so" \
  "$python" "$repo/examples/pytorch_consumer/consumer.py" "$base-0.sock"

#!/bin/sh
# Prefill and decode in two processes sharing read-only weights and a
# paged KV cache (docs/keys.md, docs/streams.md). Needs python3 with torch.
# Run from anywhere (after building):  examples/prefill_decode/run.sh [cpu|cuda]
# (default: cuda when torch sees a GPU, else cpu)
. "$(dirname "$0")/../lib.sh"
python="${ST_PYTHON:-python3}"
[ -x /usr/bin/python3 ] && [ -z "${ST_PYTHON:-}" ] && python=/usr/bin/python3
device="${1:-$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
prompt="5,17,42,8,63,21,9,33,70,2,11,48,90,31,6,77,14,55,3"
dir="$repo/examples/prefill_decode"
start_server "$dir/config.lua"
export PYTHONPATH="$repo/python" ST_CLIENT_LIB="$build/lib/libstclient.so"
sock="$base-0.sock"
"$python" "$dir/publish.py" "$sock" "$device" "$prompt"
"$python" "$dir/decode.py" "$sock" "$device" "$prompt" &
decode_pid=$!
"$python" "$dir/prefill.py" "$sock" "$device" "$prompt"
wait "$decode_pid"

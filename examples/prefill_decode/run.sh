#!/bin/sh
# Prefill and decode in two processes sharing read-only weights and a
# paged KV cache (docs/keys.md, docs/streams.md). Needs python3 with torch.
# Run from anywhere (after building):
#   examples/prefill_decode/run.sh [--two-servers] [cpu|cuda]
# (default: cuda when torch sees a GPU, else cpu)
# --two-servers: decode runs behind a second server, a peer on loopback
# acting as another host; the prompt's KV blocks reach it through a
# hand-off across servers and the weights through a pull
# (docs/multihost.md, "Hand-offs across servers"); needs UCX and OpenSSL 3.
. "$(dirname "$0")/../lib.sh"
two=""
if [ "${1:-}" = "--two-servers" ]; then two=1; shift; fi
python="${ST_PYTHON:-python3}"
[ -x /usr/bin/python3 ] && [ -z "${ST_PYTHON:-}" ] && python=/usr/bin/python3
device="${1:-$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
prompt="5,17,42,8,63,21,9,33,70,2,11,48,90,31,6,77,14,55,3"
dir="$repo/examples/prefill_decode"
export PYTHONPATH="$repo/python" ST_CLIENT_LIB="$build/lib/libstclient.so"
sock="$base-0.sock"
if [ -z "$two" ]; then
  start_server "$dir/config.lua"
  "$python" "$dir/publish.py" "$sock" "$device" "$prompt"
  "$python" "$dir/decode.py" "$sock" "$device" "$prompt" &
  decode_pid=$!
  "$python" "$dir/prefill.py" "$sock" "$device" "$prompt"
  wait "$decode_pid"
  exit 0
fi

# Two servers: "prefill" holds the weights and the prefill's pool and
# exports them and the hand-off; "decode" dials it.
start_two_servers prefill decode 'prefill_decode/*' 'prefill_decode.*'
channel="$(dirname "$base")/channel"
"$python" "$dir/publish.py" "$sock" "$device" "$prompt"
"$python" "$dir/decode.py" "$base_b-0.sock" "$device" "$prompt" prefill "$channel" &
decode_pid=$!
"$python" "$dir/prefill.py" "$sock" "$device" "$prompt" prefill "$channel"
wait "$decode_pid"

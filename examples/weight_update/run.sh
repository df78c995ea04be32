#!/bin/sh
# A trainer updates a model's weights in place every step; rollout
# processes bound to the live key run forward passes on one consistent
# version each (docs/views.md, section 4). Needs python3 with torch.
# Run from anywhere (after building):
#   examples/weight_update/run.sh [--two-servers] [cpu|cuda] [ROLLOUTS] [STEPS]
# (default: cuda when torch sees a GPU, else cpu; 3 rollouts; 40 steps).
# --two-servers: the rollouts use a second server that follows the
# trainer's keys across servers (two peers on loopback, as two hosts;
# docs/multihost.md, "Live replication"); needs UCX and OpenSSL 3.
. "$(dirname "$0")/../lib.sh"
two=""
if [ "${1:-}" = "--two-servers" ]; then two=1; shift; fi
python="${ST_PYTHON:-python3}"
[ -x /usr/bin/python3 ] && [ -z "${ST_PYTHON:-}" ] && python=/usr/bin/python3
device="${1:-$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
dir="$repo/examples/weight_update"
export PYTHONPATH="$repo/python" ST_CLIENT_LIB="$build/lib/libstclient.so"
if [ -z "$two" ]; then
  start_server "$dir/config.lua"
  "$python" "$dir/trainer.py" "$base-0.sock" "$device" "${2:-3}" "${3:-40}"
  exit 0
fi

# Two servers: "trainer" exports the example's keys; "rollouts" dials it.
start_two_servers trainer rollouts 'weight_update/*'
"$python" "$dir/trainer.py" "$base-0.sock" "$device" "${2:-3}" "${3:-40}" "$base_b-0.sock" trainer

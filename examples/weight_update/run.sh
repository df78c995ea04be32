#!/bin/sh
# A trainer updates a model's weights in place every step; rollout
# processes bound to the live key run forward passes on one consistent
# version each (docs/views.md, section 4). Needs python3 with torch.
# Run from anywhere (after building):
#   examples/weight_update/run.sh [cpu|cuda] [ROLLOUTS] [STEPS]
# (default: cuda when torch sees a GPU, else cpu; 3 rollouts; 40 steps)
. "$(dirname "$0")/../lib.sh"
python="${ST_PYTHON:-python3}"
[ -x /usr/bin/python3 ] && [ -z "${ST_PYTHON:-}" ] && python=/usr/bin/python3
device="${1:-$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
dir="$repo/examples/weight_update"
start_server "$dir/config.lua"
export PYTHONPATH="$repo/python" ST_CLIENT_LIB="$build/lib/libstclient.so"
"$python" "$dir/trainer.py" "$base-0.sock" "$device" "${2:-3}" "${3:-40}"

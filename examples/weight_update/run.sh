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

# Two servers: "trainer" listens on a loopback port of its choosing and
# exports the example's keys; "rollouts" dials it. One cluster key.
tmp="$(dirname "$base")"
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$tmp/cluster.key"
echo >> "$tmp/cluster.key"
chmod 600 "$tmp/cluster.key"
export UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
common="endpoints = '$repo/endpoints', workers = 1, default_device = 'cpu',
  memory_budget = { cpu = 256 * 1024 * 1024, ['cuda:0'] = 1024 * 1024 * 1024 },"
cat > "$tmp/trainer.lua" <<EOF
return { $common
  peer = { id = 'trainer', listen = '127.0.0.1:0', secret = '$tmp/cluster.key',
           peers = { rollouts = {} }, export = { 'weight_update/*' } } }
EOF
start_server "$tmp/trainer.lua"
addr="$(stcli --json info | "$python" -c 'import json, sys; print(json.load(sys.stdin)["peer"]["listen"])')"
cat > "$tmp/rollouts.lua" <<EOF
return { $common
  peer = { id = 'rollouts', secret = '$tmp/cluster.key', peers = { trainer = '$addr' } } }
EOF
rbase="$tmp/rollouts"
"$stserver" --config "$tmp/rollouts.lua" --base-path "$rbase" > "$tmp/rollouts.log" 2>&1 &
rpid=$!
stop_both() {
  kill -TERM "$rpid" 2>/dev/null || true
  wait "$rpid" || { echo "the rollouts' stserver exited with $?" >&2; cat "$tmp/rollouts.log" >&2; }
  stop_server
}
trap stop_both EXIT
# Until the rollouts' server reaches the trainer's (its link is up).
up=""
for _ in $(seq 1 1000); do
  if "$stcli_bin" --base-path "$rbase" peers 2>/dev/null | grep -q "^trainer .* up"; then up=1; break; fi
  kill -0 "$rpid" 2>/dev/null || break
  sleep 0.02
done
[ -n "$up" ] || { echo "the two servers did not link" >&2; cat "$tmp/rollouts.log" >&2; exit 1; }
"$python" "$dir/trainer.py" "$base-0.sock" "$device" "${2:-3}" "${3:-40}" "$rbase-0.sock" trainer

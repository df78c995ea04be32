#!/bin/sh
# Model service: two clients ask for the same model at once; it is built
# once and both map the same memory. Run from anywhere:
#   examples/model_service/run.sh
. "$(dirname "$0")/../lib.sh"
start_server "$repo/examples/model_service/config.lua"

echo "== two concurrent calls of mlp hidden=64"
stcli call mlp hidden=64 > "$base.a" &
stcli call mlp hidden=64 > "$base.b"
wait $!
cat "$base.a"
# Both replies name the same object: one build, one copy in memory.
a=$(grep '^object' "$base.a" | cut -d' ' -f2)
b=$(grep '^object' "$base.b" | cut -d' ' -f2)
[ "$a" = "$b" ] || { echo "expected one object, got $a and $b" >&2; exit 1; }
echo "both clients got object $a"

echo "== cached objects"
stcli objects
echo "== drop the cache entry, then the next call builds again"
stcli invalidate mlp hidden=64
stcli call mlp hidden=64 | grep '^object'
stcli stats

#!/bin/sh
# Async service: submit returns at once; wait follows progress; a second
# task is cancelled while it runs. Run from anywhere:
#   examples/async_service/run.sh
. "$(dirname "$0")/../lib.sh"
start_server "$repo/examples/async_service/config.lua"

echo "== submit, then wait (progress goes to stderr on a terminal)"
id=$(stcli submit prepare steps=5 step_s=0.05)
echo "task $id submitted"
stcli wait "$id" --values 2>&1   # plain progress lines when not on a terminal

echo "== cancel a running task"
slow=$(stcli submit prepare steps=100 step_s=0.05)
stcli wait "$slow" --timeout 0.2 >/dev/null 2>&1 || true   # TIMEOUT: still running
stcli cancel "$slow"
stcli wait "$slow" >/dev/null 2>&1 || true
stcli status "$slow" | grep '^status'
stcli tasks

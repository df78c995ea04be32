#!/bin/bash
# Installs the build into a temporary prefix and uses it as a user would,
# with no environment variable pointing at it: the installed stserver finds
# its own config, a C consumer built with `pkg-config --libs stclient` runs,
# stcli and the Lua client work from the prefix, the Python package works
# from the prefix and from `pip install ./python` in a venv (offline).
#
#   tests/install/run.sh SOURCE_DIR BUILD_DIR
set -u
src=$1
build=$2
work=$(mktemp -d /tmp/st-install.XXXXXX)
srv=
cleanup() {
  [ -n "$srv" ] && kill -TERM "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  [ -f "$work/server.log" ] && { echo "--- server log"; tail -20 "$work/server.log"; }
  exit 1
}
# A bare environment: what a new shell on a fresh machine has. A host
# whose own libraries (LuaJIT, libev) live outside the loader's paths keeps
# its LD_LIBRARY_PATH, provided it does not name this build's libraries.
keep=
case ":${LD_LIBRARY_PATH:-}:" in
  *":$build/lib:"*|*":$build/lib/:"*) ;;
  ::) ;;
  *) keep="LD_LIBRARY_PATH=$LD_LIBRARY_PATH" ;;
esac
bare() { env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work" $keep "$@"; }

p=$work/prefix
cmake --install "$build" --prefix "$p" > "$work/install.log" 2>&1 || {
  cat "$work/install.log"; fail "cmake --install"; }
for f in bin/stserver bin/stcli include/st/client.h lib/pkgconfig/stclient.pc \
         share/lua/5.1/st/client.lua etc/sharedtensor/config.lua \
         etc/sharedtensor/endpoints/linear.lua lib/systemd/system/sharedtensor.service \
         lib/python3/dist-packages/sharedtensor/__init__.py; do
  [ -e "$p/$f" ] || fail "not installed: $f"
done
grep -q "^ExecStart=$p/bin/stserver --config $p/etc/sharedtensor/config.lua" \
  "$p/lib/systemd/system/sharedtensor.service" || fail "the unit does not name the installed paths"

# The installed server, started without --config from a directory that has
# no config.lua, reads the installed config and endpoints.
mkdir "$work/run"
cd "$work/run"
# Not through bare(): a function run in the background is a subshell of
# its own, and $! would name it rather than the server.
env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work" $keep \
  "$p/bin/stserver" --base-path "$work/st" > "$work/server.log" 2>&1 &
srv=$!
for _ in $(seq 200); do
  # The file exists from bind(), a moment before listen(): ready once a
  # ping is answered.
  [ -S "$work/st-0.sock" ] && bare "$p/bin/stcli" --socket "$work/st-0.sock" ping \
    > /dev/null 2>&1 && break
  kill -0 "$srv" 2>/dev/null || fail "stserver exited"
  sleep 0.05
done
[ -S "$work/st-0.sock" ] || fail "no socket after 10 s"
grep -q "config: $p/etc/sharedtensor/config.lua" "$work/server.log" || fail "installed config not used"
sock=$work/st-0.sock

bare "$p/bin/stcli" --socket "$sock" ping > /dev/null || fail "stcli ping"

# The metrics timer's service as installed (docs/operations.md,
# "Monitoring"): its ExecStart, with this test's textfile directory and
# socket base, writes sharedtensor.prom; with no server it removes it.
unit=$p/lib/systemd/system/sharedtensor-metrics.service
[ -e "$p/lib/systemd/system/sharedtensor-metrics.timer" ] || fail "not installed: the metrics timer"
metrics=$(sed -n 's/^ExecStart=//p' "$unit")
case $metrics in "$p/bin/stcli "*) ;; *) fail "the metrics unit does not name the installed stcli: $metrics" ;; esac
mkdir "$work/textfile"
metrics=${metrics//\/var\/lib\/prometheus\/node-exporter/$work/textfile}
bare env SHARED_TENSOR_BASE_PATH="$work/st" $metrics || fail "the metrics unit's command: $metrics"
grep -q "^sharedtensor_server_info{" "$work/textfile/sharedtensor.prom" || fail "no metrics in the textfile"
[ "$(ls -A "$work/textfile")" = sharedtensor.prom ] || fail "the textfile directory holds more: $(ls -A "$work/textfile")"

# A C consumer built as docs/client.md says, run with no LD_LIBRARY_PATH.
# (A sysroot some hosts set for their own libraries would be put in front
# of this prefix's paths: it does not apply to them.)
pc="env -u PKG_CONFIG_SYSROOT_DIR pkg-config --with-path=$p/lib/pkgconfig"
flags=$($pc --cflags --libs stclient) || fail "pkg-config stclient"
cc -o "$work/consumer" "$src/examples/c_consumer/consumer.c" $flags || fail "building the C consumer"
bare "$work/consumer" "$sock" > "$work/consumer.out" 2>&1 || { cat "$work/consumer.out"; fail "C consumer"; }

# The Lua client from the prefix (LuaJIT's default path has
# <prefix>/share/lua/5.1 for /usr and /usr/local; here it is added in code).
# Interpreters by the path this shell finds them at (the bare PATH may not
# have them on hosts that keep them elsewhere).
if lj=$(command -v luajit); then
  bare "$lj" -e "
    package.path = '$p/share/lua/5.1/?.lua;' .. package.path
    local st = require('st.client')
    local c = assert(st.connect{ path = '$sock' })
    local r = assert(c:call('hello', { name = 'lua' }))
    assert(r.value.message == 'hello, lua', tostring(r.value.message))
    print('lua ok')" > "$work/lua.out" 2>&1 || { cat "$work/lua.out"; fail "Lua client"; }
fi

py_check="
import sharedtensor
with sharedtensor.Client(path='$sock', framework=None) as c:
    r = c.call('hello', n=3)
    assert r['message'] == 'hello, world', r
print(sharedtensor._lib.path)"
if py=$(command -v python3); then
  # The package of the prefix.
  out=$(bare "$py" -c "import sys; sys.path.insert(0, '$p/lib/python3/dist-packages')
$py_check") || fail "Python from the prefix: $out"
  [ "$out" = "$p/lib/libstclient.so.0" ] || fail "Python from the prefix loaded $out"
  # pip install ./python in a venv, offline; the wheel bundles the library.
  if "$py" -m venv "$work/venv" > /dev/null 2>&1; then
    # The backend bundles ../build/lib/libstclient.so.0 (the README's build)
    # by itself; another build tree is named with ST_CLIENT_LIB.
    lib_env=
    [ "$(realpath "$build")" = "$(realpath "$src/build")" ] ||
      lib_env="ST_CLIENT_LIB=$build/lib/libstclient.so.0"
    bare $lib_env "$work/venv/bin/pip" install --no-index \
      --disable-pip-version-check -q "$src/python" > "$work/pip.log" 2>&1 || {
      cat "$work/pip.log"; fail "pip install ./python"; }
    out=$(cd "$work" && bare "$work/venv/bin/python" -c "$py_check") || fail "Python from the venv: $out"
    case "$out" in
      "$work"/venv/lib/*/site-packages/sharedtensor/libstclient.so.0) ;;
      *) fail "the venv's package loaded $out" ;;
    esac
  else
    echo "python3 -m venv unavailable: the venv part is skipped"
  fi
fi
echo "install: ok ($p)"

#!/bin/bash
# The Debian package as CI builds it (docs/operations.md, "Installing"):
# `cpack -G DEB` of this build into a temporary directory makes
# sharedtensor_*.deb and sharedtensor-dbgsym_*.ddeb; the .deb's binaries
# and libraries are stripped, the .ddeb holds their debug symbols by build
# id; the binaries of the extracted tree run (`stserver --help`, `stcli
# --version`, with the extracted libstclient); the maintainer scripts,
# run on the extracted tree ($DPKG_ROOT), leave nothing of the Python
# package after a purge. Exit 77 (skipped) without dpkg-deb or cpack.
#
#   tests/install/package.sh BUILD_DIR
set -u
build=$1
command -v dpkg-deb > /dev/null || { echo "dpkg-deb not installed: skipped"; exit 77; }
cpack=$(command -v cpack) || { echo "cpack not installed: skipped"; exit 77; }
work=$(mktemp -d /tmp/st-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

(cd "$work" && "$cpack" -G DEB --config "$build/CPackConfig.cmake" -B "$work" > cpack.log 2>&1) || {
  cat "$work/cpack.log"; fail "cpack -G DEB"; }
debs=("$work"/sharedtensor_*.deb)
ddebs=("$work"/sharedtensor-dbgsym_*.ddeb)
[ ${#debs[@]} = 1 ] && [ -f "${debs[0]}" ] || fail "no single sharedtensor_*.deb: $(ls "$work")"
[ ${#ddebs[@]} = 1 ] && [ -f "${ddebs[0]}" ] || fail "no debug-symbols package: $(ls "$work")"
deb=${debs[0]}
ddeb=${ddebs[0]}

root=$work/root
dpkg-deb -x "$deb" "$root" || fail "dpkg-deb -x"
# Stripped: no symbol table, no DWARF; a link to the debug file instead.
for f in "$root"/usr/bin/stserver "$root"/usr/bin/stcli "$root"/usr/lib/libstclient.so.0; do
  [ -e "$f" ] || fail "not in the package: ${f#$root}"
  sections=$(readelf -S -W "$f") || fail "readelf ${f#$root}"
  case $sections in *" .symtab "*|*" .debug_info "*) fail "not stripped: ${f#$root}" ;; esac
done
# The debug symbols of stserver, under its build id.
id=$(readelf -n "$root/usr/bin/stserver" | sed -n 's/^ *Build ID: //p')
[ -n "$id" ] || fail "stserver has no build id"
dpkg-deb -c "$ddeb" | grep -q "\./usr/lib/debug/\.build-id/${id:0:2}/${id:2}\.debug$" ||
  fail "the dbgsym package has no debug file for stserver's build id $id"
dpkg-deb -f "$ddeb" Package Depends | grep -q "^Depends: sharedtensor (= " ||
  fail "the dbgsym package does not depend on its package"

# The extracted binaries run, stcli with the extracted library (RUNPATH
# $ORIGIN/../lib), in a bare environment.
bare() { env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work" "$@"; }
out=$(bare "$root/usr/bin/stserver" --help) || fail "extracted stserver --help"
[[ $out == "usage: stserver"* ]] || fail "stserver --help printed: $out"
out=$(bare "$root/usr/bin/stcli" --version) || fail "extracted stcli --version"
[[ $out == "stcli "* ]] || fail "stcli --version printed: $out"
bare ldd "$root/usr/bin/stcli" | grep -q "libstclient.so.0 => $root/" ||
  fail "the extracted stcli does not load the extracted libstclient: $(ldd "$root/usr/bin/stcli")"

# Remove and purge: what root's imports wrote goes with the package.
ctl=$work/control
dpkg-deb -e "$deb" "$ctl" || fail "dpkg-deb -e"
[ -x "$ctl/prerm" ] && [ -x "$ctl/postrm" ] || fail "no executable prerm/postrm"
py=$root/usr/lib/python3/dist-packages/sharedtensor
[ -f "$py/__init__.py" ] || fail "no Python package in the .deb"
mkdir -p "$py/__pycache__" && touch "$py/__pycache__/__init__.cpython-311.pyc"
DPKG_ROOT=$root sh "$ctl/prerm" remove || fail "prerm remove"
[ -e "$py/__pycache__" ] && fail "prerm left __pycache__"
# After dpkg removed the modules, a __pycache__ written since goes too,
# and with it the directory.
find "$py" -type f -delete
mkdir -p "$py/__pycache__" && touch "$py/__pycache__/client.cpython-311.pyc"
DPKG_ROOT=$root sh "$ctl/postrm" purge || fail "postrm purge"
[ -e "$py" ] && fail "postrm purge left $(find "$py")"
echo "ok: $(basename "$deb") ($(stat -c %s "$root/usr/bin/stserver") bytes of stserver)," \
     "$(basename "$ddeb")"
exit 0

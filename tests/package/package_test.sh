#!/usr/bin/env bash
# The Debian package (cmake/packaging.cmake, tools/package), made by cpack
# from the build tree into a temporary directory and checked without
# installing it (nothing on the machine changes):
#  1. its name is tether_VERSION_ARCH.deb and `dpkg-deb -c` lists the five
#     programs (stripped), the SDK's headers, libtether_client.so and CMake
#     package, the Python package and the CUDA module where the build has
#     them, and nothing else (no benchmarks, tests, static libraries);
#  2. Depends names the package of every shared library the package's ELF
#     files link directly (readelf NEEDED, resolved by ldd, owner by
#     dpkg -S): RocksDB, OpenSSL and Boost.JSON at least, no -dev package,
#     no Python or PyTorch (those are Recommends/Suggests);
#  3. unpacked with `dpkg-deb -x`, its programs run from there: every one's
#     --help, then a shard on 127.0.0.1 port 0 (--ready-file), a
#     `tether-client train` of 20 iterations against it, `stats` and `pull`
#     showing those 20 pushes, and the dashboard page (compiled into
#     tether-server) served; the Python package imports from the unpacked
#     copy, and find_package(tether) finds the unpacked SDK.
# Exit 0: pass; 1: fail; 77: skipped (no dpkg-deb: not a Debian system).
#
# Environment:
#   TETHER_BUILD_DIR   the build tree (default: build/release)
#   CPACK, CMAKE       the cpack and cmake to use (default: on PATH)
#   PYTHON             the python3 the package is for (default: /usr/bin/python3)
set -euo pipefail
source "$(dirname "$0")/../support/lib.sh"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=$(cd "${TETHER_BUILD_DIR:-$repo/build/release}" && pwd)
cpack_bin=${CPACK:-cpack}
cmake_bin=${CMAKE:-cmake}
python_bin=${PYTHON:-/usr/bin/python3}

if ! command -v dpkg-deb > /dev/null; then
  echo "SKIPPED: dpkg-deb is missing (not a Debian system; the package needs dpkg)"
  exit 77
fi

tmp=$(mktemp -d /tmp/tether-package-XXXXXX)
pids=()
passed=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_pids "${pids[@]}"
  if [[ $passed -eq 1 ]]; then rm -rf "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$(date +%s.%N)
note() {
  echo "[$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }') s] $*"
}
fail() {
  echo "FAIL: $* (files in $tmp)"
  exit 1
}

command -v dpkg-shlibdeps > /dev/null ||
  fail "dpkg-shlibdeps is missing: without it the package has no Depends (tools/setup installs dpkg-dev)"
[[ -f $build_dir/CPackConfig.cmake ]] ||
  fail "$build_dir/CPackConfig.cmake is missing (configure the build again)"

# --- 1. The package and what it holds ---------------------------------------
"$cpack_bin" --config "$build_dir/CPackConfig.cmake" -B "$tmp/out" \
  > "$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log"; fail "cpack failed"; }
version=$(sed -nE 's/^set\(CPACK_PACKAGE_VERSION "(.*)"\)$/\1/p' \
  "$build_dir/CPackConfig.cmake")
arch=$(dpkg --print-architecture)
deb=$tmp/out/tether_${version}_${arch}.deb
[[ -n $version && -f $deb ]] ||
  fail "no tether_${version}_${arch}.deb; cpack made: $(ls "$tmp/out")"
note "cpack made $(basename "$deb") ($(du -h "$deb" | cut -f1))"

dpkg-deb -c "$deb" > "$tmp/contents.txt"
# Entries as ./usr/..., files and links (not directories).
awk '$1 !~ /^d/ { print $6 }' "$tmp/contents.txt" > "$tmp/files.txt"
has() { grep -qxF "./usr/$1" "$tmp/files.txt" || fail "the package lacks /usr/$1"; }
for p in tether-server tether-worker tether-up tether-client tether-ckpt; do
  has "bin/$p"
done
for h in worker/client.h worker/training_loop.h worker/slicer.h \
         schema/status.h schema/stats.h schema/log.h schema/tls_options.h; do
  has "include/tether/$h"
done
# lib/ for the default layout; lib/<multiarch>/ for a build configured
# with the prefix /usr.
libdir=$(sed -nE 's|^\./usr/(lib(/[^/]+-linux-gnu[^/]*)?)/libtether_client\.so$|\1|p' \
  "$tmp/files.txt")
[[ -n $libdir ]] || fail "the package lacks libtether_client.so"
soname=$(readelf -d "$build_dir/libtether_client.so" |
         sed -nE 's/.*SONAME.*\[(.*)\]/\1/p')
has "$libdir/$soname"
for f in tetherConfig.cmake tetherConfigVersion.cmake tetherTargets.cmake; do
  has "$libdir/cmake/tether/$f"
done
py_dir=lib/python3/dist-packages/tether
with_python=0
if compgen -G "$build_dir/python/tether/_tether*.so" > /dev/null; then
  with_python=1
  for f in __init__.py errors.py torch.py worker.py; do has "$py_dir/$f"; done
  grep -qE "^\./usr/$py_dir/_tether\.cpython-[^/]+\.so$" "$tmp/files.txt" ||
    fail "the package lacks the Python extension in /usr/$py_dir"
fi
if [[ -f $build_dir/libtether_cuda.so ]]; then has "$libdir/libtether_cuda.so"; fi
# Nothing else: no benchmarks, tether-gen-sparse, tests, static libraries,
# bytecode, or the python component's /usr/lib/pythonX.Y copy.
allowed="^\./usr/(bin/tether-(server|worker|up|client|ckpt)"
allowed+="|include/tether/(worker|schema)/[a-z_]+\.h"
allowed+="|$libdir/libtether_client\.so(\.[0-9]+)*|$libdir/libtether_cuda\.so"
allowed+="|$libdir/cmake/tether/tether[A-Za-z-]*\.cmake"
allowed+="|$py_dir/([a-z_]+\.py|_tether\.cpython-[^/]+\.so))$"
extra=$(grep -vE "$allowed" "$tmp/files.txt" || true)
[[ -z $extra ]] || fail "the package holds files it should not: $extra"
note "contents: $(wc -l < "$tmp/files.txt") files, all expected ones"

# --- 2. Depends -------------------------------------------------------------
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
echo "Recommends: $(dpkg-deb -f "$deb" Recommends)"
echo "Suggests: $(dpkg-deb -f "$deb" Suggests)"
# Package names, one a line, without versions.
tr ',|' '\n' <<< "$depends" | sed -E 's/\(.*\)//; s/ //g' | sed '/^$/d' |
  sort -u > "$tmp/depends.txt"
for re in '^librocksdb[0-9.]+$' '^libssl[0-9.]+$' '^libboost-json[0-9.]+$' \
          '^libc6$' '^libstdc\+\+6$'; do
  grep -qE "$re" "$tmp/depends.txt" || fail "Depends names no package matching /$re/"
done
dev=$(grep -E -- '-dev$' "$tmp/depends.txt" || true)
[[ -z $dev ]] || fail "Depends names a -dev package: $dev"
python_dep=$(grep -E '^python3' "$tmp/depends.txt" || true)
[[ -z $python_dep ]] || fail "Depends names $python_dep (the programs need no Python)"
if [[ $with_python -eq 1 ]]; then
  dpkg-deb -f "$deb" Recommends | grep -q 'python3-numpy' ||
    fail "Recommends lacks python3-numpy (import tether needs it)"
fi

# Every package owning a library that an ELF file of the package links
# directly (NEEDED) is in Depends. Libraries no package owns (a CUDA
# toolkit in /usr/local) are named and skipped.
dpkg-deb -x "$deb" "$tmp/root"
root=$tmp/root
owner_of() {  # the package owning library file $1, or nothing
  local c
  for c in "$1" "/usr$1" "$(realpath "$1")"; do
    dpkg -S "$c" 2> /dev/null | head -n 1 | sed -E 's/[:,].*//' && return 0
  done
  return 0
}
declare -A owner
checked=0
while read -r elf; do
  lddout=$(env -u LD_LIBRARY_PATH ldd "$elf" 2>&1) || fail "ldd $elf: $lddout"
  ! grep -q 'not found' <<< "$lddout" ||
    fail "${elf#"$root"} needs a library that is not found: $(grep 'not found' <<< "$lddout")"
  ! grep -qF -- "$build_dir" <<< "$lddout" ||
    fail "${elf#"$root"} loads a library from the build tree"
  while read -r needed; do
    [[ $needed == ld-linux* ]] && continue
    path=$(awk -v s="$needed" '$1 == s && $2 == "=>" { print $3 }' <<< "$lddout")
    [[ -n $path ]] || fail "ldd does not resolve $needed of ${elf#"$root"}"
    [[ -v owner[$path] ]] || owner[$path]=$(owner_of "$path")
    pkg=${owner[$path]}
    if [[ -z $pkg ]]; then
      echo "note: $needed ($path, needed by ${elf#"$root"}) belongs to no package"
      continue
    fi
    grep -qxF "$pkg" "$tmp/depends.txt" ||
      fail "${elf#"$root"} links $needed of package $pkg, which Depends lacks"
    checked=$((checked + 1))
  done < <(readelf -d "$elf" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p')
  file "$elf" | grep -q ', stripped' || fail "${elf#"$root"} is not stripped"
done < <(find "$root/usr" -type f \( -path '*/bin/*' -o -name '*.so*' \))
(( checked > 0 )) || fail "no linked library was checked"
note "Depends covers the $checked direct library links of the package's ELF files"

# --- 3. The unpacked programs at work ---------------------------------------
bin=$root/usr/bin
for p in tether-server tether-worker tether-up tether-client tether-ckpt; do
  out=$(env -u LD_LIBRARY_PATH "$bin/$p" --help 2>&1) || fail "$p --help: $out"
  grep -q "^usage: $p" <<< "$out" || fail "$p --help printed no usage: $out"
done
grep -q -- '--ready-file' <<< "$(env -u LD_LIBRARY_PATH "$bin/tether-server" --help 2>&1)" ||
  fail "tether-server --help does not list --ready-file"

# If this script is SIGKILLed (no trap runs), the shard dies with it.
die_with_us=()
command -v setpriv > /dev/null && die_with_us=(setpriv --pdeathsig KILL --)
ready=$tmp/ready.json
env -u LD_LIBRARY_PATH "${die_with_us[@]}" "$bin/tether-server" --shard-id 0 \
  --shards 1 --listen 127.0.0.1:0 --http 127.0.0.1:0 --workers 1 \
  --ready-file "$ready" > "$tmp/shard.log" 2>&1 &
shard=$!
pids+=("$shard")
for _ in $(seq 200); do
  [[ -f $ready ]] && break
  kill -0 "$shard" 2> /dev/null || fail "the shard exited: $(tail -5 "$tmp/shard.log")"
  sleep 0.05
done
[[ -f $ready ]] || fail "the shard wrote no --ready-file in 10 s"
coordinator=$(sed -nE 's/.*"listen":"(127\.0\.0\.1:[0-9]+)".*/\1/p' "$ready")
dashboard=$(sed -nE 's|.*"dashboard":"http://127\.0\.0\.1:([0-9]+)/".*|\1|p' "$ready")
[[ -n $coordinator && -n $dashboard ]] || fail "unexpected ready file: $(cat "$ready")"
note "unpacked tether-server listening on $coordinator"

client() { env -u LD_LIBRARY_PATH timeout 60 "$bin/tether-client" "$@" --coordinator "$coordinator"; }
out=$(client train --shape 1000 --iterations 20 --staleness 0 --quiet 2>&1) ||
  fail "tether-client train: $out"
stats=$(client stats 2>&1) || fail "tether-client stats: $stats"
echo "$stats"
grep -qE 'pushes=20 .*min_clock=20' <<< "$stats" ||
  fail "stats do not show 20 pushes and clock 20"
pull=$(client pull --shape 1000 2>&1) || fail "tether-client pull: $pull"
echo "$pull"
# 20 SGD steps (lr 0.01) of the gradient -1 on 1000 zeros: each 0.2.
grep -qE 'sum=(199\.99|200\.00)' <<< "$pull" || fail "pull's sum is not 200"

# The dashboard page, which tether-server carries inside itself.
exec 3<> "/dev/tcp/127.0.0.1/$dashboard"
printf 'GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
page=$(timeout 10 cat <&3 || true)
exec 3<&-
grep -q '^HTTP/1.1 200' <<< "$page" || fail "the dashboard did not answer 200: ${page:0:200}"
grep -qi '<html' <<< "$page" || fail "the dashboard served no page"
stop_pids "$shard"
pids=()
note "the unpacked tether-server and tether-client ran a training run"

# The Python package, from the unpacked copy alone.
if [[ $with_python -eq 1 ]]; then
  if ! "$python_bin" -c 'import numpy' 2> /dev/null; then
    echo "note: no numpy for $python_bin; the Python package's import not tried"
  else
    (cd / && env -u PYTHONPATH PYTHONPATH="$root/usr/$py_dir/.." \
       PYTHONDONTWRITEBYTECODE=1 "$python_bin" - "$root" <<'PY'
import sys
root = sys.argv[1]
import tether
assert tether.__file__.startswith(root), tether.__file__
assert tether._tether.__file__.startswith(root), tether._tether.__file__
assert issubclass(tether.StalePushError, tether.Error)
print("python: imported tether from", tether.__file__)
PY
    ) || fail "the unpacked Python package does not import"
  fi
fi

# The SDK's CMake package, found in the unpacked /usr.
mkdir -p "$tmp/probe"
cat > "$tmp/probe/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(probe LANGUAGES NONE)
find_package(tether 0.1 REQUIRED CONFIG)
get_target_property(config tether::client IMPORTED_CONFIGURATIONS)
get_target_property(location tether::client IMPORTED_LOCATION_${config})
get_target_property(includes tether::client INTERFACE_INCLUDE_DIRECTORIES)
message(STATUS "tether::client ${location} ${includes}")
CMAKE
"$cmake_bin" -S "$tmp/probe" -B "$tmp/probe/build" \
  -DCMAKE_PREFIX_PATH="$root/usr" > "$tmp/probe.log" 2>&1 ||
  fail "find_package(tether) in the unpacked /usr: $(tail -20 "$tmp/probe.log")"
grep -qE "tether::client $root/usr/$libdir/libtether_client\.so[.0-9]* $root/usr/include/tether" \
  "$tmp/probe.log" || fail "find_package(tether) found the wrong files: $(grep 'tether::' "$tmp/probe.log")"
note "find_package(tether) finds the unpacked SDK"

passed=1
note "PASS: $(basename "$deb") holds what it should, depends on what it links, and runs"

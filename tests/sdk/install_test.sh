#!/usr/bin/env bash
# The installed C++ SDK, used the way a user would: `cmake --install` the
# sdk component into a temporary prefix, build tools/examples/cpp (copied
# out of the repository) against it with find_package(tether), check that
# nothing in that build reaches tether's source or build tree (include
# paths, the headers the compiler read, the library's run path), then train
# the example's model with 2 workers against a real cluster of 2 shards for
# one epoch. Pass: both workers exit 0 and print a test accuracy above
# TETHER_SDK_MIN_ACCURACY (a model that does not learn stays near 10%).
# Exit 0: pass; 1: fail, with the tail of every log.
#
# Environment:
#   TETHER_BUILD_DIR    the build tree to install from (default:
#                       build/release under the repository root)
#   TETHER_SERVER_BIN   tether-server (default: in TETHER_BUILD_DIR)
#   CMAKE               the cmake to use (default: cmake on PATH)
#   ARTIFACT_DIR        where the logs go (default: the temporary dir,
#                       deleted after a pass)
#   TETHER_SDK_MIN_ACCURACY   percent (default 70)
#   TETHER_SDK_DEADLINE_S     bound on training, from the first shard
#                             started to the last worker's exit (120)
set -euo pipefail
source "$(dirname "$0")/../support/lib.sh"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=$(cd "${TETHER_BUILD_DIR:-$repo/build/release}" && pwd)
server_bin=${TETHER_SERVER_BIN:-$build_dir/tether-server}
cmake_bin=${CMAKE:-cmake}
min_accuracy=${TETHER_SDK_MIN_ACCURACY:-70}
deadline_s=${TETHER_SDK_DEADLINE_S:-120}

tmp=$(mktemp -d /tmp/tether-sdk-XXXXXX)
log_dir=${ARTIFACT_DIR:-$tmp/logs}
mkdir -p "$log_dir"
prefix=$tmp/prefix
pids=()
passed=0

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_pids "${pids[@]}"
  if [[ $passed -eq 1 && -z ${ARTIFACT_DIR:-} ]]; then rm -rf "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t0=$(date +%s.%N)
now() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }'; }
note() { echo "[$(now) s] $*"; }
fail() {
  local f
  for f in "$log_dir"/*.log; do
    [[ -e $f ]] || continue
    echo "--- tail of $f"
    tail -n 25 "$f" || true
  done
  echo "FAIL: $* (logs in $log_dir)"
  exit 1
}

[[ -x $server_bin ]] || fail "$server_bin is missing (build tether-server first)"

# --- 1. Install the SDK and build the example out of tree ------------------
"$cmake_bin" --install "$build_dir" --prefix "$prefix" --component sdk \
  > "$log_dir/install.log" 2>&1 || fail "cmake --install failed"
[[ -f $prefix/include/tether/worker/client.h &&
   -f $prefix/include/tether/worker/training_loop.h &&
   -f $prefix/lib/cmake/tether/tetherConfig.cmake ]] ||
  fail "the install lacks the headers or the CMake package"
# Every quoted include of an installed header is installed too.
while read -r header included; do
  [[ -f $prefix/include/tether/$included ]] ||
    fail "installed ${header#"$prefix"/} includes \"$included\", which is not installed"
done < <(grep -rHoE '^#include "[^"]+"' "$prefix/include/tether" |
         sed -E 's/^([^:]+):#include "([^"]+)"$/\1 \2/')
note "SDK installed in $prefix"

cp -r "$repo/tools/examples/cpp" "$tmp/src"
"$cmake_bin" -S "$tmp/src" -B "$tmp/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  > "$log_dir/example-configure.log" 2>&1 || fail "configuring the example failed"
"$cmake_bin" --build "$tmp/build" -j2 > "$log_dir/example-build.log" 2>&1 ||
  fail "building the example failed"
worker_bin=$tmp/build/fm-worker

# Nothing of the build may come from tether's trees: include directories,
# headers read (ninja's depfile records), the library found at run time.
deps=$log_dir/example-deps.txt
ninja -C "$tmp/build" -t deps > "$deps"
for tree in "$repo" "$build_dir"; do
  ! grep -qF -- "$tree" "$tmp/build/compile_commands.json" ||
    fail "the example's compile commands name $tree"
  ! grep -qF -- "$tree" "$deps" || fail "the example read a header from $tree"
done
grep -qF "$prefix/include/tether/worker/client.h" "$deps" ||
  fail "the example did not read the installed worker/client.h"
! grep -qE '/(boost|flatbuffers|openssl)/' "$deps" ||
  fail "the installed headers pull in Boost, FlatBuffers or OpenSSL"
runpath=$(readelf -d "$worker_bin" | grep -E 'RUNPATH|RPATH' || true)
[[ $runpath == *"$prefix/lib"* && $runpath != *"$build_dir"* ]] ||
  fail "fm-worker's run path is not the prefix: $runpath"
note "example built against the prefix only"

# --- 2. A cluster of 2 shards, and 2 example workers -----------------------
# If this script is SIGKILLed (no trap runs), its processes die with it.
die_with_us=()
command -v setpriv > /dev/null && die_with_us=(setpriv --pdeathsig KILL --)
declare -A pid_of
start() {  # start NAME CMD...: run CMD in the background, log to NAME.log
  local name=$1
  shift
  "${die_with_us[@]}" "$@" > "$log_dir/$name.log" 2>&1 &
  pid_of[$name]=$!
  pids+=("$!")
}
# wait_for_line NAME REGEX TIMEOUT_S: until NAME.log has a line matching
# REGEX; fails at once if NAME exits first.
wait_for_line() {
  local name=$1 re=$2 limit=$3 waited=0
  until grep -Eq "$re" "$log_dir/$name.log" 2> /dev/null; do
    kill -0 "${pid_of[$name]}" 2> /dev/null ||
      fail "$name exited while waiting for it to log /$re/"
    (( waited++ < limit * 10 )) || fail "$name did not log /$re/ within $limit s"
    sleep 0.1
  done
}

start shard0 "$server_bin" --shard-id 0 --shards 2 --listen 127.0.0.1:0 \
  --http off --workers 2 --optimizer adam --lr 0.001
wait_for_line shard0 'listening on 127\.0\.0\.1:[0-9]+' 20
coordinator=$(sed -nE 's/.*listening on (127\.0\.0\.1:[0-9]+).*/\1/p' \
  "$log_dir/shard0.log" | head -n 1)
start shard1 "$server_bin" --shard-id 1 --shards 2 --listen 127.0.0.1:0 \
  --coordinator "$coordinator"
wait_for_line shard1 'listening on' 20
wait_for_line shard0 'shard 1 registered' 20
note "shards up; coordinator $coordinator"

t_start=$(now)
for rank in 0 1; do
  start "worker$rank" "$worker_bin" --coordinator "$coordinator" \
    --rank "$rank" --staleness 0 --epochs 1 --batch 64
done

declare -A rc_of
left=2
while (( left > 0 )); do
  for rank in 0 1; do
    [[ -n ${rc_of[$rank]:-} ]] && continue
    p=${pid_of[worker$rank]}
    kill -0 "$p" 2> /dev/null && continue
    if wait "$p"; then rc_of[$rank]=0; else rc_of[$rank]=$?; fi
    left=$((left - 1))
    note "worker $rank exited with status ${rc_of[$rank]}"
  done
  (( left == 0 )) && break
  awk -v t="$(now)" -v s="$t_start" -v d="$deadline_s" \
    'BEGIN { exit !(t - s < d) }' ||
    fail "workers still training after $deadline_s s"
  sleep 0.2
done

for rank in 0 1; do
  [[ ${rc_of[$rank]} -eq 0 ]] ||
    fail "worker $rank exited with status ${rc_of[$rank]}"
  line=$(grep -E "^worker $rank: .*test accuracy" "$log_dir/worker$rank.log" || true)
  [[ -n $line ]] || fail "worker $rank printed no test accuracy"
  echo "$line"
  accuracy=$(sed -nE 's/.*test accuracy ([0-9.]+)%.*/\1/p' <<< "$line")
  awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN { exit !(a > m) }' ||
    fail "worker $rank's test accuracy $accuracy% is not above $min_accuracy%"
done
passed=1
note "PASS: the installed SDK's example trained to above $min_accuracy%"

#!/usr/bin/env bash
# Multi-host test in network namespaces: 2 shards and 3 workers, each on its
# own "host" (a network namespace with its own address), joined by a bridge
# in a "switch" namespace. While training runs, worker 3's cable is pulled
# (its port on the switch goes down) for a few seconds and then plugged back
# in. The cut outlasts shard 0's --worker-timeout-ms, so worker 3 is evicted
# (the others go on without it) and, once its link is back, rejoins. The run
# must finish: every worker exits 0 and rank 0's final line reports a test
# accuracy. The shards listen beyond loopback, so every process is given
# the run's key (--auth-key-file) and proves it in its handshake.
#
#   hosts:  shard 0 10.77.0.1, shard 1 10.77.0.2,
#           workers 10.77.0.11, 10.77.0.12, 10.77.0.13 (worker 3)
#
# Needs root and `ip netns` (Debian package iproute2); otherwise it prints
# "SKIPPED: <reason>" and exits 77 (ctest's SKIP_RETURN_CODE). Exit 0: pass;
# 1: fail, with the tail of every log.
#
# The root namespace is not touched: every link is created inside the test's
# own namespaces (named tth<PID>..., so parallel runs don't collide), and
# deleting the namespaces on exit deletes the links with them.
#
# Environment:
#   TETHER_BIN_DIR      where tether-server and tether-worker are
#                       (default: build/release under the repository root)
#   TETHER_SERVER_BIN, TETHER_WORKER_BIN   override one binary each
#   ARTIFACT_DIR        one log per process, plus events.log (default: a new
#                       /tmp/tether-netns-XXXXXX)
#   TETHER_NETNS_EPOCHS       epochs per worker (default 2)
#   TETHER_NETNS_CUT_AFTER_S  seconds after training starts to cut (1.5)
#   TETHER_NETNS_CUT_S        how long worker 3's link stays down (8; the
#                             workers are evicted after 3 s of silence)
#   TETHER_NETNS_DEADLINE_S   bound on the whole run from the first process
#                             started to the last worker's exit (180)
#   TETHER_NETNS_VERBOSE=1    workers print progress lines (no --quiet)
set -euo pipefail
source "$(dirname "$0")/../support/lib.sh"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin_dir=${TETHER_BIN_DIR:-$repo/build/release}
server_bin=${TETHER_SERVER_BIN:-$bin_dir/tether-server}
worker_bin=${TETHER_WORKER_BIN:-$bin_dir/tether-worker}
epochs=${TETHER_NETNS_EPOCHS:-2}
cut_after_s=${TETHER_NETNS_CUT_AFTER_S:-1.5}
cut_s=${TETHER_NETNS_CUT_S:-8}
deadline_s=${TETHER_NETNS_DEADLINE_S:-180}
verbose=${TETHER_NETNS_VERBOSE:-0}

# --- 1. Can this machine run it? -------------------------------------------
need_netns tth

for b in "$server_bin" "$worker_bin"; do
  [[ -x "$b" ]] || { echo "FAIL: $b is missing or not executable (build first, or set TETHER_BIN_DIR)"; exit 1; }
done

log_dir=${ARTIFACT_DIR:-$(mktemp -d /tmp/tether-netns-XXXXXX)}
mkdir -p "$log_dir"
events="$log_dir/events.log"
: > "$events"

t0=$(date +%s.%N)
now() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }'; }
note() { echo "[$(now) s] $*" | tee -a "$events"; }

# Namespaces left behind by an earlier run that was killed (SIGKILL gives no
# chance to clean up): delete those whose PID is gone. Only names this script
# makes; a name whose PID is alive belongs to a run still going.
while read -r name _; do
  if [[ $name =~ ^tth([0-9]+)(br|s[01]|w[1-3]|probe)$ ]] &&
     ! kill -0 "${BASH_REMATCH[1]}" 2> /dev/null; then
    ip netns del "$name" 2> /dev/null || true
  fi
done < <(ip netns list 2> /dev/null)

# --- 2. The network ----------------------------------------------------------
sw="tth$$br"
hosts=(s0 s1 w1 w2 w3)
declare -A addr=([s0]=10.77.0.1 [s1]=10.77.0.2
                 [w1]=10.77.0.11 [w2]=10.77.0.12 [w3]=10.77.0.13)
made_ns=()
pids=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_pids "${pids[@]}"
  netns_teardown
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ns_of() { echo "tth$$$1"; }
# A sleep that a signal cuts short (bash runs traps only between commands).
nap() { sleep "$1" & wait $!; }

netns_switch "$sw"
for h in "${hosts[@]}"; do
  # eth0 in the host, port "$h" on the switch.
  netns_host "$(ns_of "$h")" "$sw" "$h" "${addr[$h]}"
done
note "network up: switch $sw, hosts $(for h in "${hosts[@]}"; do printf '%s=%s ' "$(ns_of "$h")" "${addr[$h]}"; done)"

# --- 3. The cluster ----------------------------------------------------------
# If this script is SIGKILLed (no trap runs), its processes die with it:
# setpriv (util-linux) sets their parent-death signal.
die_with_us=()
command -v setpriv > /dev/null && die_with_us=(setpriv --pdeathsig KILL --)
declare -A pid_of
start() {  # start NAME HOST CMD...: run CMD in HOST's namespace, log to NAME.log
  local name=$1 host=$2
  shift 2
  # ip netns exec and setpriv exec, so $! is the process itself.
  ip netns exec "$(ns_of "$host")" "${die_with_us[@]}" "$@" \
    > "$log_dir/$name.log" 2>&1 &
  pid_of[$name]=$!
  pids+=("$!")
}

dump_logs() { tail_logs "$log_dir"/*.log; }

# wait_for_line NAME REGEX TIMEOUT_S [OTHER...]: until NAME.log has a line
# matching REGEX; fails at once if NAME or any OTHER process exits first.
wait_for_line() {
  local name=$1 re=$2 limit=$3 waited=0 other
  shift 3
  until grep -Eq "$re" "$log_dir/$name.log" 2> /dev/null; do
    for other in "$name" "$@"; do
      kill -0 "${pid_of[$other]}" 2> /dev/null ||
        fail "$other exited while waiting for $name to log /$re/"
    done
    (( waited++ < limit * 10 )) || fail "$name did not log /$re/ within $limit s"
    sleep 0.1
  done
}

# The shards listen beyond loopback, so every process proves the run's key.
key_file="$log_dir/run.key"
(umask 077 && head -c 32 /dev/urandom | base64 > "$key_file")
key=(--auth-key-file "$key_file")

start shard0 s0 "$server_bin" --shard-id 0 --shards 2 --listen 10.77.0.1:7070 \
  --http off --workers 3 --max-staleness 2 --optimizer adam --lr 0.001 \
  --worker-timeout-ms 3000 --heartbeat-ms 500 "${key[@]}"
wait_for_line shard0 'listening on 10\.77\.0\.1:7070' 20
wait_for_line shard0 'authentication: every peer proves the key' 1
start shard1 s1 "$server_bin" --shard-id 1 --shards 2 --listen 10.77.0.2:7070 \
  --coordinator 10.77.0.1:7070 "${key[@]}"
wait_for_line shard1 'listening on 10\.77\.0\.2:7070' 20 shard0
wait_for_line shard0 'shard 1 registered' 20 shard1
note "shards up: shard 0 on 10.77.0.1:7070, shard 1 on 10.77.0.2:7070"

quiet=(--quiet)
[[ $verbose == 1 ]] && quiet=()
for i in 1 2 3; do
  start "worker$i" "w$i" "$worker_bin" --coordinator 10.77.0.1:7070 \
    --staleness 2 --model mlp --epochs "$epochs" "${quiet[@]}" "${key[@]}"
done
wait_for_line shard0 'all 3 workers joined; training starts' 60 \
  shard1 worker1 worker2 worker3
t_train=$(now)
w3_rank=$(sed -nE 's/.*worker ([0-9]+) joined from 10\.77\.0\.13:.*/\1/p' "$log_dir/shard0.log" | head -n 1)
note "all 3 workers joined; worker 3 (10.77.0.13) is rank ${w3_rank:-?}"

# --- 4. Pull worker 3's cable mid-run ---------------------------------------
nap "$cut_after_s"
for i in 1 2 3; do
  kill -0 "${pid_of[worker$i]}" 2> /dev/null ||
    fail "worker $i had already exited when the link was to be cut: not mid-run (lower TETHER_NETNS_CUT_AFTER_S)"
done
t_cut=$(now)
ip -n "$sw" link set w3 down
note "worker 3's link down (port w3 on the switch)"
nap "$cut_s"
ip -n "$sw" link set w3 up
note "worker 3's link up again after $cut_s s"
grep -q "worker ${w3_rank:-X} evicted: silent" "$log_dir/shard0.log" ||
  fail "worker 3 (rank ${w3_rank:-?}) was not evicted during a $cut_s s cut"
note "worker 3 was evicted while cut off"
# TCP retransmits with backoff, so its first bytes may take a while.
wait_for_line shard0 "worker ${w3_rank} is back after its eviction" 60 \
  shard1 worker3
note "worker 3 rejoined"

# --- 5. Every worker must finish --------------------------------------------
declare -A rc_of
left=3
while (( left > 0 )); do
  for i in 1 2 3; do
    [[ -n ${rc_of[$i]:-} ]] && continue
    p=${pid_of[worker$i]}
    if ! kill -0 "$p" 2> /dev/null; then
      if wait "$p"; then rc_of[$i]=0; else rc_of[$i]=$?; fi
      left=$((left - 1))
      note "worker $i exited with status ${rc_of[$i]}"
    fi
  done
  (( left == 0 )) && break
  awk -v t="$(now)" -v d="$deadline_s" 'BEGIN { exit !(t < d) }' ||
    fail "workers still running after $deadline_s s (statuses so far: w1=${rc_of[1]:-running} w2=${rc_of[2]:-running} w3=${rc_of[3]:-running})"
  sleep 0.2
done
t_end=$(now)

for i in 1 2 3; do
  [[ ${rc_of[$i]} -eq 0 ]] || fail "worker $i exited with status ${rc_of[$i]}"
done
rank0_line=$(tail -q -n 1 "$log_dir"/worker[123].log | grep -E '^worker 0: ' | head -n 1 || true)
[[ -n $rank0_line ]] || fail "no worker log ends with rank 0's final line"
acc=$(sed -nE 's/.* test accuracy ([0-9.]+)%.*/\1/p' <<< "$rank0_line")
[[ -n $acc ]] || fail "rank 0's final line reports no test accuracy: $rank0_line"
done_in=$(for i in 1 2 3; do sed -nE 's/.*\(done in ([0-9.]+) s\).*/\1/p' "$log_dir/worker$i.log" | tail -n 1; done | paste -sd/)

summary="PASS: rank 0 test accuracy ${acc}%; 3/3 workers exited 0; worker 3 (rank ${w3_rank:-?}) cut off for ${cut_s} s at $t_cut s; training ${t_train}..${t_end} s (workers done in ${done_in} s); total ${t_end} s; logs in $log_dir"
note "$summary" > /dev/null
echo "$summary"

# Shared by the benchmark scripts in tools/bench/ (source it):
#   bench_setup              a work dir in $work, removed on exit with every
#                            process whose pid is added to pids
#   shard_address READY LOG PID
#                            waits for the --ready-file READY of the
#                            tether-server PID (logging to LOG) and prints
#                            the HOST:PORT workers dial; fails the script,
#                            with the end of LOG, when the shard exits first
#                            or is not ready after 10 s
#   two_shards NAME [FLAGS...]
#                            starts a 2-shard cluster (no dashboard, no
#                            workers awaited) with FLAGS given to both
#                            shards, logs in $work/NAME-s*.log; sets
#                            address to shard 0's. Call it directly, not in
#                            $(...): the shards' pids must reach the trap
#   access_bench TITLE WITH WITHOUT FLAG...
#                            what FLAG... (given to every shard and client)
#                            costs: two 2-shard clusters, one with them and
#                            one without; an observer's connect + handshake
#                            (tether-bench-connect, TIMES, default 100) and
#                            push+pull goodput of FLOATS floats
#                            (tether-bench-pushpull, ROUNDS, default 5), each
#                            REPEAT (3) times; prints one line of medians and
#                            ratios, TITLE first
#   median V...              the median of the values
#   worker_epoch NAME OPTIMIZER FLAG...
#                            one epoch by one tether-worker (FLAG... its
#                            model, batch, bound, ...) against a fresh
#                            shard on loopback (OPTIMIZER, lr 0.001; log
#                            $work/NAME.log), the shard stopped after;
#                            prints "SAMPLES/S ACCURACY" (ACCURACY the test
#                            accuracy in %, or - without a test set)
#   compute_only FLAG...     the same binary's --compute-only samples/s for
#                            one epoch (FLAG...: model, batch, threads)
bench_setup() {
  work=$(mktemp -d /tmp/tether-bench-XXXXXX)
  pids=()
  trap 'kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true; rm -rf "$work"' EXIT
}

shard_address() {
  local ready=$1 log=$2 pid=$3
  for _ in $(seq 200); do
    # Written whole (by rename), with the pid of the shard that wrote it.
    if grep -qs "\"pid\":$pid[,}]" "$ready"; then
      sed -n 's/.*"advertise":"\([^"]*\)".*/\1/p' "$ready"
      return
    fi
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.05
  done
  echo "tether-server (pid $pid) did not start: no $ready; the end of $log:" >&2
  tail -20 "$log" >&2
  exit 1
}

worker_epoch() {
  local name=$1 optimizer=$2
  shift 2
  "$build/tether-server" --listen 127.0.0.1:0 --http off --workers 1 --optimizer "$optimizer" --lr 0.001 \
    --ready-file "$work/$name.ready" > "$work/$name.log" 2>&1 &
  local shard=$! addr line failed=0
  addr=$(shard_address "$work/$name.ready" "$work/$name.log" "$shard")
  line=$("$build/tether-worker" --coordinator "$addr" --epochs 1 --eval-every 0 --quiet "$@") || failed=$?
  kill "$shard" 2> /dev/null || true
  wait "$shard" 2> /dev/null || true
  if ((failed)); then
    echo "tether-worker $* failed (exit $failed); its shard's log: $work/$name.log" >&2
    return "$failed"
  fi
  awk '{
    acc = match($0, /test accuracy [0-9.]+%/) ? substr($0, RSTART + 14, RLENGTH - 15) : "-"
    if (match($0, /done in [0-9.]+ s/)) printf "%.0f %s\n", 60000 / substr($0, RSTART + 8, RLENGTH - 10), acc
  }' <<< "$line"
}

compute_only() {
  "$build/tether-worker" --compute-only --epochs 1 "$@" | awk '/^compute-only/ {print $3}'
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

two_shards() {
  local name=$1
  shift
  "$build/tether-server" --shard-id 0 --shards 2 --listen 127.0.0.1:0 --http off --workers 0 "$@" \
    --ready-file "$work/$name-s0.ready" > "$work/$name-s0.log" 2>&1 &
  pids+=($!)
  local s0
  s0=$(shard_address "$work/$name-s0.ready" "$work/$name-s0.log" "${pids[-1]}")
  "$build/tether-server" --shard-id 1 --shards 2 --listen 127.0.0.1:0 --coordinator "$s0" "$@" \
    --ready-file "$work/$name-s1.ready" > "$work/$name-s1.log" 2>&1 &
  pids+=($!)
  shard_address "$work/$name-s1.ready" "$work/$name-s1.log" "${pids[-1]}" > /dev/null
  address=$s0
}

access_bench() {
  local title=$1 with=$2 without=$3
  shift 3
  local flags=("$@")
  two_shards plain
  local plain=$address
  two_shards guarded "${flags[@]}"
  local guarded=$address
  connect() { "$build/tether-bench-connect" --coordinator "$1" --times "${TIMES:-100}" "${@:2}" | awk '{print $3}'; }
  goodput() { "$build/tether-bench-pushpull" --coordinator "$1" --floats "${FLOATS:-16777216}" --rounds "${ROUNDS:-5}" "${@:2}" | awk '{print $3}'; }
  local c_plain=() c_with=() g_plain=() g_with=() i
  for i in $(seq "${REPEAT:-3}"); do
    c_plain+=("$(connect "$plain")")
    c_with+=("$(connect "$guarded" "${flags[@]}")")
    g_plain+=("$(goodput "$plain")")
    g_with+=("$(goodput "$guarded" "${flags[@]}")")
    printf '\r  run %d: connect %s vs %s ms, push+pull %s vs %s GB/s' "$i" \
      "${c_with[-1]}" "${c_plain[-1]}" "${g_with[-1]}" "${g_plain[-1]}" >&2
  done
  printf '\r\033[K' >&2
  awk -v ck="$(median "${c_with[@]}")" -v co="$(median "${c_plain[@]}")" \
      -v gk="$(median "${g_with[@]}")" -v go="$(median "${g_plain[@]}")" \
      -v n="${#c_plain[@]}" -v t="$title" -v w="$with" -v wo="$without" 'BEGIN {
    printf "%s: connect %.2f ms %s | %.2f ms %s | ratio %.2f; push+pull %.2f GB/s %s | %.2f GB/s %s | ratio %.2f (medians of %d)\n", t, ck, w, co, wo, ck / co, gk, w, go, wo, gk / go, n }'
}

# Shared by the benchmark scripts in tools/bench/ (source it):
#   bench_setup              a work dir in $work, removed on exit with every
#                            process whose pid is added to pids
#   shard_address READY LOG PID
#                            waits for the --ready-file READY of the
#                            tether-server PID (logging to LOG) and prints
#                            the HOST:PORT workers dial; fails the script,
#                            with the end of LOG, when the shard exits first
#                            or is not ready after 10 s
#   median V...              the median of the values
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

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

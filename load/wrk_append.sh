#!/usr/bin/env bash
# Appends to one session under `wrk` (the side-by-side benchmark's `tl_append.lua`), with
# what the load costs the server, for before/after comparisons of the append path:
#
#   load/wrk_append.sh [--rounds N] [--duration 10s] [--connections 16] BIN [BIN...]
#
# Each round starts each BIN in turn (`BIN serve`, port 0, a fresh temp data dir), makes a
# session and drives it for the duration; binaries alternate so that drift on a shared
# machine falls on all of them. One line per run: appends/s and ack p50 / p99 (wrk's), the
# server's CPU per 1,000 events it stored (user + system from /proc, events from /metrics),
# events per commit and the mean flush (the writer's `write` + `fdatasync`, from /metrics).
# Needs `wrk` (Debian's package) and the peer benchmark's `tl_append.lua` in ../shared/bench
# (TL_APPEND_LUA to point elsewhere).
set -euo pipefail
cd "$(dirname "$0")"

rounds=1 duration=10s connections=16
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--rounds N] [--duration 10s] [--connections 16] BIN [BIN...]" >&2; exit 2; }
lua=${TL_APPEND_LUA:-../../shared/bench/tl_append.lua}
[ -f "$lua" ] || { echo "no $lua: set TL_APPEND_LUA to the peer benchmark's tl_append.lua" >&2; exit 2; }
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install -y wrk" >&2; exit 2; }
ticks=$(getconf CLK_TCK)
# The server of the run under way, stopped and its data dir removed however the script ends.
pid='' dir=''
trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi; if [ -n "$dir" ]; then rm -rf "$dir"; fi' EXIT

run() {
  local bin=$1 addr session
  dir=$(mktemp -d)
  "$bin" serve --addr 127.0.0.1:0 --data-dir "$dir/data" >"$dir/out" 2>"$dir/log" &
  pid=$!
  for _ in $(seq 100); do
    addr=$(sed -n 's#^listening on http://##p' "$dir/out")
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "$bin did not start" >&2; exit 1; }
  session=$(curl -sf -X POST -H 'content-type: application/json' -d '{"agent":{"name":"default"}}' \
    "http://$addr/sessions" | sed -n 's/.*"sessionId":"\([^"]*\)".*/\1/p')
  [ -n "$session" ] || { echo "$bin: could not create a session" >&2; exit 1; }
  local before after out metrics
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  out=$(wrk -t1 -c"$connections" -d"$duration" -s "$lua" "http://$addr/sessions/$session/events")
  after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  metrics=$(curl -sf "http://$addr/metrics")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  pid='' dir=''
  # tl_append.lua's summary line: appends/s=N p50_ms=X p99_ms=Y non2xx=N socket_errors=N
  local line
  line=$(grep '^appends/s=' <<<"$out")
  awk -v bin="$bin" -v line="$line" -v cpu=$((after - before)) -v hz="$ticks" '
    /^turnlog_writer_batch_events_sum / { events = $2 }
    /^turnlog_writer_batch_events_count / { commits = $2 }
    /^turnlog_writer_fsync_seconds_sum / { flush = $2 }
    /^turnlog_writer_fsync_seconds_count / { flushes = $2 }
    END {
      printf "%s  %s  cpu_ms_per_1k=%.1f  events_per_commit=%.2f  flush_mean_us=%.0f\n", bin, line,
        events ? (cpu * 1000 / hz) / (events / 1000) : 0, commits ? events / commits : 0,
        flushes ? flush * 1e6 / flushes : 0
    }' <<<"$metrics"
}

for _ in $(seq "$rounds"); do
  for bin in "$@"; do run "$bin"; done
done

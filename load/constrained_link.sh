#!/usr/bin/env bash
# Catch-up on a constrained link: turnlog and the Durable Streams peer, each on a fresh data
# dir, inside a network namespace whose loopback is rate-limited with `tc` `tbf`; the same
# client (load/link/catchup.mjs) reads a seeded 2,000-event log from each, 100 readers at
# once, by GET pages and over SSE, with each Accept-Encoding in turn. Servers run as they
# come (their defaults). Prints one JSON line per run, plus the server's CPU seconds.
#
# Needs root (ip netns, tc). The namespace, the servers and their data dirs go on exit.
#
#   sudo load/constrained_link.sh TL_BIN DS_BIN
#   RATE=50mbit READERS=100 MODES="get sse" ENCODINGS="identity gzip br" REPS=1 \
#     BENCH=../shared/bench TL_CONFIG=streams.toml sudo -E load/constrained_link.sh \
#     target/release/turnlog /tmp/dse/bin/durable-streams-server
#
# TL_CONFIG names a TOML file turnlog reads over its defaults: SSE streams are compressed
# only with `[server] compress_streams = ["gzip"]` (or "zstd") in one.
#
# The namespace's loopback gets an MTU of 1,500 (a real link's, not loopback's 64 KiB) and a
# token bucket of RATE with a 64 KiB burst; both directions share it. This kernel has no
# `netem`, so no latency is added.
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "run as root: ip netns and tc need it" >&2; exit 2; }
[ $# -ge 2 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
TL_BIN=$(realpath "$1")
DS_BIN=$(realpath "$2")
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$(realpath "${BENCH:-$HERE/../../shared/bench}")
RATE=${RATE:-50mbit}
READERS=${READERS:-100}
MODES=${MODES:-get sse}
ENCODINGS=${ENCODINGS:-identity gzip br}
REPS=${REPS:-1}
PORT=4540
TL_CONFIG=${TL_CONFIG:+$(realpath "$TL_CONFIG")}

ns="turnlog-link-$$"
work=$(mktemp -d)
pid=""
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  [ -z "$pid" ] || wait "$pid" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns"
in_ns() { ip netns exec "$ns" "$@"; }
in_ns ip link set lo mtu 1500
in_ns ip link set lo up
in_ns tc qdisc add dev lo root tbf rate "$RATE" burst 64kb latency 100ms
echo "# namespace $ns: lo mtu 1500, $(in_ns tc qdisc show dev lo)"
echo "# turnlog: $TL_BIN ($("$TL_BIN" --version 2>/dev/null || echo '?'))${TL_CONFIG:+ with $TL_CONFIG}; peer: $DS_BIN"

cpu_s() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }

start() { # $1 tl|ds, $2 data dir
  # (`ip netns exec` execs the server: $! is the server's pid, for its CPU and to stop it.)
  if [ "$1" = tl ]; then
    ip netns exec "$ns" "$TL_BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$2" ${TL_CONFIG:+--config "$TL_CONFIG"} \
      >"$2.log" 2>&1 &
  else
    ip netns exec "$ns" "$DS_BIN" --host 127.0.0.1 --port "$PORT" --data-dir "$2" >"$2.log" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    in_ns bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "the $1 server did not start:" >&2
  cat "$2.log" >&2
  exit 1
}

stop() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}

for rep in $(seq "$REPS"); do
  for server in ds tl; do
    dir="$work/$server.$rep"
    start "$server" "$dir"
    protocol=$([ "$server" = tl ] && echo turnlog || echo ds)
    in_ns node "$BENCH/catchup_seed.mjs" "$protocol" "$PORT" >"$dir.pages"
    for mode in $MODES; do
      for encoding in $ENCODINGS; do
        before=$(cpu_s "$pid")
        result=$(in_ns node "$HERE/link/catchup.mjs" --protocol "$protocol" --port "$PORT" --pages "$dir.pages" \
          --mode "$mode" --encoding "$encoding" --readers "$READERS") || { echo "$result"; exit 1; }
        echo "${result%\}},\"rate\":\"$RATE\",\"rep\":$rep,\"server_cpu_s\":$(awk -v a="$before" -v b="$(cpu_s "$pid")" 'BEGIN { printf "%.2f", b - a }')}"
      done
    done
    stop
  done
done

#!/usr/bin/env bash
# What forwarding costs a cluster, and what a load balancer that keeps each session on one
# node saves (docs/cluster.md, "Behind a load balancer"):
#
#   load/cluster_lb.sh [--duration 10] BIN MODE [MODE...]     MODE: hash | rr | direct
#
# For each MODE: three nats-servers (streams with three replicas, `scripts/nats-cluster`),
# three turnlog nodes (BIN) on 127.0.0.1:8787-8789 with fresh data dirs, and, but for
# `direct`, nginx on :8790 in front of them: `hash` keeps each session on one node (the
# docs' configuration), `rr` spreads requests round robin. Then `turnlog-load append`
# (16 writers on 16 sessions; target/release/turnlog-load, built first if missing) through
# nginx, or straight to the first node for `direct`. One line per mode: appends/s, the three
# nodes' CPU per 1,000 appends (user + system from /proc), and the forwarding metrics.
# Everything runs on this machine, the nats-servers too: a cluster of machines does better.
# Needs nginx and nats-server (Debian's packages). Loopback only; everything it starts is
# stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=10
[ "${1:-}" = --duration ] && { duration=$2; shift 2; }
[ $# -ge 2 ] || { echo "usage: $0 [--duration SECONDS] BIN hash|rr|direct..." >&2; exit 2; }
bin=$(realpath "$1")
shift
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "nginx is missing: apt-get install -y nginx" >&2; exit 2; }
export PATH="$PATH:/usr/sbin"
[ -x target/release/turnlog-load ] || cargo build --release -p turnlog-load
work=$(mktemp -d)
pids=()
stop() {
  [ ! -f "$work/nginx.pid" ] || nginx -s stop -c "$work/nginx.conf" -p "$work" 2>/dev/null || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pkill -f "$work/nats/n" 2>/dev/null || true
  pids=()
}
trap 'stop; rm -rf "$work"' EXIT INT TERM

cpu() { # user + system ticks of the three nodes
  local ticks=0
  for pid in "${pids[@]}"; do ticks=$((ticks + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}'))); done
  echo "$ticks"
}

if ss -ltn | grep -qE '127.0.0.1:(878[789]|8790|2422[234]) '; then
  echo "ports 8787-8790 or 24222-24224 are taken: stop what listens there first" >&2
  exit 2
fi
for mode in "$@"; do
  rm -rf "$work/nats" "$work/data" && mkdir -p "$work/data"
  servers=$(scripts/nats-cluster 3 "$work/nats" 24222 | sed -n 's/^servers = //p')
  for n in 0 1 2; do
    printf '[store]\nbackend = "jetstream"\n[store.jetstream]\nservers = %s\nreplicas = 3\nnode = "n%s"\n' \
      "$servers" "$n" >"$work/n$n.toml"
    "$bin" --config "$work/n$n.toml" --addr "127.0.0.1:878$((7 + n))" --data-dir "$work/data/n$n" \
      >"$work/data/n$n.log" 2>&1 &
    pids+=($!)
  done
  for port in 8787 8788 8789; do
    for _ in $(seq 150); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null || { tail -n 20 "$work"/data/n*.log; exit 1; }
  done
  url=http://127.0.0.1:8787
  if [ "$mode" != direct ]; then
    balance="hash \$turnlog_session consistent;"
    [ "$mode" = rr ] && balance=""
    cat >"$work/nginx.conf" <<NGINX
pid $work/nginx.pid;
error_log $work/nginx.log;
worker_processes 1;
events { worker_connections 4096; }
http {
  access_log off;
  map \$uri \$turnlog_session { ~/sessions/(?<id>[^/]+) \$id; default \$request_id; }
  upstream turnlog { $balance server 127.0.0.1:8787; server 127.0.0.1:8788; server 127.0.0.1:8789; keepalive 64; }
  server {
    listen 127.0.0.1:8790;
    location / { proxy_pass http://turnlog; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
}
NGINX
    nginx -c "$work/nginx.conf" -p "$work"
    url=http://127.0.0.1:8790
  fi
  before=$(cpu)
  out=$(target/release/turnlog-load --quiet --no-build append --url "$url" --duration "$duration" --no-baseline)
  after=$(cpu)
  rate=$(grep 'durable appends' <<<"$out" | grep -oE '[0-9,.]+ events/s' | tr -d ',' | grep -oE '^[0-9.]+')
  p99=$(grep 'ack latency p99' <<<"$out" | grep -oE '[0-9.]+ ms' | head -n 1)
  ticks_hz=$(getconf CLK_TCK)
  per=$(python3 -c "print(round(($after - $before) / $ticks_hz * 1000 / ($rate * $duration) * 1000, 1))")
  metrics=""
  for port in 8787 8788 8789; do
    metrics+=$(curl -s "http://127.0.0.1:$port/metrics" |
      awk '/^turnlog_forwarded_total\{way="sent"\}/{s=$2} /^turnlog_lease_changes_total\{change="handed_over"\}/{h=$2}
           END{printf " %s", (s ? s : 0) "/" (h ? h : 0)}')
  done
  echo "$mode: $rate appends/s, ack p99 $p99, the nodes' CPU $per ms per 1,000 appends; forwarded/handed over per node:$metrics"
  stop
done

#!/usr/bin/env bash
# Cost growth for docs/performance.md: kadmit (seed profile) pinned to CPU 0,
# `kadmit bench` pinned to CPU 1, against object size (1 KB..1 MB),
# concurrency (1..256), then a bounded 60 s soak sampling VmRSS.
# Usage: bench/sweep.sh [bin/kadmit] [seconds per point, default 3]
set -euo pipefail
KADMIT=${1:-bin/kadmit}
SECS=${2:-3}
WORK=$(mktemp -d)
PIN0=() PIN1=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then PIN0=(taskset -c 0) PIN1=(taskset -c 1); fi
"${PIN0[@]}" "$KADMIT" serve --self-signed --dns-name 127.0.0.1 --ca-file "$WORK/ca.crt" \
  --addr 127.0.0.1:19453 --metrics-addr 127.0.0.1:18090 2>"$WORK/kadmit.log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do [ -s "$WORK/ca.crt" ] && break; sleep 0.1; done
sleep 0.5
rss() { awk '/^VmRSS/ {print $2}' /proc/$PID/status; }
# bench PATH CONC SECONDS [MANIFEST] -> "req/s p50 p99"
bench() {
  local extra=()
  [ -n "${4:-}" ] && extra=(-f "$4")
  "${PIN1[@]}" "$KADMIT" bench --url "https://127.0.0.1:19453$1" --cacert "$WORK/ca.crt" -c "$2" -d "$3s" -o json "${extra[@]}" |
    sed -E 's/.*"throughput_rps":([0-9.]+).*"p50":([0-9.]+).*"p99":([0-9.]+),.*/\1 \2 \3/' |
    awk '{printf "%8.0f req/s  p50 %7.2f ms  p99 %7.2f ms", $1, $2, $3}'
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); idle VmRSS $(rss) kB"
bench /mutate-pod 64 2 >/dev/null # warm-up
echo "== object size (pod with a padding annotation), -c 64"
for size in 1024 10240 102400 1048576; do
  pad=$((size - 120))
  printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"d","annotations":{"pad":"%s"}},"spec":{"containers":[{"name":"c","image":"i"}]}}' \
    "$(head -c "$pad" /dev/zero | tr '\0' x)" >"$WORK/pod-$size.json"
  printf '%8s B  validate %s\n' "$size" "$(bench /validate-pod 64 "$SECS" "$WORK/pod-$size.json")"
  printf '%8s B  mutate   %s\n' "$size" "$(bench /mutate-pod 64 "$SECS" "$WORK/pod-$size.json")"
done
echo "== concurrency, default 4.6 KB pod, /mutate-pod"
for c in 1 16 64 256; do
  printf '  -c %-4s %s\n' "$c" "$(bench /mutate-pod "$c" "$SECS")"
done
echo "== 60 s soak, /mutate-pod -c 64, VmRSS every 10 s (kB)"
bench /mutate-pod 64 60 >"$WORK/soak.txt" &
BP=$!
samples=()
for _ in 1 2 3 4 5 6; do sleep 10; samples+=("$(rss)"); done
wait $BP
echo "  $(cat "$WORK/soak.txt")"
echo "  VmRSS: ${samples[*]}; after: $(sleep 2; rss)"

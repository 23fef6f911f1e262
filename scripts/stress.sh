#!/usr/bin/env bash
# Runs the engine, publishing and consuming suites again and again while
# every core is kept busy, to shake out races, lost wakeups and waits with
# no deadline. Not part of CI.
#
#   scripts/stress.sh [RUNS] [SUITE...]     RUNS defaults to 30, SUITEs to
#                                           engine publishing consuming
#
# Each run of a suite is one execution of its test binary with a time limit
# (ACEMQ_STRESS_LIMIT seconds, default 300). A run that exits non-zero is a
# failure; one that reaches the limit is a hang. The output of every failed
# or hung run is kept under target/stress/. The summary line at the end
# gives runs, failures and hangs per suite; the exit code is non-zero if
# there was any failure or hang.
#
# RabbitMQ is started (and stopped again at the end) as scripts/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${1:-30}"
shift || true
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(engine publishing consuming)
limit="${ACEMQ_STRESS_LIMIT:-300}"
out_dir=target/stress
mkdir -p "$out_dir"

started_here=0
if ! scripts/rabbitmq.sh status >/dev/null 2>&1; then
    scripts/rabbitmq.sh start
    started_here=1
fi
burners=()
cleanup() {
    for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [ "$started_here" = 1 ]; then scripts/rabbitmq.sh stop || true; fi
}
trap cleanup EXIT
eval "$(scripts/rabbitmq.sh env | sed 's/^/export /')"
export CI=true

# Build once; run copies of the binaries, so that no run pays for cargo and
# a rebuild during the runs changes nothing.
declare -A binary
mkdir -p "$out_dir/bin"
for suite in "${suites[@]}"; do
    json=$(cargo test -p acemq-tests --test "$suite" --no-run --message-format=json) \
        || { echo "stress.sh: building suite $suite failed" >&2; exit 1; }
    exe=$(grep -o '"executable":"[^"]*"' <<<"$json" | tail -n 1 | cut -d'"' -f4 || true)
    [ -x "$exe" ] || { echo "stress.sh: no test binary for suite $suite" >&2; exit 1; }
    cp "$exe" "$out_dir/bin/$suite"
    binary[$suite]="$out_dir/bin/$suite"
done

# Keep every core busy for as long as the runs take.
for _ in $(seq 1 "$(nproc)"); do
    (while :; do :; done) &
    burners+=($!)
done

declare -A failures hangs
for suite in "${suites[@]}"; do failures[$suite]=0; hangs[$suite]=0; done
t0=$(date +%s)
for i in $(seq 1 "$runs"); do
    for suite in "${suites[@]}"; do
        log="$out_dir/$suite.$i.log"
        set +e
        timeout --kill-after=10 "$limit" "${binary[$suite]}" >"$log" 2>&1
        rc=$?
        set -e
        # A run stopped in the middle of a memory-alarm test (the blocked
        # suite sets the watermark to 0) would leave the broker blocking
        # every publisher for the runs after it: lift the alarm.
        if [ "$rc" != 0 ]; then
            scripts/rabbitmq.sh ctl set_vm_memory_high_watermark 0.4 >/dev/null 2>&1 || true
        fi
        if [ "$rc" = 0 ]; then
            rm -f "$log"
        elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            hangs[$suite]=$((hangs[$suite] + 1))
            echo "run $i: $suite HUNG (over ${limit}s), output in $log"
        else
            failures[$suite]=$((failures[$suite] + 1))
            echo "run $i: $suite FAILED (exit $rc), output in $log"
            grep -E '^test .* FAILED$|panicked at' "$log" | head -n 5 || true
        fi
    done
    echo "run $i/$runs done ($(( $(date +%s) - t0 ))s)"
done

total_fail=0 total_hang=0
for suite in "${suites[@]}"; do
    echo "stress: $suite: $runs runs, ${failures[$suite]} failures, ${hangs[$suite]} hangs"
    total_fail=$((total_fail + failures[$suite]))
    total_hang=$((total_hang + hangs[$suite]))
done
echo "stress: total: $((runs * ${#suites[@]})) runs, $total_fail failures, $total_hang hangs, $(( $(date +%s) - t0 ))s, $(nproc) cores kept busy"
[ "$total_fail" = 0 ] && [ "$total_hang" = 0 ]

#!/usr/bin/env bash
# The project's test command. It sets up everything the tests need, so a
# green run never depends on something done by hand: it installs Debian's
# rabbitmq-server when missing, starts a private RabbitMQ 3.10 node and a
# private three-node cluster (scripts/rabbitmq.sh), a private RabbitMQ 4.0
# node (scripts/rabbitmq.sh 4.0; Debian trixie's rabbitmq-server, installed
# with debootstrap into target/trixie-root on first use), installs Debian's
# postgresql when missing and starts a private cluster for the outbox
# (scripts/postgres.sh), runs every test of the workspace against them, and
# stops them again unless they were already running before.
#
# Which suites run on which RabbitMQ: every suite of tests/ runs against
# acemq-memory and RabbitMQ 3.10 and 4.0 over TCP (the harness's
# `brokers()`). TLS, acemq's own layer (rustls) and the same whatever runs
# above it, runs in the engine suite (tests/tests/engine.rs, verification
# included) and the chaos harness on both versions (`all_brokers()`), and
# over 3.10 in the scenarios where TLS changes what happens
# (`brokers_with_tls()`): a lost connection redialled with a new handshake,
# a publisher held back while the broker's TLS listener goes on reading,
# and the scheduler. Every suite over TLS as well did not fit CI's 25
# minutes on a 2-core machine: on a quiet machine the suites took 700 s
# with acemq-memory and 3.10 over TCP and TLS, and 418 s with acemq-memory
# and 4.0 over TCP, so a TLS pass costs about as much as a broker version.
# Suites pick fewer where they say so: the failover test runs on the 3.10
# cluster only, the outbox load test against 3.10 over TCP only, and the
# recovery and hops suites' broker-breaking tests over TCP only.
#
# Two lanes. The suites that break a node on purpose (kill, restart, pause,
# a memory alarm, forced closes of every connection, a node-wide consumer
# timeout), and a few long ones to even the lanes out, run on a second pair
# of nodes of their own (scripts/rabbitmq.sh with ACEMQ_RABBITMQ_INSTANCE=1:
# ports 5682/5681 and 5684/5685), beside everything else on the first pair.
# Each lane runs its suites one binary after another, as `cargo test` does.
# In one lane the suites took about 15 minutes of CI's 25 on a 2-core
# machine, after a cold build of about 10; in two, about 9 each.
set -euo pipefail
cd "$(dirname "$0")/.."

# The second lane's suites (tests/tests/NAME.rs).
LANE2="blocked cancelled chaos_harness differential failover hops model recovery recovery_load scheduler stalled"

# Runs a command for the second pair of nodes: the instance, and none of
# the variables that pin the first pair's (ports, names, directories).
lane2() {
    env -u ACEMQ_RABBITMQ_PORT -u ACEMQ_RABBITMQ_TLS_PORT -u ACEMQ_RABBITMQ_DIST_PORT \
        -u ACEMQ_RABBITMQ_NODENAME -u ACEMQ_RABBITMQ_DIR \
        -u ACEMQ_RABBITMQ4_PORT -u ACEMQ_RABBITMQ4_TLS_PORT -u ACEMQ_RABBITMQ4_DIST_PORT \
        -u ACEMQ_RABBITMQ4_NODENAME -u ACEMQ_RABBITMQ4_DIR \
        ACEMQ_RABBITMQ_INSTANCE=1 "$@"
}

started_here=0
started4_here=0
lane2_here=0
cluster_here=0
postgres_here=0
lane2_pid=""
stop_node() {
    if [ -n "$lane2_pid" ]; then kill "$lane2_pid" 2>/dev/null || true; fi
    if [ "$postgres_here" = 1 ]; then scripts/postgres.sh stop || true; fi
    if [ "$cluster_here" = 1 ]; then scripts/rabbitmq.sh cluster stop || true; fi
    if [ "$lane2_here" = 1 ]; then
        lane2 scripts/rabbitmq.sh 4.0 stop || true
        lane2 scripts/rabbitmq.sh stop || true
    fi
    if [ "$started4_here" = 1 ]; then scripts/rabbitmq.sh 4.0 stop || true; fi
    if [ "$started_here" = 1 ]; then scripts/rabbitmq.sh stop || true; fi
}
trap stop_node EXIT
# The tests build while the brokers start (installing the packages and the
# trixie root is mostly waiting on the network and the disk): on a fresh
# machine that overlaps about two minutes of each.
cargo test --workspace --all-targets --no-run "$@" &
build=$!
if ! scripts/rabbitmq.sh status >/dev/null 2>&1; then
    scripts/rabbitmq.sh start
    started_here=1
fi
# RabbitMQ 4.0, after 3.10: it serves TLS with a copy of the 3.10 node's
# certificates.
if ! scripts/rabbitmq.sh 4.0 status >/dev/null 2>&1; then
    scripts/rabbitmq.sh 4.0 start
    started4_here=1
fi
# The second lane's pair of nodes, the same two versions.
if ! lane2 scripts/rabbitmq.sh status >/dev/null 2>&1 || ! lane2 scripts/rabbitmq.sh 4.0 status >/dev/null 2>&1; then
    lane2_here=1
    lane2 scripts/rabbitmq.sh start
    lane2 scripts/rabbitmq.sh 4.0 start
fi
# A private three-node cluster for the failover test (tests/tests/failover.rs).
if ! scripts/rabbitmq.sh cluster status >/dev/null 2>&1; then
    scripts/rabbitmq.sh cluster start
    cluster_here=1
fi
# A private PostgreSQL cluster for the outbox tests (tests/tests/outbox.rs).
if ! scripts/postgres.sh status >/dev/null 2>&1; then
    scripts/postgres.sh start
    postgres_here=1
fi

# ACEMQ_RABBITMQ_URL, ACEMQ_RABBITMQ_TLS_URL, ACEMQ_RABBITMQ_CA, ...
eval "$(scripts/rabbitmq.sh env | sed 's/^/export /')"
# ACEMQ_RABBITMQ4_URL, ACEMQ_RABBITMQ4_TLS_URL, ACEMQ_RABBITMQ4_CA, ...
eval "$(scripts/rabbitmq.sh 4.0 env | sed 's/^/export /')"
# ACEMQ_RABBITMQ_CLUSTER_URL, ACEMQ_RABBITMQ_CLUSTER_PORTS
eval "$(scripts/rabbitmq.sh cluster env | sed 's/^/export /')"
# ACEMQ_POSTGRES_URL
eval "$(scripts/postgres.sh env | sed 's/^/export /')"

# The second lane's environment: its nodes (and the cluster).
# (The first pair's variables, exported above, are cleared first: they
# would pin the second pair's commands to the first pair's nodes.)
lane2_env="$(
    echo "unset ACEMQ_RABBITMQ_PORT ACEMQ_RABBITMQ_TLS_PORT ACEMQ_RABBITMQ_DIST_PORT ACEMQ_RABBITMQ_NODENAME ACEMQ_RABBITMQ_DIR"
    echo "unset ACEMQ_RABBITMQ4_PORT ACEMQ_RABBITMQ4_TLS_PORT ACEMQ_RABBITMQ4_DIST_PORT ACEMQ_RABBITMQ4_NODENAME ACEMQ_RABBITMQ4_DIR"
    {
        lane2 scripts/rabbitmq.sh env
        lane2 scripts/rabbitmq.sh 4.0 env
    } | sed 's/^/export /'
)"

wait "$build"
# Every integration test target of the workspace is in exactly one lane.
# Each cargo command below selects from the whole workspace (--workspace)
# so that features unify as in the build above and nothing is rebuilt.
lane1=()
lane2=()
while read -r name; do
    case " $LANE2 " in
        *" $name "*) lane2+=(--test "$name") ;;
        *) lane1+=(--test "$name") ;;
    esac
done < <(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
names = {t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if "test" in t["kind"]}
print("\n".join(sorted(names)))')
[ "${#lane2[@]}" = $((2 * $(wc -w <<<"$LANE2"))) ] || {
    echo "test.sh: a suite of the second lane ($LANE2) is not a test target" >&2
    exit 1
}
# The second lane runs its test binaries itself (cargo holds its lock on
# the target directory while its tests run), from the tests crate's
# folder as cargo would.
mapfile -t lane2_bins < <(
    cargo test --workspace "${lane2[@]}" --no-run --message-format=json "$@" \
        | grep -o '"executable":"[^"]*"' | cut -d'"' -f4
)
[ "${#lane2_bins[@]}" = $((${#lane2[@]} / 2)) ] || {
    echo "test.sh: expected $((${#lane2[@]} / 2)) test binaries for the second lane, found ${#lane2_bins[@]}" >&2
    exit 1
}
lane2_log="$(mktemp)"
(
    eval "$lane2_env"
    cd tests
    status=0
    for bin in "${lane2_bins[@]}"; do
        echo "     Running $bin (second lane)"
        "$bin" || status=1
    done
    exit "$status"
) >"$lane2_log" 2>&1 &
lane2_pid=$!

lane1_status=0
{
    cargo test --workspace --no-fail-fast --lib --bins --examples --benches "${lane1[@]}" "$@" \
        && cargo test --workspace --doc
} || lane1_status=1

lane2_status=0
wait "$lane2_pid" || lane2_status=1
lane2_pid=""
echo "test.sh: the second lane's output:"
cat "$lane2_log"
rm -f "$lane2_log"
if [ "$lane1_status" != 0 ] || [ "$lane2_status" != 0 ]; then
    echo "test.sh: tests failed (first lane: $lane1_status, second lane: $lane2_status)" >&2
    exit 1
fi
# The conformance check, as a broker author runs it, against every RabbitMQ
# node the run started, each expecting its own version's answers (the
# totals line; the whole table when a check fails).
conformance() {
    local out
    out="$(cargo run --quiet -p acemq-cli -- conformance check "$1" --rabbitmq-version "$2")" || {
        printf '%s\n' "$out"
        return 1
    }
    printf 'conformance check %s (%s): %s\n' "$1" "$2" "$(tail -n 1 <<<"$out")"
}
conformance "$ACEMQ_RABBITMQ_URL" 3.10
conformance "$ACEMQ_RABBITMQ4_URL" 4.0
(
    eval "$lane2_env"
    conformance "$ACEMQ_RABBITMQ_URL" 3.10
    conformance "$ACEMQ_RABBITMQ4_URL" 4.0
)
# Another client's own integration suites (py-amqp's and kombu's, fetched
# from PyPI into target/client-suite) against the acemq-memory server,
# with both RabbitMQ nodes above as the control (scripts/client-suite.sh).
scripts/client-suite.sh
# The examples run with the outbox feature (which the test build above has
# on too), so acemq-core is built once for all of them; clippy has built
# each without it.
# The orders example, against the in-process broker and against both
# RabbitMQ nodes started above.
cargo run --quiet --example orders --features outbox
AMQP_URL="$ACEMQ_RABBITMQ_URL" cargo run --quiet --example orders --features outbox
AMQP_URL="$ACEMQ_RABBITMQ4_URL" cargo run --quiet --example orders --features outbox
# Recovery: connections cut three times while it publishes and consumes.
cargo run --quiet --example recovery --features outbox
# The hops: a pipeline, a routing slip and a scheduled message.
cargo run --quiet --example pipeline --features outbox
# The lifecycle of a service: consumers beside a health endpoint, SIGTERM
# (it sends itself one), an orderly close that loses nothing.
cargo run --quiet --example service --features outbox
# The outbox: an order and its event in one SQLite transaction.
cargo run --quiet --example outbox --features outbox

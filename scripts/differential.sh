#!/usr/bin/env bash
# The differential test (tests/tests/differential.rs) with as many sequences
# as you like: acemq-memory against the private RabbitMQ node.
#
#   scripts/differential.sh [--cases N] [--seed S]
#
# It starts the node with scripts/rabbitmq.sh (which reads the
# ACEMQ_RABBITMQ_* variables: port, node name, directory), exports its
# environment, runs the test with N cases (ACEMQ_DIFF_CASES, default 1000)
# under CI=true (a missing RabbitMQ fails), prints how many sequences ran
# and how long it took, and stops the node again if it started it.
set -euo pipefail
cd "$(dirname "$0")/.."

cases=1000
seed=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cases) cases="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        *) echo "usage: $0 [--cases N] [--seed S]" >&2; exit 2 ;;
    esac
done

started_here=0
stop_node() {
    if [ "$started_here" = 1 ]; then scripts/rabbitmq.sh stop || true; fi
}
trap stop_node EXIT
if ! scripts/rabbitmq.sh status >/dev/null 2>&1; then
    scripts/rabbitmq.sh start
    started_here=1
fi
eval "$(scripts/rabbitmq.sh env | sed 's/^/export /')"

export CI=true ACEMQ_DIFF_CASES="$cases"
if [ -n "$seed" ]; then export ACEMQ_DIFF_SEED="$seed"; fi
# A sequence has its own deadline; the whole run may take as long as it needs.
export ACEMQ_TEST_DEADLINE="${ACEMQ_TEST_DEADLINE:-100000}"
start=$(date +%s)
cargo test --quiet -p acemq-tests --test differential acemq_memory_answers_every_sequence_as_rabbitmq_does \
    -- --exact --nocapture
echo "differential.sh: $cases cases in $(( $(date +%s) - start ))s"

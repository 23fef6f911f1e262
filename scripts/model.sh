#!/usr/bin/env bash
# The model-based test of the consumer (tests/tests/model.rs) with as many
# sequences as you like, on acemq-memory, the private RabbitMQ 3.10 node and,
# when ACEMQ_RABBITMQ4_URL is set, RabbitMQ 4.0.
#
#   scripts/model.sh [--cases N] [--seed S] [--broker memory|rabbitmq-3.10|rabbitmq-4.0]
#
# It starts the 3.10 node with scripts/rabbitmq.sh (which reads the
# ACEMQ_RABBITMQ_* variables: port, node name, directory) unless it runs,
# exports its environment, runs each broker's test with N cases
# (ACEMQ_MODEL_CASES, default 1000) under CI=true (a missing RabbitMQ 3.10
# fails), prints how many sequences ran and how long each broker took, and
# stops the node again if it started it.
set -euo pipefail
cd "$(dirname "$0")/.."

cases=1000
seed=""
only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cases) cases="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --broker) only="$2"; shift 2 ;;
        *) echo "usage: $0 [--cases N] [--seed S] [--broker memory|rabbitmq-3.10|rabbitmq-4.0]" >&2; exit 2 ;;
    esac
done

tests=()
for broker in memory rabbitmq-3.10 rabbitmq-4.0; do
    if [ -n "$only" ] && [ "$only" != "$broker" ]; then continue; fi
    if [ "$broker" = rabbitmq-4.0 ] && [ -z "${ACEMQ_RABBITMQ4_URL:-}" ]; then
        echo "model.sh: ACEMQ_RABBITMQ4_URL is not set: RabbitMQ 4.0 is left out" >&2
        continue
    fi
    tests+=("$broker")
done
if [ ${#tests[@]} -eq 0 ]; then echo "model.sh: no broker to run on" >&2; exit 2; fi

started_here=0
stop_node() {
    if [ "$started_here" = 1 ]; then scripts/rabbitmq.sh stop || true; fi
}
trap stop_node EXIT
if [[ " ${tests[*]} " == *" rabbitmq-3.10 "* ]]; then
    if ! scripts/rabbitmq.sh status >/dev/null 2>&1; then
        scripts/rabbitmq.sh start
        started_here=1
    fi
    eval "$(scripts/rabbitmq.sh env | sed 's/^/export /')"
fi

export CI=true ACEMQ_MODEL_CASES="$cases"
if [ -n "$seed" ]; then export ACEMQ_MODEL_SEED="$seed"; fi
# A sequence has its own deadline; the whole run may take as long as it needs.
export ACEMQ_TEST_DEADLINE="${ACEMQ_TEST_DEADLINE:-100000}"
cargo test --quiet -p acemq-tests --test model --no-run
out=$(mktemp)
trap 'rm -f "$out"; stop_node' EXIT
for broker in "${tests[@]}"; do
    case "$broker" in
        memory) name=the_consumer_keeps_the_models_promises_on_acemq_memory ;;
        *) name="the_consumer_keeps_the_models_promises_on_${broker//[-.]/_}" ;;
    esac
    start=$(date +%s)
    cargo test --quiet -p acemq-tests --test model "$name" -- --exact --nocapture 2>&1 | tee "$out"
    # A test name that matches nothing runs nothing, and passes.
    if ! grep -q "1 passed" "$out"; then
        echo "model.sh: $name did not run" >&2
        exit 1
    fi
    echo "model.sh: $cases cases on $broker in $(( $(date +%s) - start ))s"
done

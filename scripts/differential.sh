#!/usr/bin/env bash
# The differential test (tests/tests/differential.rs) with as many sequences
# as you like: acemq-memory against RabbitMQ, each RabbitMQ version compared
# with an acemq-memory imitating that version.
#
#   scripts/differential.sh [--version 3.10|4.0|both] [--cases N] [--seed S]
#
# --version (default both) chooses the RabbitMQ: 3.10 is the private node
# of scripts/rabbitmq.sh (which reads the ACEMQ_RABBITMQ_* variables: port,
# node name, directory); 4.0 is the node at ACEMQ_RABBITMQ4_URL when that
# is set, otherwise the 4.0 node of `scripts/rabbitmq.sh 4.0`. A node that
# is not running is started and stopped again at the end. The test runs N
# cases per version (ACEMQ_DIFF_CASES, default 1000) under CI=true (a
# missing RabbitMQ fails), and it prints how many sequences ran against
# each version and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."

cases=1000
seed=""
version=both
while [ $# -gt 0 ]; do
    case "$1" in
        --cases) cases="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --version) version="$2"; shift 2 ;;
        *) echo "usage: $0 [--version 3.10|4.0|both] [--cases N] [--seed S]" >&2; exit 2 ;;
    esac
done
case "$version" in
    3.10|4.0|both) ;;
    *) echo "differential.sh: --version is 3.10, 4.0 or both, not '$version'" >&2; exit 2 ;;
esac

started=()
stop_nodes() {
    for v in "${started[@]+"${started[@]}"}"; do
        ACEMQ_RABBITMQ_VERSION="$v" scripts/rabbitmq.sh stop || true
    done
}
trap stop_nodes EXIT

# Starts (if need be) the node of version $1 and exports its variables.
node() {
    if ! ACEMQ_RABBITMQ_VERSION="$1" scripts/rabbitmq.sh status >/dev/null 2>&1; then
        ACEMQ_RABBITMQ_VERSION="$1" scripts/rabbitmq.sh start
        started+=("$1")
    fi
    eval "$(ACEMQ_RABBITMQ_VERSION="$1" scripts/rabbitmq.sh env | sed 's/^/export /')"
}

if [ "$version" != 4.0 ]; then node 3.10; fi
if [ "$version" != 3.10 ] && [ -z "${ACEMQ_RABBITMQ4_URL:-}" ]; then node 4.0; fi
if [ "$version" = both ]; then unset ACEMQ_DIFF_VERSION; else export ACEMQ_DIFF_VERSION="$version"; fi

export CI=true ACEMQ_DIFF_CASES="$cases"
if [ -n "$seed" ]; then export ACEMQ_DIFF_SEED="$seed"; fi
# A sequence has its own deadline; the whole run may take as long as it needs.
export ACEMQ_TEST_DEADLINE="${ACEMQ_TEST_DEADLINE:-100000}"
start=$(date +%s)
cargo test --quiet -p acemq-tests --test differential acemq_memory_answers_every_sequence_as_rabbitmq_does \
    -- --exact --nocapture
echo "differential.sh: $cases cases per version ($version) in $(( $(date +%s) - start ))s"

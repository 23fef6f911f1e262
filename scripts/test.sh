#!/usr/bin/env bash
# The project's test command: everything the tests need is set up here, so a
# green run never depends on something done by hand.
#
# Today the suite is the codec's (unit, property, known-answer, malformed
# input, tracker and fuzz-corpus replay tests) and needs no broker; the
# behaviour suite in tests/ will start RabbitMQ through scripts/rabbitmq.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --all-targets "$@"
cargo test --workspace --doc

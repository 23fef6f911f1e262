#!/usr/bin/env bash
# The project's test command. It sets up everything the tests need, so a
# green run never depends on something done by hand: it installs Debian's
# rabbitmq-server when missing and starts a private node (scripts/rabbitmq.sh),
# runs every test of the workspace against it, and stops the node again
# unless it was already running before.
set -euo pipefail
cd "$(dirname "$0")/.."

started_here=0
if ! scripts/rabbitmq.sh status >/dev/null 2>&1; then
    scripts/rabbitmq.sh start
    started_here=1
fi
stop_node() {
    if [ "$started_here" = 1 ]; then scripts/rabbitmq.sh stop || true; fi
}
trap stop_node EXIT

# ACEMQ_RABBITMQ_URL, ACEMQ_RABBITMQ_TLS_URL, ACEMQ_RABBITMQ_CA, ...
eval "$(scripts/rabbitmq.sh env | sed 's/^/export /')"

cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
# The README's first command: the example service, against the in-process
# broker and against the RabbitMQ started above.
cargo run --quiet --example orders
AMQP_URL="$ACEMQ_RABBITMQ_URL" cargo run --quiet --example orders
# Recovery: connections cut three times while it publishes and consumes.
cargo run --quiet --example recovery

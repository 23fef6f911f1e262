#!/usr/bin/env bash
# Another client's own integration suites against acemq-memory, with
# RabbitMQ as the control.
#
# The clients: py-amqp (`amqp` on PyPI, Celery's AMQP 0-9-1 client) and
# kombu (Celery's messaging layer, here over py-amqp). Their PyPI source
# archives carry their own integration suites against a real broker
# (amqp-5.4.2: t/integration/test_rmq.py; kombu-5.7.0:
# t/integration/test_py_amqp.py and common.py), which read the broker from
# RABBITMQ_HOST and RABBITMQ_5672_TCP. They were chosen because CI reaches
# PyPI (not GitHub), and these are published suites a CI run can fetch
# there; pika's source archive has no tests.
#
# Nothing fetched is committed: on first use the script makes a virtualenv
# under target/client-suite/ (python3 -m venv), installs the pinned packages
# below from PyPI, downloads the two source archives (`pip download
# --no-deps --no-binary :all:`, checked against the SHA-256 below) and
# unpacks their t/ folders and setup.cfg (the suites' pytest settings). A
# later run reuses all of it.
#
# For each RabbitMQ version V (3.10 and 4.0) it runs both suites twice, at
# once: against the real RabbitMQ V (the control) and against the
# acemq-memory server started with `--rabbitmq-version V` on a free port.
# pytest runs with `-p no:cacheprovider`, without pytest-rerunfailures
# (kombu marks its classes flaky with five reruns; here a failure is a
# failure) and under a hard `timeout`. Each run writes JUnit XML, and the
# results are compared test by test:
#   - a test that passes against RabbitMQ V must pass against acemq-memory
#     imitating V, else the script fails and names the test and version;
#   - a test that fails against RabbitMQ itself is "not comparable" only if
#     KNOWN_SKIPS below names it, with the reason; a test that fails against
#     RabbitMQ and is not there fails the script, and so does a KNOWN_SKIPS
#     entry that passes against RabbitMQ or matches no test (the list cannot
#     rot).
# It prints, per version and suite, how many tests passed on both and how
# many were not comparable (with each reason).
#
# Brokers: ACEMQ_RABBITMQ_URL (3.10) and ACEMQ_RABBITMQ4_URL (4.0), as
# scripts/test.sh exports them (`scripts/rabbitmq.sh [4.0] env`); the suites
# log in as guest/guest on `/`. acemq-memory is built with cargo (debug,
# CARGO_TARGET_DIR honoured) and stopped again at the end. The queues and
# exchanges the suites leave on RabbitMQ (kombu declares durable ones and
# deletes few) are deleted by name before and after the runs.
#
# Without python3 (or with no way to install the packages) the script says
# so and exits 0, except under CI=true, where that is a failure.
#
# Time (2-core machine, measured): about 45 s once the virtualenv exists,
# about 60 s on the first run (virtualenv, installs, downloads); the eight
# pytest runs overlap, and the kombu suite alone takes about 40 s, nearly
# all of it the suite's own fixed waits: three 3 s sleeps for message TTL,
# eight connection tests that spend 2 s retrying a port where nothing
# listens (localhost:12345), and 1 s drain timeouts that expect silence.
# py-amqp's suite takes under a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/target/client-suite"
VENV="$WORK/venv"
SRC="$WORK/src"
OUT="$WORK/results"

# Exact versions of everything installed, so every run tests the same code.
PINS=(pytest==8.0.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 vine==5.1.0 amqp==5.4.2 kombu==5.7.0)
# The source archives whose suites run, with their SHA-256.
SDISTS=(
    "amqp-5.4.2.tar.gz 9362660c4a31150cf18e78cae2ce8aa1e929fc6c6739e69f6dd5dbea9c3edc82"
    "kombu-5.7.0.tar.gz 31e62fdfd2381caa3422f8e02b84a491d9a2180ddda74507b57f4cb1e1c2c2c9"
)
# suite name, folder in $SRC, test file.
SUITES=(
    "amqp amqp-5.4.2 t/integration/test_rmq.py"
    "kombu kombu-5.7.0 t/integration/test_py_amqp.py"
)
# Tests not run at all: they talk to tls-v1-2.badssl.com on the internet, not
# to the broker (and CI reaches no such host).
DESELECT=(
    "t/integration/test_rmq.py::test_tls_default_certs"
    "t/integration/test_rmq.py::test_tls_no_default_certs_fails"
)
# Tests that fail against RabbitMQ itself in this setup: "suite regex|reason".
# The regex must match the whole test id (classname::name).
KNOWN_SKIPS=(
    'amqp t\.integration\.test_rmq::test_connect\[tls\]|TLS: the source archive has no t/certs (the certificates the tests load), and acemq-memory has no TLS listener'
    'amqp t\.integration\.test_rmq::test_tls_connect_fails|TLS: the source archive has no t/certs (the certificates the tests load), and acemq-memory has no TLS listener'
    'amqp t\.integration\.test_rmq\.test_rabbitmq_operations::.*\[tls-?.*\]|TLS: the source archive has no t/certs (the certificates the tests load), and acemq-memory has no TLS listener'
)
# Queues (and exchanges) the suites declare and may leave behind (kombu's
# are durable), deleted on RabbitMQ before and after the runs. The names with a
# uuid in them (revive_active_*, revive_inactive_*, test-queue-*) are found
# with `scripts/rabbitmq.sh V ctl list_queues`, when it reaches the node.
LEFTOVER_NAMES=(test test_empty simple_queue_test simple_buffer_test direct1 rk_direct1 rk_direct2
    fanout1 fanout2 topic1 topic2 topic3 ttl_test ttl_simple_queue_test ttl_simple_buffer_test
    priority_test priority_requeue_test priority_simple_queue_test priority_simple_buffer_test
    test_ack test_reject_no_requeue test_reject_requeue test_requeue)
LEFTOVER_EXCHANGES=(test_direct test_rk_direct test_fanout test_topic test_empty_exchange
    simple_queue_test simple_buffer_test ttl_simple_queue_test ttl_simple_buffer_test
    priority_simple_queue_test priority_simple_buffer_test test_ack test_reject_no_requeue
    test_reject_requeue test_requeue)

# Each pytest run is killed after this many seconds (the kombu suite takes
# about 40).
PYTEST_TIMEOUT="${ACEMQ_CLIENT_SUITE_TIMEOUT:-90}"

log() { printf 'client-suite.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
# Missing tools: a failure under CI, a skip elsewhere.
unavailable() {
    if [ "${CI:-}" = true ]; then die "$* (CI=true: this is a failure)"; fi
    log "$*; skipping the client suites (set CI=true to make this a failure)"
    exit 0
}

t0=$(date +%s%N)
elapsed() { echo "$(( ($(date +%s%N) - t0) / 1000000 )) ms"; }

# ------------------------------------------------------------ setup ------

command -v python3 >/dev/null 2>&1 || unavailable "python3 not found"
mkdir -p "$WORK" "$SRC"
want_pins="${PINS[*]}"
install=0
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.acemq-pins" 2>/dev/null)" != "$want_pins" ]; then
    log "making the virtualenv $VENV (${PINS[*]})"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || unavailable "python3 -m venv failed"
    install=1
fi
# The source archives not yet unpacked are downloaded while the packages
# install (each pip run spends most of its time waiting on PyPI).
downloads=()
for entry in "${SDISTS[@]}"; do
    read -r file sha <<<"$entry"
    dir="${file%.tar.gz}"
    [ -f "$SRC/$dir/.acemq-unpacked" ] && continue
    if [ ! -f "$SRC/$file" ] || ! echo "$sha  $SRC/$file" | sha256sum -c --quiet - 2>/dev/null; then
        log "downloading $file from PyPI"
        rm -f "$SRC/$file"
        timeout 300 "$VENV/bin/pip" download --quiet --disable-pip-version-check --timeout 30 \
            --no-deps --no-binary :all: --dest "$SRC" "${dir%-*}==${dir##*-}" &
        downloads+=("$! $file $sha")
    else
        downloads+=("- $file $sha")
    fi
done
if [ "$install" = 1 ]; then
    timeout 300 "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 30 "${PINS[@]}" \
        || { rm -rf "$VENV"; unavailable "pip could not install ${PINS[*]} from PyPI"; }
    echo "$want_pins" >"$VENV/.acemq-pins"
fi
for entry in ${downloads[@]+"${downloads[@]}"}; do
    read -r pid file sha <<<"$entry"
    dir="${file%.tar.gz}"
    if [ "$pid" != - ]; then
        wait "$pid" || unavailable "pip could not download $file from PyPI"
        echo "$sha  $SRC/$file" | sha256sum -c --quiet - || die "$file does not have the SHA-256 $sha"
    fi
    rm -rf "${SRC:?}/$dir"
    tar -xzf "$SRC/$file" -C "$SRC" --wildcards "$dir/t/*" "$dir/setup.cfg"
    touch "$SRC/$dir/.acemq-unpacked"
done

# host:port of an amqp:// URL.
host_port() {
    local rest="${1#*://}"
    rest="${rest#*@}"
    rest="${rest%%/*}"
    case "$rest" in *:*) echo "$rest" ;; *) echo "$rest:5672" ;; esac
}
[ -n "${ACEMQ_RABBITMQ_URL:-}" ] || die "ACEMQ_RABBITMQ_URL is not set (run scripts/test.sh, or export scripts/rabbitmq.sh env)"
[ -n "${ACEMQ_RABBITMQ4_URL:-}" ] || die "ACEMQ_RABBITMQ4_URL is not set (run scripts/test.sh, or export scripts/rabbitmq.sh 4.0 env)"
declare -A RABBIT=([3.10]="$(host_port "$ACEMQ_RABBITMQ_URL")" [4.0]="$(host_port "$ACEMQ_RABBITMQ4_URL")")

cargo build --quiet -p acemq-memory --bin acemq-memory
MEMORY_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/acemq-memory"
[ -x "$MEMORY_BIN" ] || die "no acemq-memory binary at $MEMORY_BIN"

rm -rf "$OUT"
mkdir -p "$OUT"
MEMORY_PIDS=()
RUN_PIDS=()
cleanup() {
    local pid
    for pid in ${RUN_PIDS[@]+"${RUN_PIDS[@]}"}; do
        pkill -TERM -P "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in ${MEMORY_PIDS[@]+"${MEMORY_PIDS[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in ${MEMORY_PIDS[@]+"${MEMORY_PIDS[@]}"}; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# start_memory V: starts acemq-memory imitating V on a free port and puts
# its host:port in MEMORY[V].
declare -A MEMORY
start_memory() {
    local v="$1" out="$OUT/memory-$1.out" pid deadline
    "$MEMORY_BIN" --listen 127.0.0.1:0 --rabbitmq-version "$v" >"$out" 2>"$OUT/memory-$v.log" &
    pid=$!
    MEMORY_PIDS+=("$pid")
    deadline=$(( $(date +%s) + 20 ))
    until grep -q '^acemq-memory: listening on ' "$out"; do
        kill -0 "$pid" 2>/dev/null || die "acemq-memory --rabbitmq-version $v exited: $(cat "$OUT/memory-$v.log")"
        [ "$(date +%s)" -lt "$deadline" ] || die "acemq-memory --rabbitmq-version $v did not listen within 20 s"
        sleep 0.05
    done
    MEMORY[$v]="$(sed -n 's/^acemq-memory: listening on //p' "$out")"
}
for v in 3.10 4.0; do start_memory "$v"; done

# delete_leftovers V: deletes the queues the suites leave on RabbitMQ V.
delete_leftovers() {
    local v="$1" listed
    listed="$(timeout 60 "$ROOT/scripts/rabbitmq.sh" "$v" ctl -q list_queues name --no-table-headers 2>/dev/null || true)"
    HOST_PORT="${RABBIT[$v]}" LISTED="$listed" EXCHANGES="${LEFTOVER_EXCHANGES[*]}" timeout 60 "$VENV/bin/python" - "${LEFTOVER_NAMES[@]}" <<'PY' \
        || log "could not delete the suites' queues on RabbitMQ $v"
import os, re, sys
import amqp
pattern = re.compile(r"(revive_(active|inactive)_|test-queue-)[0-9a-f-]{36}|test_ack_from_another_thread_[0-9a-f]{32}")
names = set(sys.argv[1:])
names.update(n.strip() for n in os.environ["LISTED"].splitlines() if pattern.fullmatch(n.strip()))
conn = amqp.Connection(host=os.environ["HOST_PORT"], connect_timeout=10)
conn.connect()
ch = conn.channel()
for name in sorted(names):
    ch.queue_delete(name)
# kombu's simple queues each declare an exchange of their name.
for name in sorted(os.environ["EXCHANGES"].split()):
    try:
        ch.exchange_delete(name)
    except amqp.exceptions.NotFound:
        ch = conn.channel()
conn.close()
PY
}

# Both nodes at once (rabbitmqctl takes seconds to start).
delete_all_leftovers() {
    local pids=() v p
    for v in 3.10 4.0; do
        delete_leftovers "$v" &
        pids+=("$!")
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
}

# ------------------------------------------------------------- runs ------

delete_all_leftovers

deselect=()
for d in "${DESELECT[@]}"; do deselect+=(--deselect "$d"); done
# run SUITE V BROKER HOST:PORT: one pytest run in the background.
run() {
    local suite="$1" v="$2" broker="$3" hp="$4" dir file
    read -r _ dir file < <(printf '%s\n' "${SUITES[@]}" | grep "^$suite ")
    (
        cd "$SRC/$dir"
        PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 RABBITMQ_HOST="${hp%:*}" RABBITMQ_5672_TCP="${hp##*:}" \
            RABBITMQ_5671_TCP=1 \
            timeout -k 5 "$PYTEST_TIMEOUT" "$VENV/bin/python" -m pytest -p no:cacheprovider -q -rfE \
            -W ignore::pytest.PytestUnknownMarkWarning "${deselect[@]}" \
            --junitxml="$OUT/$suite-$broker-$v.xml" "$file" >"$OUT/$suite-$broker-$v.txt" 2>&1
        echo $? >"$OUT/$suite-$broker-$v.rc"
    ) &
    RUN_PIDS+=("$!")
}
for v in 3.10 4.0; do
    for s in "${SUITES[@]}"; do
        read -r suite _ <<<"$s"
        run "$suite" "$v" rabbitmq "${RABBIT[$v]}"
        run "$suite" "$v" memory "${MEMORY[$v]}"
    done
done
log "running ${#RUN_PIDS[@]} pytest runs (RabbitMQ 3.10 ${RABBIT[3.10]}, 4.0 ${RABBIT[4.0]}; acemq-memory 3.10 ${MEMORY[3.10]}, 4.0 ${MEMORY[4.0]})"
for pid in "${RUN_PIDS[@]}"; do wait "$pid" || true; done
RUN_PIDS=()

delete_all_leftovers

# --------------------------------------------------------- compare ------

status=0
SUITE_NAMES="$(printf '%s\n' "${SUITES[@]}" | cut -d' ' -f1)" \
    KNOWN="$(printf '%s\n' "${KNOWN_SKIPS[@]}")" \
    DESELECTED="$(printf '%s\n' "${DESELECT[@]}")" \
    OUT="$OUT" PYTEST_TIMEOUT="$PYTEST_TIMEOUT" "$VENV/bin/python" - <<'PY' || status=1
import os, re, sys
import xml.etree.ElementTree as ET

out = os.environ["OUT"]
known = []
for line in os.environ["KNOWN"].splitlines():
    if line.strip():
        head, reason = line.split("|", 1)
        suite, regex = head.split(" ", 1)
        known.append([suite, re.compile(regex), reason, 0])
problems = []

def results(suite, broker, v):
    """test id -> 'passed' | 'failed' | 'skipped', or None when the run broke."""
    base = f"{out}/{suite}-{broker}-{v}"
    rc = open(base + ".rc").read().strip() if os.path.exists(base + ".rc") else "?"
    if rc in ("124", "137"):
        problems.append(f"{suite} against {broker} {v}: pytest timed out after {os.environ['PYTEST_TIMEOUT']} s (see {base}.txt)")
        return None
    if not os.path.exists(base + ".xml"):
        problems.append(f"{suite} against {broker} {v}: no JUnit XML (exit {rc}; see {base}.txt)")
        return None
    found = {}
    for case in ET.parse(base + ".xml").iter("testcase"):
        tid = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        found[tid] = ("failed" if tags & {"failure", "error"} else
                      "skipped" if "skipped" in tags else "passed")
    if not found:
        problems.append(f"{suite} against {broker} {v}: no tests ran (see {base}.txt)")
    return found

for v in ("3.10", "4.0"):
    for suite in os.environ["SUITE_NAMES"].split():
        rabbit = results(suite, "rabbitmq", v)
        memory = results(suite, "memory", v)
        if rabbit is None or memory is None:
            continue
        both, not_comparable = 0, []
        for tid, outcome in sorted(rabbit.items()):
            skip = next((k for k in known if k[0] == suite and k[1].fullmatch(tid)), None)
            if skip:
                skip[3] += 1
            if outcome == "passed":
                if skip:
                    problems.append(f"{tid} [{suite}, RabbitMQ {v}] passes against RabbitMQ but is in KNOWN_SKIPS: remove it from the list")
                elif memory.get(tid) != "passed":
                    problems.append(f"{tid} [{suite}, RabbitMQ {v}] passes against RabbitMQ {v} but is {memory.get(tid, 'missing')} against acemq-memory --rabbitmq-version {v} (see {out}/{suite}-memory-{v}.txt)")
                else:
                    both += 1
            elif skip:
                not_comparable.append((tid, skip[2]))
            else:
                problems.append(f"{tid} [{suite}, RabbitMQ {v}] is {outcome} against RabbitMQ {v} itself and not in KNOWN_SKIPS (see {out}/{suite}-rabbitmq-{v}.txt)")
        for tid in sorted(set(memory) - set(rabbit)):
            problems.append(f"{tid} [{suite}, RabbitMQ {v}] ran against acemq-memory only")
        print(f"client-suite: RabbitMQ {v}, {suite}: {both} passed on both, {len(not_comparable)} not comparable")
        by_reason = {}
        for tid, reason in not_comparable:
            by_reason.setdefault(reason, []).append(tid.removeprefix("t.integration."))
        for reason, tids in by_reason.items():
            print(f"client-suite:   not comparable ({reason}): {', '.join(tids)}")
for d in os.environ["DESELECTED"].split():
    print(f"client-suite: not run (talks to the internet, not the broker): {d}")
for suite, regex, _, hits in known:
    if hits == 0:
        problems.append(f"KNOWN_SKIPS entry '{suite} {regex.pattern}' matches no test: remove it")
for p in problems:
    print(f"client-suite: FAIL: {p}")
sys.exit(1 if problems else 0)
PY

log "done in $(elapsed)"
exit "$status"

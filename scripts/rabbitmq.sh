#!/usr/bin/env bash
# A private RabbitMQ node for acemq's tests.
#
#   scripts/rabbitmq.sh start          start (or reuse) the node, print its URLs
#   scripts/rabbitmq.sh stop           stop it
#   scripts/rabbitmq.sh status         say whether it runs (exit 0 if it does, 3 if not)
#   scripts/rabbitmq.sh ctl ARGS...    rabbitmqctl against the private node
#   scripts/rabbitmq.sh env            print ACEMQ_RABBITMQ_* lines (URLs, CA, client cert)
#
# It never touches the distribution's default node: everything (mnesia, logs,
# config, pid file, Erlang cookie, TLS material) lives under
# $ROOT/target/rabbitmq/, the node is called acemq-test@localhost, and it
# listens on 127.0.0.1 only.
#
# Environment (all optional):
#   ACEMQ_RABBITMQ_PORT        AMQP port            (default 5672)
#   ACEMQ_RABBITMQ_TLS_PORT    AMQPS port           (default 5671)
#   ACEMQ_RABBITMQ_DIST_PORT   Erlang distribution  (default: first free port from 25682)
#   ACEMQ_RABBITMQ_NODENAME    node name            (default acemq-test@localhost)
#   ACEMQ_RABBITMQ_DIR         data directory       (default $ROOT/target/rabbitmq)
#   ACEMQ_RABBITMQ_START_TIMEOUT  seconds to wait for boot (default 120)
#   ACEMQ_RABBITMQ_KEEP_DATA=1 keep mnesia (queues, messages) across a fresh start
#   ACEMQ_RABBITMQ_EPMD_PORT   use a private epmd on this port
#
# `start` reuses a node that is already running with the same name and ports
# (TLS files are then left as they are); otherwise it regenerates the TLS
# material, wipes the node's data and boots a new node.
#
# Needs Debian's rabbitmq-server (installed with apt-get when missing, which
# needs root). As root the node and rabbitmqctl run as the `rabbitmq` user
# (like Debian's /usr/sbin wrappers do), with HOME=$DIR/home so both find the
# same private Erlang cookie; as any other user they run as that user.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${ACEMQ_RABBITMQ_DIR:-$ROOT/target/rabbitmq}"
PORT="${ACEMQ_RABBITMQ_PORT:-5672}"
TLS_PORT="${ACEMQ_RABBITMQ_TLS_PORT:-5671}"
NODENAME="${ACEMQ_RABBITMQ_NODENAME:-acemq-test@localhost}"
START_TIMEOUT="${ACEMQ_RABBITMQ_START_TIMEOUT:-120}"
RMQ_BIN=/usr/lib/rabbitmq/bin

TLS_DIR="$DIR/tls"
HOME_DIR="$DIR/home"
CONF="$DIR/rabbitmq.conf"
PIDFILE="$DIR/rabbitmq.pid"
PLUGINS_FILE="$DIR/enabled_plugins"
ENV_CONF="$DIR/rabbitmq-env.conf"
STATE="$DIR/node.env"           # ports of the running node, written by `start`
LOG_DIR="$DIR/log"
STARTUP_LOG="$LOG_DIR/startup.log"

log() { printf 'rabbitmq.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------- install ---

as_root_or_die() {
    [ "$(id -u)" = 0 ] || die "$1 is missing and installing it needs root (apt-get install -y $2)"
}

ensure_installed() {
    local need=()
    command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/sbin/rabbitmq-server ] || need+=(rabbitmq-server)
    command -v openssl >/dev/null 2>&1 || need+=(openssl)
    [ ${#need[@]} -eq 0 ] && return 0
    as_root_or_die "${need[*]}" "${need[*]}"
    log "installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${need[@]}"
    # Debian's postinst may start the default node through invoke-rc.d when
    # an init system is present; we never use it, and don't stop it either.
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-server installed but $RMQ_BIN/rabbitmq-server not found"
}

# ------------------------------------------------------------ run-as user ---

# Decided only once rabbitmq-server is installed (`start` installs it first):
# the package creates the `rabbitmq` user, and a node started as root before
# that would leave a root-owned cookie that later `ctl` calls, run as
# `rabbitmq`, cannot read.
RUN_USER=""
# pick_run_user [strict]: with `strict` (before a start), root without the
# user is an error; otherwise no user means no installed node to talk to.
pick_run_user() {
    RUN_USER=""
    [ "$(id -u)" = 0 ] || return 0
    if id -u rabbitmq >/dev/null 2>&1; then
        RUN_USER=rabbitmq
    elif [ "${1:-}" = strict ]; then
        die "running as root but there is no rabbitmq user (is rabbitmq-server installed?)"
    fi
}

# The node's ports: the running node's (from $STATE) win over the defaults so
# that `ctl`/`stop` keep working whatever the caller's environment says.
read_state() {
    S_PORT="" S_TLS_PORT="" S_DIST_PORT="" S_NODENAME=""
    if [ -f "$STATE" ]; then
        # shellcheck disable=SC1090
        . "$STATE"
    fi
}
load_state() {
    read_state
    PORT="${S_PORT:-$PORT}"
    TLS_PORT="${S_TLS_PORT:-$TLS_PORT}"
    DIST_PORT="${S_DIST_PORT:-${DIST_PORT:-}}"
    NODENAME="${S_NODENAME:-$NODENAME}"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_dist_port() {
    if [ -n "${ACEMQ_RABBITMQ_DIST_PORT:-}" ]; then
        echo "$ACEMQ_RABBITMQ_DIST_PORT"; return
    fi
    local p
    for p in $(seq 25682 25781); do
        if ! port_in_use "$p" && ! port_in_use "$((p + 10000))"; then echo "$p"; return; fi
    done
    die "no free Erlang distribution port in 25682..25781"
}

# Environment for rabbitmq-server and rabbitmqctl. Everything explicit, so the
# node never reads /etc/rabbitmq or /var/lib/rabbitmq.
node_env() {
    local dist="${DIST_PORT:-25682}"
    printf '%s\n' \
        "HOME=$HOME_DIR" \
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        "LANG=C.UTF-8" \
        "LC_ALL=C.UTF-8" \
        "RABBITMQ_NODENAME=$NODENAME" \
        "RABBITMQ_USE_LONGNAME=false" \
        "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1" \
        "RABBITMQ_NODE_PORT=$PORT" \
        "RABBITMQ_DIST_PORT=$dist" \
        "RABBITMQ_MNESIA_BASE=$DIR/mnesia" \
        "RABBITMQ_LOG_BASE=$LOG_DIR" \
        "RABBITMQ_CONFIG_FILE=$CONF" \
        "RABBITMQ_ADVANCED_CONFIG_FILE=$DIR/advanced.config" \
        "RABBITMQ_CONF_ENV_FILE=$ENV_CONF" \
        "RABBITMQ_PID_FILE=$PIDFILE" \
        "RABBITMQ_ENABLED_PLUGINS_FILE=$PLUGINS_FILE" \
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}" \
        "ERL_EPMD_ADDRESS=127.0.0.1" \
        "ERL_CRASH_DUMP=$LOG_DIR/erl_crash.dump"
}

# run_as CMD ARGS...: run a RabbitMQ script from $RMQ_BIN with node_env, as the
# rabbitmq user when we are root.
run_as() {
    local cmd="$1"; shift
    local envv=()
    mapfile -t envv < <(node_env)
    if [ -n "${ACEMQ_RABBITMQ_EPMD_PORT:-}" ]; then envv+=("ERL_EPMD_PORT=$ACEMQ_RABBITMQ_EPMD_PORT"); fi
    if [ -n "$RUN_USER" ]; then
        (cd "$DIR" && runuser -u "$RUN_USER" -- env -i "${envv[@]}" "$RMQ_BIN/$cmd" "$@")
    else
        (cd "$DIR" && env -i "${envv[@]}" "$RMQ_BIN/$cmd" "$@")
    fi
}

ctl() { run_as rabbitmqctl "$@"; }

node_up() {
    [ -d "$DIR" ] || return 1
    [ -f "$HOME_DIR/.erlang.cookie" ] || return 1
    ctl -q -t 10 ping >/dev/null 2>&1
}

# --------------------------------------------------------------- set up -----

write_tls() {
    local t="$TLS_DIR"
    rm -rf "$t"
    mkdir -p "$t"
    (
        cd "$t"
        umask 022
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 30 \
            -keyout ca.key -out ca.pem -subj "/CN=acemq-test-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -addext "subjectKeyIdentifier=hash" 2>/dev/null
        cat >server.ext <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
        cat >client.ext <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
subjectAltName=DNS:acemq-client
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
        local who
        for who in server client; do
            local cn=localhost
            [ "$who" = client ] && cn=acemq-client
            openssl req -new -newkey rsa:2048 -nodes -sha256 \
                -keyout "$who.key" -out "$who.csr" -subj "/CN=$cn" 2>/dev/null
            openssl x509 -req -sha256 -days 30 -in "$who.csr" \
                -CA ca.pem -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
                -extfile "$who.ext" -out "$who.pem" 2>/dev/null
            rm -f "$who.csr" "$who.ext"
        done
        chmod 0644 ./*.pem
        chmod 0640 ./*.key
    )
    openssl verify -CAfile "$t/ca.pem" "$t/server.pem" "$t/client.pem" >/dev/null \
        || die "generated certificates do not verify"
}

write_config() {
    cat >"$CONF" <<EOF
# Generated by scripts/rabbitmq.sh; rewritten on every start.
listeners.tcp.default = 127.0.0.1:$PORT
listeners.ssl.default = 127.0.0.1:$TLS_PORT
ssl_options.cacertfile = $TLS_DIR/ca.pem
ssl_options.certfile = $TLS_DIR/server.pem
ssl_options.keyfile = $TLS_DIR/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
# SASL EXTERNAL (rabbitmq_auth_mechanism_ssl): the client certificate's CN
# (acemq-client) is the user name.
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
log.file.level = info
log.console = false
EOF
    : >"$ENV_CONF"
    # Only the EXTERNAL mechanism's plugin (the file holds an Erlang term).
    echo '[rabbitmq_auth_mechanism_ssl].' >"$PLUGINS_FILE"
    cat >"$STATE" <<EOF
S_PORT=$PORT
S_TLS_PORT=$TLS_PORT
S_DIST_PORT=$DIST_PORT
S_NODENAME=$NODENAME
EOF
}

ensure_cookie() {
    mkdir -p "$HOME_DIR"
    local c="$HOME_DIR/.erlang.cookie"
    if [ ! -s "$c" ]; then
        # 32 random upper-case letters: a private cookie, not the default node's.
        head -c 4096 /dev/urandom | tr -dc 'A-Z' | head -c 32 >"$c"
    fi
    chmod 0400 "$c"
}

fix_owner() {
    if [ -n "$RUN_USER" ]; then
        chown -R "$RUN_USER:$RUN_USER" "$DIR"
        # The data directory is under the repository, which root owns: the
        # rabbitmq user must at least be able to traverse down to it.
        local d="$DIR"
        while d="$(dirname "$d")"; [ "$d" != / ]; do
            if ! runuser -u "$RUN_USER" -- test -x "$d"; then
                die "$d is not traversable by user $RUN_USER (chmod o+x it, or set ACEMQ_RABBITMQ_DIR)"
            fi
        done
    fi
}

print_logs() {
    log "---- node log tail ($LOG_DIR) ----"
    local f seen=" "
    for f in "$STARTUP_LOG" "$LOG_DIR/$NODENAME.log" "$LOG_DIR"/*.log "$LOG_DIR"/erl_crash.dump; do
        [ -s "$f" ] || continue
        case "$seen" in *" $f "*) continue ;; esac
        seen="$seen$f "
        echo "==> $f <==" >&2
        tail -n 60 "$f" >&2 || true
    done
}

# start failed: show why, and do not leave a half-started node behind.
start_failed() {
    print_logs
    ctl -q -t 15 stop "$PIDFILE" >/dev/null 2>&1 || true
    kill_stale
    die "$1"
}

wait_port() {
    local port="$1" deadline=$(( $(date +%s) + $2 ))
    until port_in_use "$port"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

print_urls() {
    echo "amqp://guest:guest@127.0.0.1:$PORT/"
    echo "amqps://guest:guest@localhost:$TLS_PORT/  (CA: $TLS_DIR/ca.pem, client: $TLS_DIR/client.pem + client.key)"
}

# ------------------------------------------------------------- commands -----

cmd_start() {
    ensure_installed
    pick_run_user strict
    local want_port="$PORT" want_tls="$TLS_PORT" want_node="$NODENAME"
    read_state
    if [ -n "$S_NODENAME" ]; then
        load_state
        if node_up; then
            if [ "$PORT" = "$want_port" ] && [ "$TLS_PORT" = "$want_tls" ] && [ "$NODENAME" = "$want_node" ]; then
                log "node $NODENAME already running; reusing it (TLS files kept)"
                print_urls
                return 0
            fi
            log "node $NODENAME runs with other ports or name; restarting it"
            cmd_stop
        else
            kill_stale
        fi
        PORT="$want_port" TLS_PORT="$want_tls" NODENAME="$want_node"
    fi
    local t0
    t0=$(date +%s%N)
    for p in "$PORT" "$TLS_PORT"; do
        if port_in_use "$p"; then die "port $p is already in use by something else"; fi
    done
    DIST_PORT="$(pick_dist_port)"

    # A fresh start is a fresh broker: no queues or messages from earlier runs
    # (ACEMQ_RABBITMQ_KEEP_DATA=1 keeps them).
    if [ "${ACEMQ_RABBITMQ_KEEP_DATA:-0}" != 1 ]; then rm -rf "$DIR/mnesia"; fi
    mkdir -p "$DIR" "$LOG_DIR" "$DIR/mnesia"
    rm -f "$PIDFILE" "$LOG_DIR"/*.log
    ensure_cookie
    write_tls
    write_config
    fix_owner

    log "starting $NODENAME (amqp $PORT, amqps $TLS_PORT, dist $DIST_PORT) in $DIR"
    if ! run_as rabbitmq-server -detached >"$STARTUP_LOG" 2>&1; then
        start_failed "rabbitmq-server -detached failed"
    fi
    if ! ctl -q wait "$PIDFILE" --timeout "$START_TIMEOUT" >>"$STARTUP_LOG" 2>&1; then
        start_failed "node did not start within ${START_TIMEOUT}s"
    fi
    if ! wait_port "$PORT" 30 || ! wait_port "$TLS_PORT" 30; then
        start_failed "node is up but ports $PORT/$TLS_PORT do not answer"
    fi
    # The user the client certificate logs in as with SASL EXTERNAL.
    ctl -q add_user acemq-client "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >>"$STARTUP_LOG" 2>&1 || true
    ctl -q set_permissions -p / acemq-client '.*' '.*' '.*' >>"$STARTUP_LOG" 2>&1 \
        || start_failed "could not set up the acemq-client user"
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    log "ready in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s"
    print_urls
}

kill_stale() {
    [ -f "$PIDFILE" ] || return 0
    local pid
    pid="$(tr -dc '0-9' <"$PIDFILE")"
    [ -n "$pid" ] || return 0
    if kill -0 "$pid" 2>/dev/null && grep -q beam "/proc/$pid/cmdline" 2>/dev/null; then
        log "ending stale node process $pid"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
}

cmd_stop() {
    load_state
    if node_up; then
        ctl -q stop "$PIDFILE" >/dev/null || ctl -q stop >/dev/null || true
        log "stopped $NODENAME"
    else
        log "node $NODENAME is not running"
    fi
    kill_stale
}

cmd_status() {
    load_state
    if node_up; then
        echo "running: $NODENAME (amqp 127.0.0.1:$PORT, amqps 127.0.0.1:$TLS_PORT, data $DIR)"
        return 0
    fi
    echo "not running: $NODENAME"
    return 3
}

cmd_env() {
    load_state
    echo "ACEMQ_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:$PORT/"
    echo "ACEMQ_RABBITMQ_TLS_URL=amqps://guest:guest@localhost:$TLS_PORT/"
    echo "ACEMQ_RABBITMQ_CA=$TLS_DIR/ca.pem"
    echo "ACEMQ_RABBITMQ_CLIENT_CERT=$TLS_DIR/client.pem"
    echo "ACEMQ_RABBITMQ_CLIENT_KEY=$TLS_DIR/client.key"
}

[ "${1:-}" = start ] || pick_run_user
case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    ctl) shift; load_state; [ -d "$DIR" ] || die "no node directory $DIR (run start first)"; ctl "$@" ;;
    env) cmd_env ;;
    *) echo "usage: $0 start|stop|status|env|ctl ARGS..." >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A private RabbitMQ node for acemq's tests.
#
#   scripts/rabbitmq.sh start          start (or reuse) the node, print its URLs
#   scripts/rabbitmq.sh stop           stop it
#   scripts/rabbitmq.sh status         say whether it runs (exit 0 if it does, 3 if not)
#   scripts/rabbitmq.sh ctl ARGS...    rabbitmqctl against the private node
#   scripts/rabbitmq.sh env            print ACEMQ_RABBITMQ_* lines (URLs, CA, client cert)
#
# Breaking the node on purpose (for recovery tests; same node, same variables):
#
#   scripts/rabbitmq.sh kill           kill -9 every process of the node (its Erlang VM
#                                      and children; never epmd), keep its data
#   scripts/rabbitmq.sh restart        boot the node again on its own data (durable queues
#                                      and persistent messages survive, TLS files kept),
#                                      also right after `kill`; exit 0 once its AMQP port
#                                      answers the protocol header
#   scripts/rabbitmq.sh pause          SIGSTOP every process of the node except epmd: the
#                                      broker goes silent, its sockets stay open
#   scripts/rabbitmq.sh resume         SIGCONT them (`stop` resumes a paused node too)
#
# A private three-node cluster (acemq-c1@localhost .. acemq-c3@localhost, data
# under $ROOT/target/rabbitmq-cluster/{1,2,3}, AMQP only, no TLS, loopback
# only, one Erlang cookie; nodes 2 and 3 join node 1 with stop_app,
# join_cluster, start_app):
#
#   scripts/rabbitmq.sh cluster start      start (or reuse) it, print its env lines
#   scripts/rabbitmq.sh cluster stop       stop all three nodes
#   scripts/rabbitmq.sh cluster status     say which nodes run (exit 0 if all three do)
#   scripts/rabbitmq.sh cluster env        ACEMQ_RABBITMQ_CLUSTER_URL=amqp://guest:guest@127.0.0.1:5701,127.0.0.1:5702,127.0.0.1:5703/
#                                          ACEMQ_RABBITMQ_CLUSTER_PORTS="5701 5702 5703"
#   scripts/rabbitmq.sh cluster kill N     kill -9 node N (1..3), keep its data
#   scripts/rabbitmq.sh cluster restart N  boot node N again on its data (it rejoins)
#   scripts/rabbitmq.sh cluster ctl N ARGS rabbitmqctl against node N
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
#   ACEMQ_RABBITMQ_CLUSTER_PORTS  the cluster's three AMQP ports (default "5701 5702 5703")
#   ACEMQ_RABBITMQ_CLUSTER_DIR    the cluster's directory (default $ROOT/target/rabbitmq-cluster)
#
# `start` reuses a node that is already running with the same name and ports
# (TLS files are then left as they are); otherwise it regenerates the TLS
# material, wipes the node's data and boots a new node.
#
# `kill`, `pause` and `resume` find the node's processes by its pid file and
# by their environment (RABBITMQ_NODENAME and RABBITMQ_MNESIA_BASE of this
# node), plus every descendant of those; epmd, which other nodes share, is
# never touched.
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

CLUSTER_DIR="${ACEMQ_RABBITMQ_CLUSTER_DIR:-$ROOT/target/rabbitmq-cluster}"
read -r -a CLUSTER_PORTS <<<"${ACEMQ_RABBITMQ_CLUSTER_PORTS:-5701 5702 5703}"
CLUSTER_NODE=""                 # 1..3 while a command acts on a cluster node

# The node's files, all under $DIR (set again for each cluster node).
set_paths() {
    TLS_DIR="$DIR/tls"
    HOME_DIR="$DIR/home"
    CONF="$DIR/rabbitmq.conf"
    PIDFILE="$DIR/rabbitmq.pid"
    PLUGINS_FILE="$DIR/enabled_plugins"
    ENV_CONF="$DIR/rabbitmq-env.conf"
    STATE="$DIR/node.env"           # ports of the running node, written by `start`
    LOG_DIR="$DIR/log"
    STARTUP_LOG="$LOG_DIR/startup.log"
}
set_paths

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

# amqp_answers PORT: something on 127.0.0.1:PORT answers the AMQP 0-9-1
# protocol header with a frame (connection.start): it accepts AMQP
# connections, not just TCP ones.
amqp_answers() {
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'AMQP\x00\x00\x09\x01' >&3
        LC_ALL=C IFS= read -r -t 3 -N 1 -u 3 b || exit 1
        [ "$b" = $'\x01' ]
    ) 2>/dev/null
}

# pick_dist_port [TAKEN...]: a free Erlang distribution port that is none of
# TAKEN (ports given to nodes that do not listen yet). ACEMQ_RABBITMQ_DIST_PORT
# is the single node's; cluster nodes always pick.
pick_dist_port() {
    if [ -n "${ACEMQ_RABBITMQ_DIST_PORT:-}" ] && [ -z "$CLUSTER_NODE" ]; then
        echo "$ACEMQ_RABBITMQ_DIST_PORT"; return
    fi
    local p
    for p in $(seq 25682 25781); do
        case " $* " in *" $p "*) continue ;; esac
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

# ------------------------------------------------------ the node's processes ---

# node_pids: the live processes of this node, one pid a line: the VM named by
# the pid file, every process whose environment names this node and its data
# directory (what rabbitmq-server and rabbitmqctl get from node_env), and all
# their descendants. Never epmd (every node on the machine shares it), never
# this script or its ancestors, no zombies.
node_pids() {
    local seeds="" p f
    if [ -s "$PIDFILE" ]; then
        p="$(tr -dc '0-9' <"$PIDFILE")"
        if [ -n "$p" ] && grep -q beam "/proc/$p/cmdline" 2>/dev/null; then seeds="$p"; fi
    fi
    for f in $(grep -lzxF "RABBITMQ_NODENAME=$NODENAME" /proc/[0-9]*/environ 2>/dev/null \
        | xargs -r grep -lzxF "RABBITMQ_MNESIA_BASE=$DIR/mnesia" 2>/dev/null); do
        p="${f#/proc/}"
        seeds="$seeds ${p%/environ}"
    done
    ps -eo pid=,ppid=,stat=,comm= | awk -v seeds="$seeds" -v self="$$" '
        BEGIN { n = split(seeds, s, " "); for (i = 1; i <= n; i++) want[s[i]] = 1 }
        { pids[NR] = $1; parent[$1] = $2; st[$1] = $3; cmd[$1] = $4 }
        END {
            for (p = self; (p in parent) && p > 1; p = parent[p]) skip[p] = 1
            do {
                grew = 0
                for (i = 1; i <= NR; i++) {
                    p = pids[i]
                    if (!(p in want) && (parent[p] in want)) { want[p] = 1; grew = 1 }
                }
            } while (grew)
            for (i = 1; i <= NR; i++) {
                p = pids[i]
                if ((p in want) && !(p in skip) && cmd[p] != "epmd" && st[p] !~ /^Z/) print p
            }
        }'
}

# signal_node SIG: send SIG to every process of the node; fails (3) if it has
# none. Processes that appear meanwhile (a child forked by the VM) get it too.
signal_node() {
    local sig="$1" pids=() all=() again=() p
    mapfile -t pids < <(node_pids)
    [ ${#pids[@]} -gt 0 ] || return 3
    for _ in 1 2 3 4 5; do
        kill "-$sig" "${pids[@]}" 2>/dev/null || true
        all+=("${pids[@]}")
        mapfile -t again < <(node_pids)
        pids=()
        for p in "${again[@]}"; do
            case " ${all[*]} " in *" $p "*) ;; *) pids+=("$p") ;; esac
        done
        [ ${#pids[@]} -gt 0 ] || break
    done
    SIGNALLED=("${all[@]}")
}

epmd_names() {
    local e
    e="$(command -v epmd || ls /usr/lib/erlang/erts-*/bin/epmd 2>/dev/null | head -n 1 || true)"
    [ -n "$e" ] || return 0
    "$e" ${ACEMQ_RABBITMQ_EPMD_PORT:+-port "$ACEMQ_RABBITMQ_EPMD_PORT"} -names 2>/dev/null || true
}

# epmd_has NODE: epmd still lists NODE (a VM killed a moment ago may still be
# registered until epmd sees its socket close).
epmd_has() { epmd_names | grep -q "^name ${1%@*} at port "; }

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

# The node's config and state files. A node without a TLS port (a cluster
# node) gets no TLS listener and no EXTERNAL mechanism.
write_config() {
    if [ -n "$TLS_PORT" ]; then
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
        # Only the EXTERNAL mechanism's plugin (the file holds an Erlang term).
        echo '[rabbitmq_auth_mechanism_ssl].' >"$PLUGINS_FILE"
    else
        cat >"$CONF" <<EOF
# Generated by scripts/rabbitmq.sh; rewritten on every start.
listeners.tcp.default = 127.0.0.1:$PORT
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
log.file.level = info
log.console = false
EOF
        echo '[].' >"$PLUGINS_FILE"
    fi
    : >"$ENV_CONF"
    cat >"$STATE" <<EOF
S_PORT=$PORT
S_TLS_PORT=$TLS_PORT
S_DIST_PORT=$DIST_PORT
S_NODENAME=$NODENAME
EOF
}

new_cookie() {
    # 32 random upper-case letters: a private cookie, not the default node's.
    head -c 4096 /dev/urandom | tr -dc 'A-Z' | head -c 32 >"$1" || true
    [ "$(wc -c <"$1")" = 32 ] || die "could not write an Erlang cookie to $1"
}

# ensure_cookie [FILE]: the node's private cookie (kept once made), or a copy
# of FILE (the cluster's shared one).
ensure_cookie() {
    mkdir -p "$HOME_DIR"
    local c="$HOME_DIR/.erlang.cookie"
    if [ -n "${1:-}" ] && ! cmp -s "$1" "$c"; then
        rm -f "$c"
        cp "$1" "$c"
    fi
    [ -s "$c" ] || new_cookie "$c"
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

# How many boots the node's log records as complete.
boots_logged() {
    local n
    n="$(grep -c "Server startup complete" "$LOG_DIR/$NODENAME.log" 2>/dev/null || true)"
    echo "${n:-0}"
}

# boot_node: rabbitmq-server -detached on the files written for this node;
# returns once the node's log says the boot is complete, the AMQP port
# answers the protocol header and the TLS port (if any) accepts connections.
# Fails at once if the VM exits while booting.
boot_node() {
    local before pid="" deadline
    before="$(boots_logged)"
    mkdir -p "$LOG_DIR"
    log "starting $NODENAME (amqp $PORT${TLS_PORT:+, amqps $TLS_PORT}, dist $DIST_PORT) in $DIR"
    if ! run_as rabbitmq-server -detached >"$STARTUP_LOG" 2>&1; then
        start_failed "rabbitmq-server -detached failed"
    fi
    deadline=$(( $(date +%s) + START_TIMEOUT ))
    until [ "$(boots_logged)" -gt "$before" ] && amqp_answers "$PORT" \
        && { [ -z "$TLS_PORT" ] || port_in_use "$TLS_PORT"; }; do
        [ "$(date +%s)" -lt "$deadline" ] || start_failed "node did not start within ${START_TIMEOUT}s"
        if [ -z "$pid" ] && [ -s "$PIDFILE" ]; then pid="$(tr -dc '0-9' <"$PIDFILE")"; fi
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then start_failed "node exited while booting"; fi
        sleep 0.1
    done
}

print_urls() {
    echo "amqp://guest:guest@127.0.0.1:$PORT/"
    if [ -n "$TLS_PORT" ]; then
        echo "amqps://guest:guest@localhost:$TLS_PORT/  (CA: $TLS_DIR/ca.pem, client: $TLS_DIR/client.pem + client.key)"
    fi
}

since() {
    local ms=$(( ($(date +%s%N) - $1) / 1000000 ))
    echo "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))s"
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
    boot_node
    # The user the client certificate logs in as with SASL EXTERNAL.
    ctl -q add_user acemq-client "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >>"$STARTUP_LOG" 2>&1 || true
    ctl -q set_permissions -p / acemq-client '.*' '.*' '.*' >>"$STARTUP_LOG" 2>&1 \
        || start_failed "could not set up the acemq-client user"
    log "ready in $(since "$t0")"
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
    # A paused node cannot stop.
    signal_node CONT || true
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
        echo "running: $NODENAME (amqp 127.0.0.1:$PORT${TLS_PORT:+, amqps 127.0.0.1:$TLS_PORT}, data $DIR)"
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

# kill: kill -9 every process of the node, then wait until they are gone, the
# AMQP port is closed and epmd has forgotten the name (so `restart` can follow
# at once). The data, the pid file and the state stay as a crash leaves them.
cmd_kill() {
    load_state
    SIGNALLED=()
    if ! signal_node KILL; then
        log "node $NODENAME is not running: nothing to kill"
        return 3
    fi
    local deadline=$(( $(date +%s) + 15 )) left=()
    while :; do
        mapfile -t left < <(node_pids)
        if [ ${#left[@]} -eq 0 ] && ! port_in_use "$PORT" && ! epmd_has "$NODENAME"; then break; fi
        [ "$(date +%s)" -lt "$deadline" ] || die "node $NODENAME is still there 15s after kill -9 (pids: ${left[*]:-none})"
        [ ${#left[@]} -eq 0 ] || kill -KILL "${left[@]}" 2>/dev/null || true
        sleep 0.05
    done
    log "killed $NODENAME (kill -9 of ${SIGNALLED[*]}); its data stays in $DIR"
}

# restart: boot the node again on its own data and files (mnesia, TLS
# material, cookie, ports), whatever state it is in: killed (stale pid file),
# stopped, paused or running (then it is stopped first).
cmd_restart() {
    pick_run_user strict
    read_state
    if [ -z "$S_NODENAME" ] || [ ! -d "$DIR/mnesia" ]; then
        die "no node to restart in $DIR (run start first)"
    fi
    load_state
    local t0 pids=() p
    t0=$(date +%s%N)
    mapfile -t pids < <(node_pids)
    if [ ${#pids[@]} -gt 0 ]; then
        log "node $NODENAME is running; stopping it first"
        cmd_stop
    fi
    kill_stale
    for p in "$PORT" ${TLS_PORT:+"$TLS_PORT"}; do
        if port_in_use "$p"; then die "port $p is already in use by something else"; fi
    done
    if [ -z "$DIST_PORT" ] || port_in_use "$DIST_PORT" || port_in_use "$((DIST_PORT + 10000))"; then
        DIST_PORT="$(pick_dist_port)"
    fi
    ensure_cookie
    write_config
    fix_owner
    boot_node
    log "restarted $NODENAME on its data in $(since "$t0")"
    print_urls
}

cmd_pause() {
    load_state
    SIGNALLED=()
    if ! signal_node STOP; then
        log "node $NODENAME is not running: nothing to pause"
        return 3
    fi
    log "paused $NODENAME (SIGSTOP to ${SIGNALLED[*]}); \`resume\` or \`stop\` it"
}

cmd_resume() {
    load_state
    SIGNALLED=()
    if ! signal_node CONT; then
        log "node $NODENAME is not running: nothing to resume"
        return 3
    fi
    log "resumed $NODENAME (SIGCONT to ${SIGNALLED[*]})"
}

# ------------------------------------------------------------- cluster ------

CLUSTER_SIZE=3

# use_cluster_node N: every variable above now names cluster node N.
use_cluster_node() {
    case "${1:-}" in 1 | 2 | 3) ;; *) die "cluster node must be 1, 2 or 3, not '${1:-}'" ;; esac
    [ ${#CLUSTER_PORTS[@]} -eq "$CLUSTER_SIZE" ] \
        || die "ACEMQ_RABBITMQ_CLUSTER_PORTS must name $CLUSTER_SIZE ports, not '${CLUSTER_PORTS[*]}'"
    CLUSTER_NODE="$1"
    DIR="$CLUSTER_DIR/$1"
    PORT="${CLUSTER_PORTS[$(($1 - 1))]}"
    TLS_PORT=""
    NODENAME="acemq-c$1@localhost"
    DIST_PORT=""
    set_paths
}

cluster_node_running() {
    local pids=()
    mapfile -t pids < <(node_pids)
    [ ${#pids[@]} -gt 0 ] && amqp_answers "$PORT"
}

# The nodes that node 1 sees running in its cluster, as `acemq-cN@localhost` words.
cluster_members() {
    use_cluster_node 1
    load_state
    ctl -q -t 30 cluster_status --formatter json 2>/dev/null \
        | grep -o '"running_nodes":\[[^]]*\]' | grep -o 'acemq-c[0-9]*@localhost' || true
}

cluster_formed() {
    local members n
    members=" $(cluster_members | tr '\n' ' ') "
    for n in $(seq 1 "$CLUSTER_SIZE"); do
        case "$members" in *" acemq-c$n@localhost "*) ;; *) return 1 ;; esac
    done
}

cmd_cluster_env() {
    local hosts=() ports=() n
    for n in $(seq 1 "$CLUSTER_SIZE"); do
        use_cluster_node "$n"
        load_state
        hosts+=("127.0.0.1:$PORT")
        ports+=("$PORT")
    done
    local IFS=,
    echo "ACEMQ_RABBITMQ_CLUSTER_URL=amqp://guest:guest@${hosts[*]}/"
    IFS=' '
    echo "ACEMQ_RABBITMQ_CLUSTER_PORTS=\"${ports[*]}\""
}

cmd_cluster_status() {
    local n up=0
    for n in $(seq 1 "$CLUSTER_SIZE"); do
        use_cluster_node "$n"
        load_state
        if cluster_node_running; then
            echo "running: $NODENAME (amqp 127.0.0.1:$PORT, data $DIR)"
            up=$((up + 1))
        else
            echo "not running: $NODENAME"
        fi
    done
    [ "$up" = "$CLUSTER_SIZE" ] || return 3
    echo "members seen by node 1: $(cluster_members | tr '\n' ' ')"
}

cmd_cluster_stop() {
    local n
    for n in $(seq "$CLUSTER_SIZE" -1 1); do
        use_cluster_node "$n"
        [ -f "$STATE" ] || [ -f "$PIDFILE" ] || continue
        cmd_stop
    done
}

cluster_failed() {
    log "$1; stopping the cluster"
    local n
    for n in $(seq 1 "$CLUSTER_SIZE"); do
        use_cluster_node "$n"
        print_logs
    done
    cmd_cluster_stop
    die "$1"
}

# cluster start: a fresh cluster (like `start`, its data is wiped), or the
# running one when all three nodes run and form it.
cmd_cluster_start() {
    ensure_installed
    pick_run_user strict
    local n all_up=1
    for n in $(seq 1 "$CLUSTER_SIZE"); do
        use_cluster_node "$n"
        load_state
        cluster_node_running || { all_up=0; break; }
    done
    if [ "$all_up" = 1 ] && cluster_formed; then
        log "cluster already running; reusing it"
        cmd_cluster_env
        return 0
    fi
    cmd_cluster_stop
    local t0 taken=() cookie="$CLUSTER_DIR/cookie"
    t0=$(date +%s%N)
    mkdir -p "$CLUSTER_DIR"
    [ -s "$cookie" ] || new_cookie "$cookie"
    chmod 0400 "$cookie"
    for n in $(seq 1 "$CLUSTER_SIZE"); do
        use_cluster_node "$n"
        if port_in_use "$PORT"; then die "port $PORT is already in use by something else"; fi
        DIST_PORT="$(pick_dist_port ${taken[@]+"${taken[@]}"})"
        taken+=("$DIST_PORT")
        rm -rf "$DIR/mnesia"
        mkdir -p "$DIR" "$LOG_DIR" "$DIR/mnesia"
        rm -f "$PIDFILE" "$LOG_DIR"/*.log
        ensure_cookie "$cookie"
        write_config
        fix_owner
    done
    # The three boots overlap: most of a boot is waiting.
    local boots=() failed=0 b
    for n in $(seq 1 "$CLUSTER_SIZE"); do
        (use_cluster_node "$n"; load_state; boot_node) &
        boots+=("$!")
    done
    for b in "${boots[@]}"; do wait "$b" || failed=1; done
    [ "$failed" = 0 ] || cluster_failed "a cluster node did not start"
    for n in $(seq 2 "$CLUSTER_SIZE"); do
        use_cluster_node "$n"
        load_state
        log "joining $NODENAME to acemq-c1@localhost"
        { ctl -q stop_app && ctl -q join_cluster acemq-c1@localhost && ctl -q start_app; } >>"$STARTUP_LOG" 2>&1 \
            || cluster_failed "$NODENAME could not join acemq-c1@localhost"
        local deadline=$(( $(date +%s) + 60 ))
        until amqp_answers "$PORT"; do
            [ "$(date +%s)" -lt "$deadline" ] || cluster_failed "$NODENAME does not answer on $PORT after joining"
            sleep 0.1
        done
    done
    cluster_formed || cluster_failed "the nodes did not form one cluster (node 1 sees: $(cluster_members | tr '\n' ' '))"
    log "cluster of $CLUSTER_SIZE ready in $(since "$t0")"
    cmd_cluster_env
}

cmd_cluster() {
    local sub="${1:-}"
    shift || true
    case "$sub" in
        start) cmd_cluster_start ;;
        stop) cmd_cluster_stop ;;
        status) cmd_cluster_status ;;
        env) cmd_cluster_env ;;
        kill) use_cluster_node "${1:-}"; cmd_kill ;;
        restart) use_cluster_node "${1:-}"; cmd_restart ;;
        ctl)
            use_cluster_node "${1:-}"
            shift
            load_state
            [ -d "$DIR" ] || die "no node directory $DIR (run cluster start first)"
            ctl "$@"
            ;;
        *) echo "usage: $0 cluster start|stop|status|env|kill N|restart N|ctl N ARGS..." >&2; exit 2 ;;
    esac
}

[ "${1:-}" = start ] || pick_run_user
case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    ctl) shift; load_state; [ -d "$DIR" ] || die "no node directory $DIR (run start first)"; ctl "$@" ;;
    env) cmd_env ;;
    kill) cmd_kill ;;
    restart) cmd_restart ;;
    pause) cmd_pause ;;
    resume) cmd_resume ;;
    cluster) shift; cmd_cluster "$@" ;;
    *) echo "usage: $0 start|stop|status|env|ctl ARGS...|kill|restart|pause|resume|cluster ..." >&2; exit 2 ;;
esac

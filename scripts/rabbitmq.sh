#!/usr/bin/env bash
# A private RabbitMQ node for acemq's tests: RabbitMQ 3.10 (the machine's
# Debian bookworm package) or RabbitMQ 4.0 (Debian trixie's package, in a
# root of its own under target/).
#
# Which version: ACEMQ_RABBITMQ_VERSION=3.10|4.0 (default 3.10), or the same
# word before the command (`scripts/rabbitmq.sh 4.0 start`). Every command
# below except `cluster` works on both; the two nodes run side by side.
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
# RabbitMQ 4.0 (version 4.0): Debian trixie's rabbitmq-server (4.0.5, Erlang
# 27), installed on first use by `debootstrap --variant=minbase
# --include=rabbitmq-server trixie ROOT MIRROR` into ROOT
# ($ROOT/target/trixie-root unless ACEMQ_RABBITMQ4_ROOT says otherwise;
# debootstrap is installed with apt-get when missing). MIRROR is read at run
# time from the machine's own apt sources (the first non-security `URIs:` of
# /etc/apt/sources.list.d/*.sources, else the first non-security `deb` line
# of /etc/apt/sources.list). A complete root is reused; one that is not
# (debootstrap did not finish) is removed and made again. The node runs as
# the root's own `rabbitmq` user under `chroot ROOT`, with ROOT/proc mounted
# (once; `stop` unmounts it when this script mounted it and nothing else runs
# in ROOT). Its files live inside ROOT, in ROOT/srv/acemq
# (ACEMQ_RABBITMQ4_DIR, a path inside ROOT, moves them), the node is called
# acemq4-test@localhost, it listens on 127.0.0.1 only and allows guest
# there, and it serves TLS with a copy of the 3.10 node's certificates when
# that node has made them (its own, made the same way, otherwise; `env`
# names the copy). Needs root. Its `env` prints ACEMQ_RABBITMQ4_URL,
# ACEMQ_RABBITMQ4_TLS_URL, ACEMQ_RABBITMQ4_CA, ACEMQ_RABBITMQ4_CLIENT_CERT,
# ACEMQ_RABBITMQ4_CLIENT_KEY, and the variables below that find the node
# again (ACEMQ_RABBITMQ4_PORT, _TLS_PORT, _NODENAME, _ROOT, _DIR).
#
# Environment (all optional):
#   ACEMQ_RABBITMQ_VERSION     3.10 or 4.0          (default 3.10)
#   ACEMQ_RABBITMQ_PORT        AMQP port            (default 5672)
#   ACEMQ_RABBITMQ_TLS_PORT    AMQPS port           (default 5671)
#   ACEMQ_RABBITMQ_DIST_PORT   Erlang distribution  (default: first free port from 25682)
#   ACEMQ_RABBITMQ_NODENAME    node name            (default acemq-test@localhost)
#   ACEMQ_RABBITMQ_DIR         data directory       (default $ROOT/target/rabbitmq, or a
#                              folder under /var/tmp when the rabbitmq user cannot
#                              reach $ROOT: see scripts/state-dir.sh)
#   ACEMQ_RABBITMQ_START_TIMEOUT  seconds to wait for boot (default 120)
#   ACEMQ_RABBITMQ_KEEP_DATA=1 keep mnesia (queues, messages) across a fresh start
#   ACEMQ_RABBITMQ_EPMD_PORT   use a private epmd on this port
#   ACEMQ_RABBITMQ_INSTANCE    1..9: a second set of nodes (names and dirs suffixed -N,
#                              ports + 10×N; both versions)
#   ACEMQ_RABBITMQ_CLUSTER_PORTS  the cluster's three AMQP ports (default "5701 5702 5703")
#   ACEMQ_RABBITMQ_CLUSTER_DIR    the cluster's directory (default $ROOT/target/rabbitmq-cluster)
# and for the 4.0 node (the 3.10 node's variables above do not apply to it):
#   ACEMQ_RABBITMQ4_PORT       AMQP port            (default 5674)
#   ACEMQ_RABBITMQ4_TLS_PORT   AMQPS port           (default 5675)
#   ACEMQ_RABBITMQ4_DIST_PORT  Erlang distribution  (default 25674 when free, else the first free from 25682)
#   ACEMQ_RABBITMQ4_NODENAME   node name            (default acemq4-test@localhost)
#   ACEMQ_RABBITMQ4_ROOT       the trixie root      (default $ROOT/target/trixie-root)
#   ACEMQ_RABBITMQ4_DIR        data directory, as seen inside the root (default /srv/acemq)
#   ACEMQ_RABBITMQ_START_TIMEOUT, ACEMQ_RABBITMQ_KEEP_DATA and ACEMQ_RABBITMQ_EPMD_PORT as above
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

log() { printf 'rabbitmq.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# BASE: $ROOT/target, or a folder under /var/tmp when the servers' users
# cannot reach the repository (scripts/state-dir.sh).
# shellcheck source=scripts/state-dir.sh
. "$ROOT/scripts/state-dir.sh"
BASE="$(state_base "$ROOT")" || die "no place for the node's files"

VERSION="${ACEMQ_RABBITMQ_VERSION:-3.10}"
case "${1:-}" in 3.10 | 4.0) VERSION="$1"; shift ;; esac
case "$VERSION" in
    3.10 | 4.0) ;;
    *) die "ACEMQ_RABBITMQ_VERSION must be 3.10 or 4.0, not '$VERSION'" ;;
esac

# A second set of nodes beside the first (ACEMQ_RABBITMQ_INSTANCE=N, N in
# 1..9): every default below gets the suffix -N (node names, directories)
# and the ports move up by 10×N, so the suites that break a node on purpose
# can have nodes of their own while the others run (scripts/test.sh).
INSTANCE="${ACEMQ_RABBITMQ_INSTANCE:-}"
case "$INSTANCE" in
    "") SUFFIX="" OFFSET=0 ;;
    [1-9]) SUFFIX="-$INSTANCE" OFFSET=$((10 * INSTANCE)) ;;
    *) die "ACEMQ_RABBITMQ_INSTANCE must be a digit 1..9 (or unset), not '$INSTANCE'" ;;
esac

START_TIMEOUT="${ACEMQ_RABBITMQ_START_TIMEOUT:-120}"
RMQ_BIN=/usr/lib/rabbitmq/bin
if [ "$VERSION" = 4.0 ]; then
    # R4: the trixie root (absolute). DIR is the node's directory as this
    # script sees it, NODE_DIR the same directory as the node sees it.
    R4="$(realpath -m "${ACEMQ_RABBITMQ4_ROOT:-$ROOT/target/trixie-root}")"
    NODE_DIR="${ACEMQ_RABBITMQ4_DIR:-/srv/acemq$SUFFIX}"
    case "$NODE_DIR" in /?*) ;; *) die "ACEMQ_RABBITMQ4_DIR must be an absolute path inside the root, not '$NODE_DIR'" ;; esac
    NODE_DIR="${NODE_DIR%/}"
    DIR="$R4$NODE_DIR"
    PORT="${ACEMQ_RABBITMQ4_PORT:-$((5674 + OFFSET))}"
    TLS_PORT="${ACEMQ_RABBITMQ4_TLS_PORT:-$((5675 + OFFSET))}"
    NODENAME="${ACEMQ_RABBITMQ4_NODENAME:-acemq4-test$SUFFIX@localhost}"
    WANT_DIST_PORT="${ACEMQ_RABBITMQ4_DIST_PORT:-}"
    # The 3.10 node's certificates, copied when they are there.
    TLS_FROM="${ACEMQ_RABBITMQ_DIR:-$BASE/rabbitmq$SUFFIX}/tls"
else
    R4=""
    DIR="${ACEMQ_RABBITMQ_DIR:-$BASE/rabbitmq$SUFFIX}"
    NODE_DIR="$DIR"
    PORT="${ACEMQ_RABBITMQ_PORT:-$((5672 + OFFSET))}"
    TLS_PORT="${ACEMQ_RABBITMQ_TLS_PORT:-$((5671 + OFFSET))}"
    NODENAME="${ACEMQ_RABBITMQ_NODENAME:-acemq-test$SUFFIX@localhost}"
    WANT_DIST_PORT="${ACEMQ_RABBITMQ_DIST_PORT:-}"
fi

CLUSTER_DIR="${ACEMQ_RABBITMQ_CLUSTER_DIR:-$BASE/rabbitmq-cluster}"
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

# in_node PATH: PATH (a file under $DIR) as the node sees it (the same path
# for 3.10; inside the root for 4.0).
in_node() { printf '%s' "$NODE_DIR${1#"$DIR"}"; }

# ---------------------------------------------------------------- install ---

as_root_or_die() {
    [ "$(id -u)" = 0 ] || die "$1 is missing and installing it needs root (apt-get install -y $2)"
}

ensure_installed() {
    if [ "$VERSION" = 4.0 ]; then ensure_root4; return; fi
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

# The mirror of the machine's own apt sources (never written anywhere): the
# first URI of a deb822 stanza that is not a security one, else the first
# such `deb` line of the one-line format.
apt_mirror() {
    local m="" f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        m="$(awk -v RS= -F '\n' '{
            uri = ""; suites = ""; types = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^URIs:/) { uri = $i; sub(/^URIs:[ \t]*/, "", uri); split(uri, a, /[ \t]+/); uri = a[1] }
                if ($i ~ /^Suites:/) suites = $i
                if ($i ~ /^Types:/) types = $i
            }
            if (uri != "" && types ~ /(^|[ \t])deb([ \t]|$)/ && suites !~ /security/ && uri !~ /security/) { print uri; exit }
        }' "$f")"
        [ -z "$m" ] || break
    done
    if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
        m="$(awk '$1 == "deb" && $0 !~ /security/ {
            for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; exit }
        }' /etc/apt/sources.list)"
    fi
    [ -n "$m" ] || die "no Debian mirror in the machine's apt sources (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list)"
    printf '%s\n' "$m"
}

# proc_mounted: ROOT/proc is a mount point.
proc_mounted() { awk -v m="$R4/proc" '$2 == m { f = 1 } END { exit !f }' /proc/mounts; }

# root4_complete: debootstrap finished in $R4 (it removes its own
# $R4/debootstrap directory last) and the root has RabbitMQ and its user.
root4_complete() {
    [ -d "$R4" ] && [ ! -e "$R4/debootstrap" ] && [ -f "$R4/etc/passwd" ] \
        && grep -q '^rabbitmq:' "$R4/etc/passwd" \
        && chroot "$R4" test -x "$RMQ_BIN/rabbitmq-server" -a -x "$RMQ_BIN/rabbitmqctl" 2>/dev/null
}

# ensure_root4: the trixie root with rabbitmq-server, made on first use.
ensure_root4() {
    [ "$(id -u)" = 0 ] || die "RabbitMQ 4.0 runs under chroot, which needs root"
    command -v openssl >/dev/null 2>&1 || { as_root_or_die openssl openssl; apt_install openssl; }
    root4_complete && return 0
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    local mirror t0 dlog="$R4.debootstrap.log"
    mirror="$(apt_mirror)"
    if [ -e "$R4" ]; then
        log "$R4 is not a complete root; making it again"
        if proc_mounted; then umount "$R4/proc" || die "cannot unmount $R4/proc (a node still runs there?)"; fi
        rm -rf --one-file-system "$R4"
    fi
    mkdir -p "$(dirname "$R4")"
    t0=$(date +%s%N)
    log "installing Debian trixie's rabbitmq-server into $R4 with debootstrap (log: $dlog)"
    if ! debootstrap --variant=minbase --include=rabbitmq-server trixie "$R4" "$mirror" >"$dlog" 2>&1; then
        tail -n 40 "$dlog" >&2 || true
        die "debootstrap of trixie into $R4 failed"
    fi
    root4_complete || die "debootstrap finished but $R4 has no rabbitmq-server"
    log "trixie root with $(chroot "$R4" dpkg-query -W -f '${Package} ${Version}' rabbitmq-server) ready in $(since "$t0")"
}

apt_install() {
    log "installing $* with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "$@"
}

# ensure_proc: /proc mounted inside the root (once); the marker says this
# script mounted it, so that `stop` may unmount it.
ensure_proc() {
    [ "$VERSION" = 4.0 ] || return 0
    proc_mounted && return 0
    mount -t proc proc "$R4/proc" || die "cannot mount /proc inside $R4"
    : >"$R4/.acemq-proc-mounted"
}

# release_proc: unmount what ensure_proc mounted once no process but epmd
# (which may have been started from inside the root) runs in the root.
release_proc() {
    [ "$VERSION" = 4.0 ] && [ -f "$R4/.acemq-proc-mounted" ] || return 0
    local p
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$R4" ] || continue
        [ "$(cat "$p/comm" 2>/dev/null)" = epmd ] && continue
        return 0
    done
    if proc_mounted && ! umount "$R4/proc"; then
        log "could not unmount $R4/proc; leaving it mounted"
        return 0
    fi
    rm -f "$R4/.acemq-proc-mounted"
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
    if [ "$VERSION" = 4.0 ]; then
        # The root's own rabbitmq user, by number (chroot --userspec).
        if [ "$(id -u)" != 0 ]; then
            [ "${1:-}" != strict ] || die "RabbitMQ 4.0 runs under chroot, which needs root"
            return 0
        fi
        RUN_USER="$(awk -F: '$1 == "rabbitmq" { print $3 ":" $4 }' "$R4/etc/passwd" 2>/dev/null || true)"
        if [ -z "$RUN_USER" ] && [ "${1:-}" = strict ]; then die "$R4 has no rabbitmq user (run start first)"; fi
        return 0
    fi
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
    if [ -n "$WANT_DIST_PORT" ] && [ -z "$CLUSTER_NODE" ]; then
        echo "$WANT_DIST_PORT"; return
    fi
    local p
    if [ "$VERSION" = 4.0 ] && [ -z "$SUFFIX" ] && ! port_in_use 25674 && ! port_in_use 35674; then echo 25674; return; fi
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
        "HOME=$(in_node "$HOME_DIR")" \
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        "LANG=C.UTF-8" \
        "LC_ALL=C.UTF-8" \
        "RABBITMQ_NODENAME=$NODENAME" \
        "RABBITMQ_USE_LONGNAME=false" \
        "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1" \
        "RABBITMQ_NODE_PORT=$PORT" \
        "RABBITMQ_DIST_PORT=$dist" \
        "RABBITMQ_MNESIA_BASE=$NODE_DIR/mnesia" \
        "RABBITMQ_LOG_BASE=$(in_node "$LOG_DIR")" \
        "RABBITMQ_CONFIG_FILE=$(in_node "$CONF")" \
        "RABBITMQ_ADVANCED_CONFIG_FILE=$NODE_DIR/advanced.config" \
        "RABBITMQ_CONF_ENV_FILE=$(in_node "$ENV_CONF")" \
        "RABBITMQ_PID_FILE=$(in_node "$PIDFILE")" \
        "RABBITMQ_ENABLED_PLUGINS_FILE=$(in_node "$PLUGINS_FILE")" \
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}" \
        "ERL_EPMD_ADDRESS=127.0.0.1" \
        "ERL_CRASH_DUMP=$(in_node "$LOG_DIR")/erl_crash.dump"
}

# run_as CMD ARGS...: run a RabbitMQ script from $RMQ_BIN with node_env, as the
# rabbitmq user when we are root (for 4.0: the root's rabbitmq user, under
# chroot, in its directory inside the root).
run_as() {
    local cmd="$1"; shift
    local envv=()
    mapfile -t envv < <(node_env)
    if [ -n "${ACEMQ_RABBITMQ_EPMD_PORT:-}" ]; then envv+=("ERL_EPMD_PORT=$ACEMQ_RABBITMQ_EPMD_PORT"); fi
    if [ "$VERSION" = 4.0 ]; then
        [ -n "$RUN_USER" ] || die "$R4 has no rabbitmq user (run start first)"
        chroot --userspec="$RUN_USER" "$R4" /usr/bin/env -i -C "$NODE_DIR" "${envv[@]}" "$RMQ_BIN/$cmd" "$@"
    elif [ -n "$RUN_USER" ]; then
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
        | xargs -r grep -lzxF "RABBITMQ_MNESIA_BASE=$NODE_DIR/mnesia" 2>/dev/null); do
        p="${f#/proc/}"
        p="${p%/environ}"
        # A 4.0 node's paths are inside its root: the process must run there.
        if [ -n "$R4" ] && [ "$(readlink "/proc/$p/root" 2>/dev/null)" != "$R4" ]; then continue; fi
        seeds="$seeds $p"
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
ssl_options.cacertfile = $(in_node "$TLS_DIR")/ca.pem
ssl_options.certfile = $(in_node "$TLS_DIR")/server.pem
ssl_options.keyfile = $(in_node "$TLS_DIR")/server.key
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
        # RabbitMQ 4.0: guest may log in over the loopback only (the default;
        # said here so that the node is what the header promises).
        if [ "$VERSION" = 4.0 ]; then echo 'loopback_users.guest = true' >>"$CONF"; fi
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
    if [ "$VERSION" = 4.0 ]; then
        chroot "$R4" chown -R rabbitmq:rabbitmq "$NODE_DIR" || die "cannot give $NODE_DIR to the root's rabbitmq user"
    elif [ -n "$RUN_USER" ]; then
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
    ctl -q -t 15 stop "$(in_node "$PIDFILE")" >/dev/null 2>&1 || true
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
    if [ "$VERSION" = 4.0 ] && [ -s "$TLS_FROM/ca.pem" ] && [ -s "$TLS_FROM/server.key" ]; then
        # The same certificates as the 3.10 node: one CA trusts both.
        rm -rf "$TLS_DIR"
        cp -a "$TLS_FROM" "$TLS_DIR"
    else
        write_tls
    fi
    write_config
    fix_owner
    ensure_proc
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
        ctl -q stop "$(in_node "$PIDFILE")" >/dev/null || ctl -q stop >/dev/null || true
        log "stopped $NODENAME"
    else
        log "node $NODENAME is not running"
    fi
    kill_stale
    release_proc
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
    if [ "$VERSION" = 4.0 ]; then
        echo "ACEMQ_RABBITMQ4_URL=amqp://guest:guest@127.0.0.1:$PORT/"
        echo "ACEMQ_RABBITMQ4_TLS_URL=amqps://guest:guest@localhost:$TLS_PORT/"
        echo "ACEMQ_RABBITMQ4_CA=$TLS_DIR/ca.pem"
        echo "ACEMQ_RABBITMQ4_CLIENT_CERT=$TLS_DIR/client.pem"
        echo "ACEMQ_RABBITMQ4_CLIENT_KEY=$TLS_DIR/client.key"
        echo "ACEMQ_RABBITMQ4_PORT=$PORT"
        echo "ACEMQ_RABBITMQ4_TLS_PORT=$TLS_PORT"
        echo "ACEMQ_RABBITMQ4_NODENAME=$NODENAME"
        echo "ACEMQ_RABBITMQ4_ROOT=$R4"
        echo "ACEMQ_RABBITMQ4_DIR=$NODE_DIR"
        if [ -n "$INSTANCE" ]; then echo "ACEMQ_RABBITMQ_INSTANCE=$INSTANCE"; fi
        return 0
    fi
    echo "ACEMQ_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:$PORT/"
    echo "ACEMQ_RABBITMQ_TLS_URL=amqps://guest:guest@localhost:$TLS_PORT/"
    echo "ACEMQ_RABBITMQ_CA=$TLS_DIR/ca.pem"
    echo "ACEMQ_RABBITMQ_CLIENT_CERT=$TLS_DIR/client.pem"
    echo "ACEMQ_RABBITMQ_CLIENT_KEY=$TLS_DIR/client.key"
    if [ -n "$INSTANCE" ]; then echo "ACEMQ_RABBITMQ_INSTANCE=$INSTANCE"; fi
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
    ensure_proc
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
    NODE_DIR="$DIR"
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
    [ "$VERSION" = 3.10 ] || die "the cluster is RabbitMQ 3.10 only"
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
    *) echo "usage: $0 [3.10|4.0] start|stop|status|env|ctl ARGS...|kill|restart|pause|resume|cluster ..." >&2; exit 2 ;;
esac

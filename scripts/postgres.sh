#!/usr/bin/env bash
# A private PostgreSQL cluster for acemq's outbox tests.
#
#   scripts/postgres.sh start        start (or reuse) the cluster, print its URL
#   scripts/postgres.sh stop         stop it
#   scripts/postgres.sh status       say whether it runs (exit 0 if it does, 3 if not)
#   scripts/postgres.sh env          print ACEMQ_POSTGRES_URL=...
#   scripts/postgres.sh psql ARGS... psql against the private cluster's database
#
# It never touches the distribution's clusters (pg_lsclusters): the data
# directory, socket, log and pid file live under $ROOT/target/postgres/, the
# server listens on 127.0.0.1 only, on its own port, and trusts loopback
# connections of its one role (`acemq`), whose database is `acemq`.
#
# Environment (all optional):
#   ACEMQ_POSTGRES_PORT   port            (default 55432)
#   ACEMQ_POSTGRES_DIR    directory       (default $ROOT/target/postgres, or a folder
#                         under /var/tmp when the postgres user cannot reach $ROOT)
#   ACEMQ_POSTGRES_START_TIMEOUT  seconds to wait for start (default 60)
#
# Needs Debian's postgresql (installed with apt-get when missing, which needs
# root). PostgreSQL refuses to run as root: as root the server runs as the
# `postgres` user the package creates, decided only after the install.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# $ROOT/target, or a folder under /var/tmp when the postgres user cannot
# reach the repository (scripts/state-dir.sh).
# shellcheck source=scripts/state-dir.sh
. "$ROOT/scripts/state-dir.sh"
BASE="$(state_base "$ROOT")" || { echo "postgres.sh: no place for the cluster's files" >&2; exit 1; }
DIR="${ACEMQ_POSTGRES_DIR:-$BASE/postgres}"
PORT="${ACEMQ_POSTGRES_PORT:-55432}"
START_TIMEOUT="${ACEMQ_POSTGRES_START_TIMEOUT:-60}"
DATA="$DIR/data"
SOCKET_DIR="$DIR/socket"
LOG="$DIR/postgres.log"
ROLE=acemq
DATABASE=acemq

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# The newest installed server's bin directory (initdb, pg_ctl), or nothing.
server_bin() {
    local bin
    bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    [ -n "$bin" ] && [ -x "$bin/initdb" ] && [ -x "$bin/pg_ctl" ] && printf '%s\n' "$bin"
}

ensure_installed() {
    local need=()
    server_bin >/dev/null || need+=(postgresql)
    command -v psql >/dev/null 2>&1 || need+=(postgresql-client)
    [ ${#need[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "${need[*]} is missing and installing it needs root (apt-get install -y ${need[*]})"
    log "installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${need[@]}"
    # Debian's postinst creates (and may start) a default cluster on 5432;
    # it is never used here, nor stopped.
    server_bin >/dev/null || die "postgresql installed but no initdb/pg_ctl under /usr/lib/postgresql"
}

# Chosen after the install, which creates the `postgres` user.
RUN_USER=""
pick_run_user() {
    RUN_USER=""
    if [ "$(id -u)" = 0 ]; then
        id -u postgres >/dev/null 2>&1 || die "running as root but there is no postgres user (is postgresql installed?)"
        RUN_USER=postgres
    fi
}

# Runs a server command as the server's user.
as_server() {
    if [ -n "$RUN_USER" ]; then
        runuser -u "$RUN_USER" -- "$@"
    else
        "$@"
    fi
}

url() { printf 'postgres://%s@127.0.0.1:%s/%s\n' "$ROLE" "$PORT" "$DATABASE"; }

running() {
    local bin
    bin="$(server_bin)" || return 1
    [ -f "$DATA/PG_VERSION" ] || return 1
    pick_run_user
    as_server "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

# The server accepts connections of the role to its database.
answers() {
    psql "$(url)" -Atqc 'SELECT 1' >/dev/null 2>&1
}

start() {
    ensure_installed
    pick_run_user
    local bin
    bin="$(server_bin)"
    if running && answers; then
        log "reusing the running cluster in $DATA"
        url
        return 0
    fi
    if running; then
        as_server "$bin/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null 2>&1 || true
    fi
    rm -rf "$DIR"
    mkdir -p "$DATA" "$SOCKET_DIR"
    if [ -n "$RUN_USER" ]; then
        chown -R "$RUN_USER:" "$DIR"
        # The server's user must reach its directory through the tree.
        runuser -u "$RUN_USER" -- test -x "$DIR" \
            || die "$DIR is not reachable by user $RUN_USER (chmod o+x its parents, or set ACEMQ_POSTGRES_DIR)"
    fi
    chmod 700 "$DATA"
    log "initialising a cluster in $DATA ($("$bin/postgres" --version))"
    as_server "$bin/initdb" -D "$DATA" -U "$ROLE" --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
        || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
    cat >>"$DATA/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCKET_DIR'
max_connections = 200
EOF
    log "starting PostgreSQL on 127.0.0.1:$PORT"
    as_server "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t "$START_TIMEOUT" start >/dev/null \
        || { tail -n 40 "$LOG" >&2 || true; die "PostgreSQL did not start"; }
    psql "postgres://$ROLE@127.0.0.1:$PORT/postgres" -Atqc "CREATE DATABASE $DATABASE" >/dev/null \
        || die "cannot create the database $DATABASE"
    answers || die "PostgreSQL started but $(url) does not answer"
    url
}

stop() {
    local bin
    bin="$(server_bin)" || { log "postgresql is not installed; nothing to stop"; return 0; }
    [ -f "$DATA/PG_VERSION" ] || { log "no cluster in $DATA"; return 0; }
    pick_run_user
    if as_server "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_server "$bin/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null
        log "stopped the cluster in $DATA"
    else
        log "the cluster in $DATA is not running"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status)
        if running && answers; then
            echo "running: $(url)"
        else
            echo "not running"
            exit 3
        fi
        ;;
    env) echo "ACEMQ_POSTGRES_URL=$(url)" ;;
    psql)
        shift
        exec psql "$(url)" "$@"
        ;;
    *)
        sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac

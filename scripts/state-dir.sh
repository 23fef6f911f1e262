# Sourced by rabbitmq.sh and postgres.sh: where the private servers keep
# their files by default.
#
# The servers run as their own users (rabbitmq, postgres) when the scripts
# run as root, and those users must be able to walk down to their data. So
# the default is the repository's target/ when any user can reach it, and
# otherwise (a clone inside a private folder, such as one made by
# `mktemp -d`) a folder of its own under /var/tmp, named after the
# repository's path so that every script and every test finds the same one
# again. The ACEMQ_*_DIR variables still override it.

# state_base: prints the directory under which the servers' folders go.
state_base() {
    local root="$1"
    if [ "$(id -u)" != 0 ] || runuser -u nobody -- test -x "$root" 2>/dev/null; then
        printf '%s\n' "$root/target"
        return 0
    fi
    local base
    base="/var/tmp/acemq-$(printf '%s' "$root" | cksum | cut -d' ' -f1)"
    if [ -e "$base" ] || [ -L "$base" ]; then
        # /var/tmp is shared: use the folder only if it is root's own.
        [ -d "$base" ] && [ ! -L "$base" ] && [ "$(stat -c %u "$base")" = 0 ] || {
            printf 'state-dir.sh: %s exists and is not a directory of root'"'"'s; set the ACEMQ_*_DIR variables\n' "$base" >&2
            return 1
        }
    else
        mkdir -m 755 "$base"
    fi
    printf '%s\n' "$base"
}

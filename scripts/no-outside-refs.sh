#!/usr/bin/env bash
# The repository stands alone: no file may send its reader to a document
# the repository does not contain (a design text, a numbered section of
# one, an issue tracker), and every test named `statement_NN_...` must be
# listed under its statement in docs/statements.md.
#
#   scripts/no-outside-refs.sh      # exit 0: clean; 1: each offence printed
#
# It reads the files git tracks (so target/ and anything untracked are left
# out), skipping the fuzz corpus and binary files. A numbered statement may
# be named ("statement 17") in a file that also names docs/statements.md,
# where the statements are written out.
set -euo pipefail
cd "$(dirname "$0")/.."

self="scripts/no-outside-refs.sh"
statements="docs/statements.md"
failed=0

# Tracked text files, without the fuzz corpus and this script (which
# spells the patterns out).
mapfile -d '' files < <(git ls-files -z -- . ':!:fuzz/corpus/**' ':!:fuzz/artifacts/**' ":!:$self")

# A design document, its sections, or a seed text behind it; a checkout
# outside this one; an issue tracker's numbers.
outside='DESIGN|§|\.\./shared|/work/shared|seeds/[0-9]|seed document|\b[Tt]he seed\b($|[^- a-z]| (describes|says|promises|names|calls|asks|document|text|chapters?)\b)|[Ii]ssues? #[0-9]+'
if hits=$(grep -InEH -- "$outside" "${files[@]}"); then
    echo "References to something outside the repository:" >&2
    echo "$hits" >&2
    failed=1
fi

# "statement 17" only where the reader is told where statement 17 is.
for f in "${files[@]}"; do
    [ "$f" = "$statements" ] && continue
    grep -Iq -E '\b[Ss]tatements? [0-9]+' "$f" 2>/dev/null || continue
    grep -q 'statements\.md' "$f" && continue
    echo "$f names a numbered statement without pointing to $statements:" >&2
    grep -nE '\b[Ss]tatements? [0-9]+' "$f" | sed 's/^/  /' >&2
    failed=1
done

# Every `statement_NN_...` test is listed in docs/statements.md, under a
# statement NN that is written out there.
while IFS= read -r line; do
    file=${line%%:*}
    name=$(sed -E 's/.*fn (statement_[0-9]+_[A-Za-z0-9_]+).*/\1/' <<<"$line")
    number=$(sed -E 's/^statement_0*([0-9]+)_.*/\1/' <<<"$name")
    if ! grep -q "^### $number\. " "$statements"; then
        echo "$file: $name: statement $number is not written out in $statements" >&2
        failed=1
    elif ! grep -q "\`$name\`" "$statements"; then
        echo "$file: $name is not listed in $statements" >&2
        failed=1
    fi
done < <(grep -HE 'fn statement_[0-9]+_' -- $(printf '%s\n' "${files[@]}" | grep '\.rs$') || true)

if [ "$failed" -ne 0 ]; then
    echo "no-outside-refs: FAILED (write the fact itself, or point to docs/wire-contract.md, docs/statements.md or docs/consumer-promises.md)" >&2
    exit 1
fi
echo "no-outside-refs: ok"

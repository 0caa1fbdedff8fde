#!/bin/sh
# bench/killwriters.sh [N] [small|large] -- kill -9 each model writer (synth,
# quantize) at N random moments of its run (default 30) and check what is
# left (issue 20, acceptance 2):
#   - the target is absent, the old file, or the complete new file (byte for
#     byte a run left alone wrote): never a partial file;
#   - a temporary file a killed run left ("OUT.sparrow-tmp.PID") is not taken
#     for a model (`sparrow inspect` refuses it, unless it is complete: the
#     kill came between its last byte and the rename) and the next run of
#     the writer removes it; after a last complete run none is left.
# Rounds alternate between no target and an old file at the target.  The
# moments are drawn uniformly over 1.2x a whole run's time, measured first.
#   small: synth tiny-moe f16 (7.6 MB), quantize of it (tests/test_writers.sh)
#   large: synth deep-moe q4_0 (182 MB), quantize of synth tiny-moe f16 with
#          a calibration text (the kill can land in calibration or writing)
# SPARROW (default build/sparrow), SPARROW_SCRATCH (default /tmp) and
# SPARROW_SHARED (default ../shared) as the tests use them.  Prints one line
# per writer and exits 1 if any round left a partial target or a leftover.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}
N=${1:-30}
SIZE=${2:-large}
work=$(mktemp -d "${SPARROW_SCRATCH:-/tmp}/sparrow-kill.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT INT TERM
bad=0

now() { date +%s.%N; }
# a uniform draw in [0, $1), from /dev/urandom
draw() { awk -v m="$1" -v r="$(od -An -N4 -tu4 /dev/urandom)" 'BEGIN { printf "%.3f", m * r / 4294967296 }'; }

# kill_rounds NAME CMD...: CMD writes "$out" (a word in it is replaced)
kill_rounds() {
    name=$1
    shift
    out="$work/$name.gguf"
    ref="$work/$name-ref.gguf"
    t0=$(now)
    "$@" "$ref" >/dev/null 2>&1 || { echo "$name: the reference run failed: $*"; bad=1; return; }
    T=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.3f", (b - a) * 1.2 }')
    absent=0 old=0 complete=0 partial=0 left=0 taken=0
    i=0
    while [ "$i" -lt "$N" ]; do
        i=$((i + 1))
        if [ $((i % 2)) -eq 0 ]; then printf 'old model\n' >"$out"; else rm -f "$out"; fi
        t=$(draw "$T")
        "$@" "$out" >/dev/null 2>&1 &
        pid=$!
        sleep "$t"
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        if [ ! -e "$out" ]; then
            absent=$((absent + 1))
        elif cmp -s "$out" "$ref"; then
            complete=$((complete + 1))
        elif [ "$(cat "$out")" = "old model" ]; then
            old=$((old + 1))
        else
            partial=$((partial + 1))
            echo "$name: round $i left a partial target ($(wc -c <"$out") bytes)"
        fi
        for f in "$out"?*; do # whatever else a writer of $out made in the folder
            [ -e "$f" ] && [ "$f" -nt "$ref" ] || continue
            case "$f" in *"$pid"*) ;; *) continue ;; esac
            left=$((left + 1))
            # never mistaken for a model: refused, or already complete (killed
            # between the last write and the rename)
            if "$SPARROW" inspect "$f" >/dev/null 2>&1 && ! cmp -s "$f" "$ref"; then
                taken=$((taken + 1))
                echo "$name: round $i: the partial leftover $f opens as a model"
            fi
        done
    done
    # the next run removes the leftovers and completes
    "$@" "$out" >/dev/null 2>&1 || { echo "$name: the run after the kills failed"; bad=1; }
    cmp -s "$out" "$ref" || { echo "$name: the run after the kills wrote other bytes"; bad=1; }
    remain=$(ls "$work" | grep -c "^$name\.gguf.")
    echo "$name: $N kills over ${T}s: target absent $absent, old $old, complete $complete, partial $partial;" \
         "$left kills left their temporary file (none partial and taken for a model: $taken), $remain left after the next run"
    [ "$partial" -eq 0 ] && [ "$taken" -eq 0 ] && [ "$remain" -eq 0 ] || bad=1
}

synth() { "$SPARROW" synth --shape "$1" --type "$2" -q -o "$3"; }

case "$SIZE" in
small)
    kill_rounds synth synth tiny-moe f16
    synth tiny-moe f16 "$work/in.gguf" || exit 1
    kill_rounds quantize "$SPARROW" quantize "$work/in.gguf" -q -t 1
    ;;
large)
    kill_rounds synth synth deep-moe q4_0
    synth tiny-moe f16 "$work/in.gguf" || exit 1
    text="$SPARROW_SHARED/peer-golden/tinystories-valid-excerpt.txt"
    [ -f "$text" ] || { echo "missing fixture: $text"; exit 1; }
    kill_rounds quantize "$SPARROW" quantize "$work/in.gguf" --calib "$text" -q -t 1
    ;;
*)
    echo "usage: bench/killwriters.sh [N] [small|large]"
    exit 2
    ;;
esac
exit "$bad"

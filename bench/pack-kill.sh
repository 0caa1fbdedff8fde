#!/bin/sh
# pack-kill.sh -- nothing half-written (docs/PACKAGES.md, acceptance 4), on a
# model big enough for a kill to land anywhere (opening, writing shards,
# fsync, rename): N kill -9 at random moments of each of `sparrow update`,
# `sparrow pack` and `sparrow install` (moments uniform over the time the
# command takes uninterrupted).  After each kill the target must be the old
# file or the new one, byte for byte, and load; rerunning the command must
# complete and leave no temporary file.  Then a full disk: a tmpfs too small
# for the new file (update in place, pack, install into it) must fail naming
# the file, with the old model byte-identical and no temporary file left.
#
# usage: bench/pack-kill.sh        (root: the tmpfs mount)
# Environment: SPARROW (build/sparrow), N (50), SHAPE (deep-moe), TYPE (q4_0),
#   SPARROW_SCRATCH (../scratch).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
N=${N:-50}
SHAPE=${SHAPE:-deep-moe}
TYPE=${TYPE:-q4_0}
SCR=${SPARROW_SCRATCH:-$root/../scratch}
W=$(mktemp -d "$SCR/pack-kill.XXXXXX")
MNT=""
cleanup() { [ -n "$MNT" ] && umount "$MNT" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
echo "load before: $(uptime | sed 's/.*load average/load average/')"

"$SPARROW" synth --shape "$SHAPE" --type "$TYPE" --seed 1 -o "$W/old.gguf" -q
"$SPARROW" synth --shape "$SHAPE" --type "$TYPE" --seed 2 -o "$W/new.gguf" -q
"$SPARROW" edit "$W/new.gguf" --set general.name=new
"$SPARROW" diff "$W/old.gguf" "$W/new.gguf" -o "$W/p.spkd" -q
"$SPARROW" pack "$W/old.gguf" -o "$W/old.spk" -q
"$SPARROW" pack "$W/new.gguf" -o "$W/new.spk" -q
echo "model $(stat -c %s "$W/old.gguf") bytes, patch $(stat -c %s "$W/p.spkd")"

# op NAME: prepare the target, print the command to run
prep() {
    case $1 in
    update) cp "$W/old.gguf" "$W/t.gguf"; T="$W/t.gguf"; OLD="$W/old.gguf"; NEW="$W/new.gguf"
            CMD="$SPARROW update $W/t.gguf $W/p.spkd -q" ;;
    pack)   cp "$W/old.spk" "$W/t.spk"; T="$W/t.spk"; OLD="$W/old.spk"; NEW="$W/new.spk"
            CMD="$SPARROW pack $W/new.gguf -o $W/t.spk -q" ;;
    install) cp "$W/old.gguf" "$W/t.gguf"; T="$W/t.gguf"; OLD="$W/old.gguf"; NEW="$W/new.gguf"
            CMD="$SPARROW install $W/new.spk -o $W/t.gguf -q" ;;
    esac
}
fail=0
for op in update pack install; do
    prep $op
    t0=$(date +%s.%N); $CMD; t1=$(date +%s.%N)
    dur=$(echo "$t1 - $t0" | bc -l)
    killed=0 done_=0
    for k in $(seq "$N"); do
        prep $op
        $CMD & pid=$!
        sleep "$(python3 -c "import random; print(random.uniform(0, $dur))")"
        kill -9 $pid 2>/dev/null && killed=$((killed + 1)) || done_=$((done_ + 1))
        wait $pid 2>/dev/null || true
        if cmp -s "$T" "$OLD"; then state=old; elif cmp -s "$T" "$NEW"; then state=new; else state=BROKEN; fi
        [ $state = BROKEN ] && { echo "FAIL: $op kill $k: the target is neither the old nor the new file"; fail=1; }
        "$SPARROW" inspect "$T" > /dev/null 2>&1 || { echo "FAIL: $op kill $k: the target does not load"; fail=1; }
        # a rerun completes (an update that had finished is not run twice: the
        # patch is for the old model, and the new one would refuse it)
        if [ $op != update ] || [ $state = old ]; then $CMD || { echo "FAIL: $op kill $k: the rerun failed"; fail=1; }; fi
        cmp -s "$T" "$NEW" || { echo "FAIL: $op kill $k: the rerun did not give the new file"; fail=1; }
        ls "$W" | grep -q '\.tmp' && { echo "FAIL: $op kill $k: a temporary file was left"; fail=1; }
    done
    printf '%-8s %d kills (%d while running, %d after it had finished), command %.2f s: target always old or new, reruns complete\n' \
        $op "$N" $killed $done_ "$dur"
done

# ---- a full disk
if [ "$(id -u)" -eq 0 ]; then
    MNT="$W/mnt"; mkdir -p "$MNT"
    sz=$(( $(stat -c %s "$W/old.gguf") * 3 / 2 / 1048576 ))
    mount -t tmpfs -o size=${sz}m tmpfs "$MNT"
    cp "$W/old.gguf" "$MNT/m.gguf"
    for what in update pack install; do
        case $what in
        update)  out=$("$SPARROW" update "$MNT/m.gguf" "$W/p.spkd" -q 2>&1) && r=0 || r=$? ;;
        pack)    out=$("$SPARROW" pack "$W/new.gguf" -o "$MNT/m.spk" -q 2>&1) && r=0 || r=$? ;;
        install) out=$("$SPARROW" install "$W/new.spk" -o "$MNT/m.gguf" -q 2>&1) && r=0 || r=$? ;;
        esac
        if [ $r -ne 0 ] && cmp -s "$MNT/m.gguf" "$W/old.gguf" && ! ls "$MNT" | grep -q '\.tmp' && [ ! -e "$MNT/m.spk" ]; then
            echo "full disk, $what: refused ($out); the old model is intact, no temporary file"
        else
            echo "FAIL: full disk, $what: exit $r ($out)"; fail=1
        fi
    done
    "$SPARROW" inspect "$MNT/m.gguf" > /dev/null && echo "full disk: the old model still loads"
else
    echo "full disk: skipped (needs root for the tmpfs mount)"
fi
echo "load after: $(uptime | sed 's/.*load average/load average/')"
exit $fail

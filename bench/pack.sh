#!/bin/sh
# pack.sh -- model packages on a big model (docs/PACKAGES.md, acceptance 1-2):
#   - round trip: pack, install, cmp with the GGUF; packing twice gives the
#     same bytes (with 1 and THREADS threads);
#   - `run -m X.spk` gives the text of `run -m X.gguf` (greedy, N_GEN tokens);
#   - install throughput (MB/s of model), cold and warm page cache;
#   - load time of -m X.spk against the plain GGUF (sparrow bench's load_s,
#     cold = the file's pages dropped before each repetition, and warm);
#   - compressed/raw ratios: the 7B file here, and the REAL_TYPES list of
#     real stories260K files plus its `q4` quantize policy (tiny but trained
#     weights: random weights do not compress like trained ones).
# Prints one line per figure, with the CPU and the load average.
#
# usage: bench/pack.sh [MODEL]   (default: $SPARROW_SCRATCH/llama-7b-q4_0.gguf,
#        written with `sparrow synth --shape llama-7b --type q4_0` if absent)
# Environment: SPARROW (default build/sparrow), THREADS (2), N_GEN (16),
#   RATIO_FILES (more GGUF files whose package ratio to print, e.g. synthetic F16
#   and Q8_0 ones),
#   REPS (3), SPARROW_SCRATCH (../scratch), SPARROW_SHARED (../shared), KEEP=1
#   keeps the package and the installed copy.
# Needs: about 3x the model's size free in SPARROW_SCRATCH; GNU dd (iflag=nocache
# drops a file's pages from the page cache without root).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
THREADS=${THREADS:-2}
N_GEN=${N_GEN:-16}
REPS=${REPS:-3}
SCR=${SPARROW_SCRATCH:-$root/../scratch}
SHARED=${SPARROW_SHARED:-$root/../shared}
MODEL=${1:-$SCR/llama-7b-q4_0.gguf}
mkdir -p "$SCR"
W=$(mktemp -d "$SCR/pack-bench.XXXXXX")
trap 'rm -rf "$W"' EXIT

if [ ! -f "$MODEL" ]; then
    echo "pack.sh: writing $MODEL"
    "$SPARROW" synth --shape llama-7b --type q4_0 -o "$MODEL" -q
fi
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $THREADS"
echo "load before: $(uptime | sed 's/.*load average/load average/')"
size=$(stat -c %s "$MODEL")

drop() { dd if="$1" iflag=nocache count=0 status=none; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

# ---- round trip and determinism
"$SPARROW" pack "$MODEL" -o "$W/a.spk" -t "$THREADS" -q --json > "$W/pack.json"
pack_s=$(json "['seconds']" < "$W/pack.json")
psize=$(stat -c %s "$W/a.spk")
"$SPARROW" pack "$MODEL" -o "$W/b.spk" -t 1 -q
if cmp -s "$W/a.spk" "$W/b.spk"; then echo "deterministic: packing twice (threads $THREADS and 1) gave the same bytes"; else echo "FAIL: packing twice gave different bytes"; exit 1; fi
rm -f "$W/b.spk"
printf 'pack: %s -> %s bytes, ratio %.4f, %.1f s (%.0f MB/s of model)\n' "$size" "$psize" \
    "$(echo "$psize / $size" | bc -l)" "$pack_s" "$(echo "$size / 1000000 / $pack_s" | bc -l)"

for mode in cold warm; do
    rm -f "$W/i.gguf"
    if [ $mode = cold ]; then drop "$W/a.spk"; else cat "$W/a.spk" > /dev/null; fi
    "$SPARROW" install "$W/a.spk" -o "$W/i.gguf" -t "$THREADS" -q --json > "$W/inst.json"
    s=$(json "['seconds']" < "$W/inst.json")
    printf 'install (%s page cache): %.1f s, %.0f MB/s of model\n' $mode "$s" "$(echo "$size / 1000000 / $s" | bc -l)"
done
if cmp -s "$W/i.gguf" "$MODEL"; then echo "round trip: the installed file is byte-identical to $MODEL"; else echo "FAIL: installed file differs"; exit 1; fi
[ "${KEEP:-0}" = 1 ] || rm -f "$W/i.gguf"

# ---- tokens
"$SPARROW" run -m "$MODEL" -p "Once upon a time" -n "$N_GEN" --temp 0 -t "$THREADS" > "$W/gguf.txt" 2>/dev/null
"$SPARROW" run -m "$W/a.spk" -p "Once upon a time" -n "$N_GEN" --temp 0 -t "$THREADS" > "$W/spk.txt" 2>/dev/null
if cmp -s "$W/gguf.txt" "$W/spk.txt"; then echo "run -m X.spk: the same $N_GEN greedy tokens' text as run -m X.gguf"; else echo "FAIL: run -m X.spk differs"; exit 1; fi

# ---- load time (bench's load_s: sp_model_load + sp_session_init), median of REPS
for f in "$MODEL" "$W/a.spk"; do
    for mode in cold warm; do
        flag=""; [ $mode = cold ] && flag=--cold
        [ $mode = warm ] && cat "$f" > /dev/null
        "$SPARROW" bench -m "$f" -p 8 -n 2 -r "$REPS" -t "$THREADS" $flag --json > "$W/b.json" 2>/dev/null
        l=$(json "['load_s']" < "$W/b.json")
        printf 'load %-4s %s: %.2f s\n' "$(basename "$f" | sed 's/.*\.//')" $mode "$l"
    done
done

# ---- compressed/raw ratios of real (trained) weights
S="$SHARED/models/stories260K"
printf '* F16\n' > "$W/f16.policy"
"$SPARROW" quantize "$S/stories260K-f32.gguf" "$W/s-f16.gguf" --policy-file "$W/f16.policy" -q
"$SPARROW" quantize "$S/stories260K-f32.gguf" "$W/s-q4.gguf" --policy q4 -q
for f in "$S/stories260K-f32.gguf" "$W/s-f16.gguf" "$S/stories260K-q8_0.gguf" "$S/stories260K-q4_0.gguf" "$W/s-q4.gguf"; do
    "$SPARROW" pack "$f" -o "$W/r.spk" -q --shard-size 64K
    printf 'ratio %-24s %.4f (%s -> %s bytes; real stories260K weights)\n' "$(basename "$f")" \
        "$(echo "$(stat -c %s "$W/r.spk") / $(stat -c %s "$f")" | bc -l)" "$(stat -c %s "$f")" "$(stat -c %s "$W/r.spk")"
done
# ---- and of synthetic (random-weight) files, given in RATIO_FILES
for f in ${RATIO_FILES:-}; do
    "$SPARROW" pack "$f" -o "$W/r.spk" -q -t "$THREADS"
    printf 'ratio %-24s %.4f (%s -> %s bytes; synthetic random weights)\n' "$(basename "$f")" \
        "$(echo "$(stat -c %s "$W/r.spk") / $(stat -c %s "$f")" | bc -l)" "$(stat -c %s "$f")" "$(stat -c %s "$W/r.spk")"
done
echo "load after: $(uptime | sed 's/.*load average/load average/')"

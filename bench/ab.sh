#!/bin/sh
# ab.sh FILE_A FILE_B [REPS] -- two model files decoded by Sparrow, alternating
# A, B, A, B ... REPS times each (default 3): decode and prefill tok/s per
# repetition, the median ratio B / A, and the size ratio A / B (tensor bytes)
# -- e.g. whether a smaller quantization turns into proportionally faster
# tokens (docs/QUANT.md).
#
# Environment: SPARROW (default build/sparrow), THREADS (2), N_PROMPT (16),
# N_GEN (128, llama-bench's tg: 32 tokens of a 7B model take 4 s, which a
# neighbour's burst on a shared machine can swing by 20%), SPARROW_ARGS
# (extra bench arguments).  Needs python3.
set -eu
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 FILE_A FILE_B [REPS]" >&2; exit 2; }
A=$1
B=$2
REPS=${3:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
THREADS=${THREADS:-2}
N_PROMPT=${N_PROMPT:-16}
N_GEN=${N_GEN:-128}
SPARROW_ARGS=${SPARROW_ARGS:-}
[ -x "$SPARROW" ] || { echo "ab.sh: no sparrow binary at '$SPARROW'" >&2; exit 2; }
for f in "$A" "$B"; do [ -r "$f" ] || { echo "ab.sh: cannot read '$f'" >&2; exit 2; }; done
command -v python3 >/dev/null || { echo "ab.sh: python3 is needed" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-ab.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "ab: A = $A, B = $B; $REPS alternating repetitions, threads $THREADS, prompt $N_PROMPT, gen $N_GEN"
i=1
while [ "$i" -le "$REPS" ]; do
    # shellcheck disable=SC2086
    "$SPARROW" bench -m "$A" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" --json $SPARROW_ARGS > "$tmp/a.$i.json"
    # shellcheck disable=SC2086
    "$SPARROW" bench -m "$B" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" --json $SPARROW_ARGS > "$tmp/b.$i.json"
    i=$((i + 1))
done
python3 - "$tmp" "$REPS" <<'PY'
import json, statistics, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
ra, rb = [], []
print("| rep | decode A | decode B | B/A | prefill A | prefill B |")
print("|---|---:|---:|---:|---:|---:|")
for i in range(1, reps + 1):
    a = json.load(open("%s/a.%d.json" % (tmp, i))); b = json.load(open("%s/b.%d.json" % (tmp, i)))
    ra.append(a); rb.append(b)
    print("| %d | %.3f | %.3f | %.3f | %.2f | %.2f |" % (i, a["decode_tps"], b["decode_tps"], b["decode_tps"] / a["decode_tps"],
          a["prefill_tps"], b["prefill_tps"]))
da = statistics.median(r["decode_tps"] for r in ra); db = statistics.median(r["decode_tps"] for r in rb)
size = ra[0]["model_tensor_bytes"] / rb[0]["model_tensor_bytes"]
print()
print("median decode: A %.3f, B %.3f tok/s; B/A = %.3f" % (da, db, db / da))
print("tensor bytes: A %d, B %d; A/B = %.3f (x 0.95 = %.3f)" % (ra[0]["model_tensor_bytes"], rb[0]["model_tensor_bytes"], size, 0.95 * size))
PY

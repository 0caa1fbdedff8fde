#!/bin/sh
# fold.sh [SHAPE] [G] [N_CTX] -- a model whose KV heads are folded
# (`sparrow quantize --merge-kv-heads G`) runs with the KV bytes the formula
#   n_layers x n_ctx x n_kv_heads x (head_dim_k + head_dim_v) x 2   (F16 cache)
# gives, beside the original.  Defaults: llama-7b, its 32 KV heads into 8,
# N_CTX 4096.
#
# The original is a synthetic SHAPE in Q8_0 ($SCRATCH/SHAPE-q8_0.gguf, written
# by `sparrow synth` when missing: 7.2 GB for llama-7b); the folded model is
# quantized from it with POLICY.  For each: bench/kvbytes (the session's KV
# bytes by its reservation, by the library's count and by an allocator
# hook) and `sparrow bench -p 16 -n 8 -r 1 -c N_CTX --json` (it runs; decode
# speed and peak RSS).  Exits 1 when the three KV figures differ, are not
# whole positions of the formula's bytes per position (at least N_CTX of
# them), differ between the two models by other than the ratio of their KV
# heads, or the folded model does not have G KV heads.  What the
# script wrote is deleted at the end unless KEEP=1 (a source that was there
# before is left alone).
#
# Environment: SPARROW (build/sparrow), KVBYTES (build/bench/kvbytes, `make
# bench`), SPARROW_SCRATCH (../scratch), POLICY (mem4), THREADS (2).
# Needs python3.
set -eu
SHAPE=${1:-llama-7b}
G=${2:-8}
N_CTX=${3:-4096}
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
KVBYTES=${KVBYTES:-$root/build/bench/kvbytes}
SCRATCH=${SPARROW_SCRATCH:-$(cd "$root/.." && pwd)/scratch}
POLICY=${POLICY:-mem4}
THREADS=${THREADS:-2}
[ -x "$SPARROW" ] || { echo "fold.sh: no sparrow binary at '$SPARROW'" >&2; exit 2; }
[ -x "$KVBYTES" ] || { echo "fold.sh: no kvbytes at '$KVBYTES' (make bench)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "fold.sh: python3 is needed" >&2; exit 2; }
mkdir -p "$SCRATCH"
SRC=$SCRATCH/$SHAPE-q8_0.gguf
OUT=$SCRATCH/$SHAPE-q8_0-kv$G-$POLICY.gguf
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-fold.XXXXXX")
wrote=""
cleanup() {
    if [ "${KEEP:-0}" != 1 ] && [ -n "$wrote" ]; then rm -f $wrote; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
echo "fold: $SHAPE, KV heads into $G, policy $POLICY, n_ctx $N_CTX, threads $THREADS"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); load: $(uptime | sed 's/.*load average: //')"
if [ ! -e "$SRC" ]; then
    wrote="$SRC"
    "$SPARROW" synth --shape "$SHAPE" --type q8_0 -o "$SRC" -t "$THREADS" -q
fi
wrote="$wrote $OUT"
"$SPARROW" quantize "$SRC" "$OUT" --policy "$POLICY" --merge-kv-heads "$G" -q -t "$THREADS" | tee "$tmp/quantize.txt"
for m in src out; do
    f=$SRC; [ $m = out ] && f=$OUT
    "$KVBYTES" "$f" "$N_CTX" > "$tmp/kv.$m.json"
    "$SPARROW" bench -m "$f" -p 16 -n 8 -r 1 -c "$N_CTX" -t "$THREADS" --json > "$tmp/bench.$m.json"
done
python3 - "$tmp" "$G" <<'EOF'
import json, sys
tmp, g = sys.argv[1], int(sys.argv[2])
ok = True
print("%-8s %4s %5s %13s %8s %13s %13s %13s %13s %10s %10s" % ("model", "kv", "ctx", "per position", "cells",
      "formula", "reserved", "session", "heap", "decode t/s", "peak RSS"))
kv = {}
for m in ("src", "out"):
    k = json.load(open("%s/kv.%s.json" % (tmp, m)))
    b = json.load(open("%s/bench.%s.json" % (tmp, m)))
    kv[m] = k
    print("%-8s %4d %5d %13d %8.2f %13d %13d %13d %13d %10.2f %6.2f GiB" % ("original" if m == "src" else "folded",
          k["n_kv_heads"], k["n_ctx"], k["kv_bytes_per_position"], k["kv_cells"], k["kv_bytes_formula"],
          k["kv_bytes_reserved"], k["kv_bytes_session"], k["kv_bytes_heap"], b["decode_tps"],
          b["peak_rss_bytes"] / 2**30))
    r = k["kv_bytes_reserved"]
    if not (r == k["kv_bytes_session"] == k["kv_bytes_heap"]) or r % k["kv_bytes_per_position"] or \
            r < k["kv_bytes_formula"]:
        print("MISMATCH: %s: the measured KV bytes are not the same three ways, or not a whole number (at least "
              "n_ctx) of positions of the formula's size" % m)
        ok = False
if kv["out"]["n_kv_heads"] != g:
    print("MISMATCH: the folded model has %d KV heads, not %d" % (kv["out"]["n_kv_heads"], g))
    ok = False
ratio = kv["out"]["kv_bytes_reserved"] / kv["src"]["kv_bytes_reserved"]
want = kv["out"]["n_kv_heads"] / kv["src"]["n_kv_heads"]
if kv["out"]["kv_cells"] != kv["src"]["kv_cells"] or abs(ratio - want) > 1e-12:
    print("MISMATCH: folded / original KV bytes %.6f, the heads say %.6f" % (ratio, want))
    ok = False
print("F16 cache: formula = n_layers x n_ctx x n_kv_heads x (head_dim_k + head_dim_v) x 2; the session reserves"
      " 'cells' positions of 'per position' bytes; folded / original = %.4f (%d / %d KV heads)" %
      (ratio, kv["out"]["n_kv_heads"], kv["src"]["n_kv_heads"]))
sys.exit(0 if ok else 1)
EOF

#!/bin/sh
# moe3.sh BASE NEW [LIMIT [BUDGET [REPS]]] -- two files of one MoE model under
# the memory wall, alternately (issue 21 acceptance 3): BASE (e.g. the Q4_0
# file) and NEW (e.g. the moe3 policy's), each run REPS times (default 3) by
# bench/memwall.sh in a fresh LIMIT cgroup (default 8G) with --mem-budget
# BUDGET (default 7.5G), page cache dropped before each run.  Prints each
# run's decode tok/s and bytes read per token, then the medians and the
# ratios NEW / BASE (decode speed up, bytes read down).
#
# Environment: SPARROW, MEMBW, RUNIO, THREADS, N_PROMPT (default 8), N_GEN
# (default 32) as memwall.sh takes them; KEEP a folder for the raw outputs.
# Needs root (cgroups, drop_caches) and python3.
set -eu
[ $# -ge 2 ] && [ $# -le 5 ] || {
    echo "usage: $0 BASE NEW [LIMIT [BUDGET [REPS]]]" >&2
    exit 2
}
BASE=$1 NEW=$2 LIMIT=${3:-8G} BUDGET=${4:-7.5G} REPS=${5:-3}
here=$(cd "$(dirname "$0")" && pwd)
export N_PROMPT=${N_PROMPT:-8} N_GEN=${N_GEN:-32}
keep=${KEEP:-$(mktemp -d)}
mkdir -p "$keep"
for f in "$BASE" "$NEW"; do
    [ -r "$f" ] || { echo "moe3.sh: cannot read '$f'" >&2; exit 1; }
done
i=1
while [ "$i" -le "$REPS" ]; do
    for which in base new; do
        f=$BASE
        [ "$which" = new ] && f=$NEW
        d="$keep/$which-$i"
        mkdir -p "$d"
        echo "moe3.sh: run $i of $REPS, $which: $f" >&2
        KEEP="$d" LLAMA_BENCH= LLAMA_COMPLETION= sh "$here/memwall.sh" "$f" "$LIMIT" "$BUDGET" > "$d/memwall.txt" 2>&1 || {
            echo "moe3.sh: memwall.sh failed on $f (see $d/memwall.txt)" >&2
            exit 1
        }
    done
    i=$((i + 1))
done
python3 - "$keep" "$REPS" "$BASE" "$NEW" <<'EOF'
import json, os, statistics, sys
keep, reps, base, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {"base": [], "new": []}
for which in rows:
    for i in range(1, reps + 1):
        with open(os.path.join(keep, f"{which}-{i}", "sparrow.json")) as fh:
            rows[which].append(json.load(fh))
print("| run | base decode tok/s | base read/token MiB | new decode tok/s | new read/token MiB |")
print("|---|---:|---:|---:|---:|")
for i in range(reps):
    b, n = rows["base"][i], rows["new"][i]
    print(f"| {i + 1} | {b['decode_tps']:.3f} | {b['bytes_read_per_token'] / 2**20:.1f} "
          f"| {n['decode_tps']:.3f} | {n['bytes_read_per_token'] / 2**20:.1f} |")
med = {w: (statistics.median(r["decode_tps"] for r in rows[w]),
           statistics.median(r["bytes_read_per_token"] for r in rows[w])) for w in rows}
print(f"| median | {med['base'][0]:.3f} | {med['base'][1] / 2**20:.1f} | {med['new'][0]:.3f} | {med['new'][1] / 2**20:.1f} |")
print(f"base: {base}\nnew:  {new}")
print(f"decode: new / base = {med['new'][0] / med['base'][0]:.3f}x (median of {reps}; per run: "
      + ", ".join(f"{n['decode_tps'] / b['decode_tps']:.3f}" for b, n in zip(rows['base'], rows['new'])) + ")")
print(f"bytes read per token: {100 * (1 - med['new'][1] / med['base'][1]):.1f}% lower")
EOF
echo "moe3.sh: raw outputs in $keep" >&2

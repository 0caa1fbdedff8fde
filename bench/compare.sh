#!/bin/sh
# compare.sh MODEL [THREADS] -- Sparrow against llama.cpp on one model file,
# the same prompt/generation lengths and threads, run alternately (Sparrow,
# then llama-bench) for ROUNDS rounds so that a noisy machine hurts both
# alike.  Prints a Markdown table of the medians (prefill and decode tok/s,
# peak RSS) with Sparrow/peer ratios, and the memory-bandwidth bound on
# decode: tok/s = read bandwidth (bench/membw, THREADS threads) / bytes a
# decoded token reads (Sparrow's model_bytes_per_token), with each engine's
# fraction of it.  docs/BENCHMARKS.md shows how the figures there were made.
#
# Environment:
#   LLAMA_BENCH   path of llama.cpp's llama-bench (required)
#   SPARROW       sparrow binary (default: build/sparrow beside this script)
#   MEMBW         membw binary (default: build/bench/membw; built by `make bench`)
#   ROUNDS        rounds, >= 3 recommended (default 3)
#   N_PROMPT, N_GEN   prompt and generated tokens (default 128 and 32)
#   DEPTH         tokens already in the context for both tests (llama-bench -d;
#                 default 0): long-context prefill and decode
#   CTK, CTV      KV cache types of keys and values for both engines (default
#                 f16; Sparrow also takes q4h)
#   LLAMA_FA      llama-bench's flash attention: on, off or auto (default: on
#                 with a depth or a quantized cache, else llama-bench's default)
#   LLAMA_REPS    llama-bench repetitions per call (-r; default 1)
#   SPARROW_ARGS  extra arguments for `sparrow bench` (e.g. "--weights mmap")
#   LLAMA_ARGS    extra arguments for llama-bench (e.g. "-fa off")
#   LLAMA_COMPLETION  llama.cpp's llama-completion (optional): run once after the
#                 rounds (-p "Once upon a time" -n 4 --perf), and its "load time" (from
#                 its perf output: model load plus warm-up) is reported beside
#                 Sparrow's load_s (llama-bench prints no load time)
#   KEEP          a folder to keep the raw JSON and time(1) outputs in
# Needs python3 (JSON) and GNU time at /usr/bin/time (Debian package `time`).
set -eu

usage() {
    echo "usage: LLAMA_BENCH=/path/to/llama-bench $0 MODEL [THREADS]" >&2
    exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
MODEL=$1
THREADS=${2:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
MEMBW=${MEMBW:-$root/build/bench/membw}
ROUNDS=${ROUNDS:-3}
N_PROMPT=${N_PROMPT:-128}
N_GEN=${N_GEN:-32}
DEPTH=${DEPTH:-0}
CTK=${CTK:-f16}
CTV=${CTV:-f16}
LLAMA_REPS=${LLAMA_REPS:-1}
if [ -z "${LLAMA_FA:-}" ]; then
    if [ "$DEPTH" -gt 0 ] || [ "$CTK" != f16 ] || [ "$CTV" != f16 ]; then LLAMA_FA=on; else LLAMA_FA=auto; fi
fi
SPARROW_ARGS=${SPARROW_ARGS:-}
LLAMA_ARGS=${LLAMA_ARGS:-}

if [ -z "${LLAMA_BENCH:-}" ]; then
    echo "compare.sh: LLAMA_BENCH is not set: point it at llama.cpp's llama-bench binary," >&2
    echo "            e.g. LLAMA_BENCH=/work/peer/llama.cpp/build/bin/llama-bench (docs/BENCHMARKS.md says how to build it)" >&2
    exit 2
fi
[ -x "$LLAMA_BENCH" ] || { echo "compare.sh: LLAMA_BENCH='$LLAMA_BENCH' is not an executable" >&2; exit 2; }
[ -x "$SPARROW" ] || { echo "compare.sh: no sparrow binary at '$SPARROW' (run make, or set SPARROW)" >&2; exit 2; }
[ -x "$MEMBW" ] || { echo "compare.sh: no membw binary at '$MEMBW' (run make bench, or set MEMBW)" >&2; exit 2; }
[ -r "$MODEL" ] || { echo "compare.sh: cannot read model '$MODEL'" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "compare.sh: /usr/bin/time is missing (install the Debian package 'time')" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare.sh: python3 is needed to read the JSON" >&2; exit 2; }
case $THREADS in '' | *[!0-9]*) usage ;; esac
case $ROUNDS in '' | *[!0-9]* | 0) echo "compare.sh: ROUNDS must be a positive integer" >&2; exit 2 ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-compare.XXXXXX")
cleanup() {
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$tmp"/* "$KEEP"/ 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

echo "compare.sh: $(basename "$MODEL"), $THREADS threads, d=$DEPTH p=$N_PROMPT n=$N_GEN, cache $CTK/$CTV, $ROUNDS rounds" >&2
# Memory bandwidth before and after the rounds (the higher median is the
# bound: contention from other work only lowers it), and the load average,
# which says how quiet the machine was.
echo "  membw: memory read bandwidth with $THREADS threads ..." >&2
"$MEMBW" --threads "$THREADS" --json >"$tmp/membw.0.json"
cut -d' ' -f1-3 /proc/loadavg >"$tmp/loadavg.start"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "  round $r/$ROUNDS: sparrow bench ..." >&2
    # shellcheck disable=SC2086 # SPARROW_ARGS is a word list on purpose
    "$SPARROW" bench -m "$MODEL" -d "$DEPTH" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" -ctk "$CTK" -ctv "$CTV" \
        --json $SPARROW_ARGS \
        >"$tmp/sparrow.$r.json" 2>"$tmp/sparrow.$r.err" || {
        echo "compare.sh: sparrow bench failed:" >&2; cat "$tmp/sparrow.$r.err" >&2; exit 1; }
    echo "  round $r/$ROUNDS: llama-bench ..." >&2
    # shellcheck disable=SC2086
    /usr/bin/time -v -o "$tmp/llama.$r.time" "$LLAMA_BENCH" -m "$MODEL" -d "$DEPTH" -p "$N_PROMPT" -n "$N_GEN" \
        -t "$THREADS" -ctk "$CTK" -ctv "$CTV" -fa "$LLAMA_FA" -r "$LLAMA_REPS" -o json $LLAMA_ARGS \
        >"$tmp/llama.$r.json" 2>"$tmp/llama.$r.err" || {
        echo "compare.sh: llama-bench failed:" >&2; tail -n 20 "$tmp/llama.$r.err" >&2; exit 1; }
    r=$((r + 1))
done
if [ -n "${LLAMA_COMPLETION:-}" ]; then
    [ -x "$LLAMA_COMPLETION" ] || { echo "compare.sh: LLAMA_COMPLETION='$LLAMA_COMPLETION' is not an executable" >&2; exit 2; }
    echo "  llama-completion: load time ..." >&2
    "$LLAMA_COMPLETION" -m "$MODEL" -p "Once upon a time" -n 4 -t "$THREADS" -no-cnv --seed 1 --perf </dev/null \
        >"$tmp/completion.out" 2>"$tmp/completion.err" || {
        echo "compare.sh: llama-completion failed:" >&2; tail -n 20 "$tmp/completion.err" >&2; exit 1; }
    sed -n 's/.*load time = *\([0-9.]*\) ms.*/\1/p' "$tmp/completion.err" "$tmp/completion.out" | head -n 1 >"$tmp/peer_load"
    [ -s "$tmp/peer_load" ] || { echo "compare.sh: no 'load time = X ms' in llama-completion's output" >&2; exit 1; }
fi
cut -d' ' -f1-3 /proc/loadavg >"$tmp/loadavg.end"
echo "  membw: memory read bandwidth with $THREADS threads ..." >&2
"$MEMBW" --threads "$THREADS" --json >"$tmp/membw.1.json"

python3 - "$tmp" "$ROUNDS" "$MODEL" "$THREADS" <<'EOF'
import json, os, re, statistics, sys

tmp, rounds, model, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
med = statistics.median
sp, ll_pp, ll_tg, ll_rss = [], [], [], []
for r in range(1, rounds + 1):
    sp.append(json.load(open(os.path.join(tmp, "sparrow.%d.json" % r))))
    tests = json.load(open(os.path.join(tmp, "llama.%d.json" % r)))
    for t in tests:
        # each repetition of a call counts (llama-bench -r: its samples_ts)
        ts = t.get("samples_ts") or [t["avg_ts"]]
        if t.get("n_prompt", 0) > 0 and t.get("n_gen", 0) == 0:
            ll_pp.extend(ts)
        elif t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0:
            ll_tg.extend(ts)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(os.path.join(tmp, "llama.%d.time" % r)).read())
    ll_rss.append(int(m.group(1)) * 1024 if m else float("nan"))
peer = tests[0] if tests else {}
bws = [json.load(open(os.path.join(tmp, "membw.%d.json" % k))) for k in (0, 1)]
bw_all = [next(x["gbps_median"] for x in b["results"] if x["threads"] == threads) for b in bws]
bw, bw_gbps = bws[0], max(bw_all)
load = [open(os.path.join(tmp, "loadavg." + k)).read().split() for k in ("start", "end")]
bpt = sp[0]["model_bytes_per_token"]
kvpt = med([s.get("kv_bytes_per_token") or 0 for s in sp])
bound = bw_gbps * 1e9 / (bpt + kvpt)

def col(key):
    return [s[key] for s in sp if s.get(key) is not None]

s_pp, s_tg, s_rss = med(col("prefill_tps")), med(col("decode_tps")), med(col("peak_rss_bytes"))
p_pp, p_tg, p_rss = med(ll_pp), med(ll_tg), med(ll_rss)
MiB = 1048576.0
def ratio(a, b):
    return "%.2f" % (a / b) if b else "-"
def spread(v):
    return "%.0f%%" % (100.0 * (max(v) - min(v)) / med(v)) if len(v) > 1 and med(v) else "-"

print("model: %s (%.2f GiB of tensors, %.1f MiB of weights + %.1f MiB of KV cache read per decoded token)" %
      (os.path.basename(model), sp[0]["model_tensor_bytes"] / 1073741824.0, bpt / MiB, kvpt / MiB))
print("threads %d, depth %d, prompt %d, gen %d, cache %s/%s, %d rounds (medians; spread = (max-min)/median over "
      "the rounds)" % (threads, sp[0].get("n_depth", 0), sp[0]["n_prompt"], sp[0]["n_gen"],
                       sp[0].get("cache_type_k", "?"), sp[0].get("cache_type_v", "?"), rounds))
print("peer: llama.cpp build %s (%s), %s, flash_attn %s, type_k %s, n_batch %s, n_ubatch %s" %
      (peer.get("build_commit", "?"), peer.get("build_number", "?"), peer.get("backends", "?"),
       peer.get("flash_attn", "?"), peer.get("type_k", "?"), peer.get("n_batch", "?"), peer.get("n_ubatch", "?")))
print("sparrow: weights %s, kv %s, batch %s" % (sp[0].get("weights", "?"), sp[0].get("kv_type", "?"),
                                                  sp[0].get("n_batch") or "default"))
print()
print("| metric | Sparrow | llama.cpp | Sparrow / llama.cpp | spread (S / L) |")
print("|---|---:|---:|---:|---:|")
print("| prefill tok/s (pp%d) | %.2f | %.2f | %s | %s / %s |" % (sp[0]["n_prompt"], s_pp, p_pp, ratio(s_pp, p_pp),
                                                                 spread(col("prefill_tps")), spread(ll_pp)))
print("| decode tok/s (tg%d) | %.2f | %.2f | %s | %s / %s |" % (sp[0]["n_gen"], s_tg, p_tg, ratio(s_tg, p_tg),
                                                                spread(col("decode_tps")), spread(ll_tg)))
print("| decode ms/token | %.1f | %.1f | %s | |" % (1000.0 / s_tg, 1000.0 / p_tg, ratio(p_tg, s_tg)))
print("| peak RSS MiB | %.0f | %.0f | %s | %s / %s |" % (s_rss / MiB, p_rss / MiB, ratio(s_rss, p_rss),
                                                        spread(col("peak_rss_bytes")), spread(ll_rss)))
pl = os.path.join(tmp, "peer_load")
peer_load = float(open(pl).read().split()[0]) / 1000.0 if os.path.exists(pl) else None
if peer_load is None:
    print("| load s (Sparrow: load + session) | %.2f | - | | %s / - |" % (med(col("load_s")), spread(col("load_s"))))
else:  # llama-completion's "load time": its model load and warm-up, one run
    print("| load s (Sparrow: load + session; llama.cpp: llama-completion's load time, 1 run) | %.2f | %.2f | %s | %s / - |"
          % (med(col("load_s")), peer_load, ratio(med(col("load_s")), peer_load), spread(col("load_s"))))
if col("first_token_from_start_s"):
    print("| process start to first token s (Sparrow) | %.2f | - | | %s / - |"
          % (med(col("first_token_from_start_s")), spread(col("first_token_from_start_s"))))
print("| time to first token s | %.2f | - | | %s / - |" % (med(col("ttft_s")), spread(col("ttft_s"))))
print()
print("memory bandwidth (membw, %d threads, %s loads, median of 5 passes; before / after the rounds): "
      "%.2f / %.2f GB/s -> decode bound %.2f tok/s (weights + KV bytes per token / the higher)" %
      (threads, bw.get("kernel", "?"), bw_all[0], bw_all[1], bound))
print("fraction of the bound: Sparrow %.0f%%, llama.cpp %.0f%%" % (100.0 * s_tg / bound, 100.0 * p_tg / bound))
d0, n0, p0 = sp[0].get("n_depth", 0), sp[0]["n_gen"], sp[0]["n_prompt"]
if kvpt > 0:
    cell = kvpt / (d0 + (n0 + 1) / 2.0)  # bytes one token's K and V take in these types (the same in both engines)
    sp_ctx = sp[0]["n_ctx"]
    sp_cells = ((sp_ctx + 31) // 32 + 3) * 32  # Sparrow's quota: whole blocks of 32, 3 spare
    ll_cells = (d0 + p0 + n0 + 255) // 256 * 256  # llama-bench's n_ctx, padded to 256
    print("KV cache: %.1f KiB per token in both engines; allocated for the test: Sparrow %.1f MiB (%d cells), "
          "llama.cpp %.1f MiB (%d cells)" % (cell / 1024.0, sp_cells * cell / MiB, sp_cells, ll_cells * cell / MiB,
                                             ll_cells))
print()
print("load average (1/5/15 min) at the start: %s, at the end: %s" % (" ".join(load[0]), " ".join(load[1])))
print("per round: Sparrow prefill/decode tok/s | llama.cpp prefill/decode tok/s")
for r in range(rounds):
    pp = ll_pp[r] if r < len(ll_pp) else float("nan")
    tg = ll_tg[r] if r < len(ll_tg) else float("nan")
    dec = sp[r]["decode_tps"] if sp[r]["decode_tps"] is not None else float("nan")
    print("  %d: %.2f / %.2f | %.2f / %.2f" % (r + 1, sp[r]["prefill_tps"], dec, pp, tg))
EOF

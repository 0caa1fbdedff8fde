#!/bin/sh
# test_synth.sh -- black-box tests of `sparrow synth` and `sparrow bench`:
# usage errors, --list, every file type of the tiny shape written and run,
# policies (--policy, --policy-file: native types written directly),
# atomic output (a failed write leaves no file and no temporary behind), and
# bench's table and JSON (keys present, numbers positive).  The numerics of
# synth are tested in test_synth.c.  Run by tests/run.sh with SPARROW = the
# binary.  Needs python3 to read the JSON.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}

name=synth
. "$root/tests/lib/harness.sh"
t_rc() {
    if [ "$rc" -eq "$2" ]; then ok "$1: exit $2"; else bad "$1: exit $rc, want $2" "$(show_err)"; fi
}
t_usage() {
    name=$1; shift
    sp "$@"
    t_rc "$name" 2
    lines=$(wc -l <"$tmp/err" | tr -d ' ')
    if [ "$lines" = 1 ] && grep -q '^sparrow: ' "$tmp/err" && [ ! -s "$tmp/out" ]; then ok "$name: one-line error"; else
        bad "$name: want one 'sparrow: ' line on stderr and nothing on stdout" "$(show_err)"; fi
}
t_has() { # t_has NAME FILE STRING...
    name=$1; hf=$2; shift 2
    for s in "$@"; do
        if grep -qF -e "$s" "$hf"; then ok "$name: has '$s'"; else bad "$name: lacks '$s'" "$(head -c 400 "$hf")"; fi
    done
}
t_nofile() { # t_nofile NAME PATH: neither PATH nor a temporary of it exists
    if [ ! -e "$2" ] && [ -z "$(ls "$tmp" | grep -F "$(basename "$2").tmp." || true)" ]; then ok "$1: no file left"; else
        bad "$1: a file was left behind" "$(ls -la "$tmp")"; fi
}

# ---- help and usage errors -------------------------------------------------------
sp --help
t_has "--help" "$tmp/out" "synth" "bench"
sp synth --help
t_rc "synth --help" 0
t_has "synth --help" "$tmp/out" "--shape" "--type" "-o, --output" "--seed" "--list" "q4_k_m"
sp bench --help
t_rc "bench --help" 0
t_has "bench --help" "$tmp/out" "-p, --n-prompt" "-n, --n-gen" "-r, --reps" "-t, --threads" "-c, --ctx-size" \
    "-b, --batch" "--json" "--cold" "peak_rss_bytes" "bytes_read_per_token"
sp run --help
t_has "run --help" "$tmp/out" "-b, --batch"

t_usage "synth: no shape" synth --type q4_0 -o "$tmp/x.gguf"
t_usage "synth: no type" synth --shape tiny -o "$tmp/x.gguf"
t_usage "synth: no output" synth --shape tiny --type q4_0
t_usage "synth: bad shape" synth --shape llama-9b --type q4_0 -o "$tmp/x.gguf"
t_has "synth: bad shape" "$tmp/err" "unknown shape 'llama-9b'"
t_usage "synth: bad type" synth --shape tiny --type q3_k -o "$tmp/x.gguf"
t_has "synth: bad type" "$tmp/err" "unknown type 'q3_k'"
t_usage "synth: bad seed" synth --shape tiny --type q4_0 -o "$tmp/x.gguf" --seed -1
t_usage "synth: stray argument" synth --shape tiny --type q4_0 -o "$tmp/x.gguf" extra
t_usage "synth: type and policy" synth --shape tiny --type q4_0 --policy q4 -o "$tmp/x.gguf"
t_has "synth: type and policy" "$tmp/err" "exclude each other"
t_usage "synth: bad policy" synth --shape tiny --policy mem5 -o "$tmp/x.gguf"
t_has "synth: bad policy" "$tmp/err" "unknown policy 'mem5'"
printf '* i4_b64\n*_exps.weight i4_b65\n' >"$tmp/bad-policy.txt"
sp synth --shape tiny-moe --policy-file "$tmp/bad-policy.txt" -o "$tmp/x.gguf"
t_rc "synth: malformed policy file" 1
t_has "synth: malformed policy file" "$tmp/err" "bad-policy.txt' line 2: unknown type 'i4_b65'"
t_nofile "synth: usage errors" "$tmp/x.gguf"
t_usage "bench: no model" bench -p 8
t_usage "bench: -p 0" bench -m x.gguf -p 0
t_usage "bench: -r 0" bench -m x.gguf -r 0
t_usage "bench: ctx too small" bench -m x.gguf -d 4 -p 8 -n 8 -c 12
t_usage "run: -b -1" run -m x.gguf -b -1

# ---- --list --------------------------------------------------------------------------
sp synth --list
t_rc "synth --list" 0
t_has "synth --list" "$tmp/out" "tiny" "llama-7b" "llama3-8b" "llama-34b" "qwen3-30b-a3b" "f16" "bf16" "q8_0" \
    "q4_0" "q4_k_m" "GiB" "moe3"

# ---- every type writes a file that runs --------------------------------------------
for t in f16 bf16 q8_0 q4_0 q4_k_m; do
    f="$tmp/tiny-$t.gguf"
    sp synth --shape tiny --type "$t" -o "$f" --seed 5 -t 2
    t_rc "synth tiny $t" 0
    t_has "synth tiny $t" "$tmp/err" "wrote $f"
    sp run -m "$f" -p "hi" -n 8 --temp 0 -t 1 -b 4
    t_rc "run tiny $t" 0
    if [ -s "$tmp/out" ]; then ok "run tiny $t: output"; else bad "run tiny $t: no output" "$(show_err)"; fi
done
# ---- the MoE shape runs through run, inspect and bench ------------------------------
f="$tmp/tiny-moe-q8_0.gguf"
sp synth --shape tiny-moe --type q8_0 -o "$f" --seed 5 -t 2 -q
t_rc "synth tiny-moe q8_0" 0
sp run -m "$f" -p "hi" -n 8 --temp 0 -t 2 -b 4
t_rc "run tiny-moe" 0
if [ -s "$tmp/out" ]; then ok "run tiny-moe: output"; else bad "run tiny-moe: no output" "$(show_err)"; fi
sp inspect "$f"
t_rc "inspect tiny-moe" 0
t_has "inspect tiny-moe" "$tmp/out" "qwen3moe" "ffn_gate_exps" "ffn_down_exps"
if grep -Eq '^ +n_experts +8$' "$tmp/out" && grep -Eq '^ +n_experts_used +2$' "$tmp/out" &&
    grep -Eq '^ +n_ff_exp +256$' "$tmp/out"; then ok "inspect tiny-moe: expert counts"; else
    bad "inspect tiny-moe: expert counts" "$(grep -i expert "$tmp/out" | head -5)"; fi
sp bench -m "$f" -p 16 -n 4 -r 1 -t 2 --json
t_rc "bench tiny-moe" 0
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["decode_tps"] > 0 and d["prefill_tps"] > 0 and 0 < d["model_bytes_per_token"] < d["model_file_size"]' "$tmp/out" 2>"$tmp/py"; then
    ok "bench tiny-moe: figures"; else bad "bench tiny-moe" "$(cat "$tmp/py")" "$(head -c 300 "$tmp/out")"; fi

# ---- policies: native types, the file runs and inspect shows them ----------------------
f="$tmp/tiny-moe-moe3.gguf"
sp synth --shape tiny-moe --policy moe3 -o "$f" --seed 5 -t 2
t_rc "synth tiny-moe moe3" 0
t_has "synth tiny-moe moe3" "$tmp/err" "synth tiny-moe moe3 seed 5" "wrote $f"
sp run -m "$f" -p "hi" -n 8 --temp 0 -t 2 -b 4
t_rc "run tiny-moe moe3" 0
if [ -s "$tmp/out" ]; then ok "run tiny-moe moe3: output"; else bad "run tiny-moe moe3: no output" "$(show_err)"; fi
sp inspect "$f"
t_rc "inspect tiny-moe moe3" 0
t_has "inspect tiny-moe moe3" "$tmp/out" "sparrow-synth tiny-moe moe3" "i3_b64" "i6_b64_l8" "i4n_b32_l8" \
    "native-types-2" "sparrow.quant.policy"
if grep -E 'ffn_up_exps' "$tmp/out" | grep -q 'i3_b64'; then ok "inspect tiny-moe moe3: experts i3_b64"; else
    bad "inspect tiny-moe moe3: experts" "$(grep exps "$tmp/out" | head -3)"; fi
sp synth --shape tiny-moe --policy moe3 -o "$tmp/again-moe3.gguf" --seed 5 -t 1 -q
if cmp -s "$tmp/again-moe3.gguf" "$f"; then ok "synth moe3: same seed, same bytes"; else
    bad "synth moe3: same seed and policy gave different files"; fi
printf '# all 8-bit\n* i8_b32\n' >"$tmp/p8.txt"
sp synth --shape tiny --policy-file "$tmp/p8.txt" -o "$tmp/tiny-p8.gguf" -t 2 -q
t_rc "synth tiny --policy-file" 0
sp run -m "$tmp/tiny-p8.gguf" -p "hi" -n 4 --temp 0 -t 1
t_rc "run tiny --policy-file" 0
sp inspect "$tmp/tiny-p8.gguf"
t_has "inspect tiny --policy-file" "$tmp/out" "i8_b32" "native-types-1"
rm -f "$tmp/again-moe3.gguf" "$tmp/tiny-p8.gguf"

sp inspect "$tmp/tiny-q4_k_m.gguf"
t_has "inspect tiny q4_k_m" "$tmp/out" "sparrow-synth tiny q4_k_m" "Q6_K" "Q4_K" "sparrow.synth.seed"
sp synth --shape tiny --type q4_0 -o "$tmp/again.gguf" --seed 5 -t 1 -q
t_rc "synth -q" 0
if [ ! -s "$tmp/err" ]; then ok "synth -q: quiet"; else bad "synth -q: stderr not empty" "$(show_err)"; fi
if cmp -s "$tmp/again.gguf" "$tmp/tiny-q4_0.gguf"; then ok "synth: same seed, same bytes"; else
    bad "synth: same seed and type gave different files"; fi

# ---- atomic output ----------------------------------------------------------------------
sp synth --shape tiny --type q4_0 -o "$tmp/no/such/dir/x.gguf"
t_rc "synth: missing folder" 1
if grep -q '^sparrow: .*no/such/dir' "$tmp/err"; then ok "synth: missing folder message"; else
    bad "synth: missing folder message" "$(show_err)"; fi
# A write that fails midway (file size limit; SIGXFSZ ignored so write() fails
# with EFBIG): exit 1, no file, no temporary, an existing file untouched.
printf 'old' >"$tmp/keep.gguf"
(trap '' XFSZ; ulimit -f 200; exec "$SPARROW" synth --shape tiny --type f16 -o "$tmp/keep.gguf" -q) >"$tmp/out" 2>"$tmp/err"
rc=$?
t_rc "synth: disk full midway" 1
if [ "$(cat "$tmp/keep.gguf")" = old ]; then ok "synth: existing file untouched"; else bad "synth: existing file changed"; fi
rm -f "$tmp/keep.gguf"
t_nofile "synth: disk full midway" "$tmp/keep.gguf"

# ---- bench ----------------------------------------------------------------------------------
sp bench -m "$tmp/tiny-q4_0.gguf" -p 16 -n 4 -r 2 -t 1
t_rc "bench table" 0
t_has "bench table" "$tmp/out" "prefill t/s" "decode t/s" "peak RSS MiB" "med"
sp bench -m "$tmp/tiny-q4_k_m.gguf" -p 16 -n 4 -r 3 -t 2 -b 8 --json
t_rc "bench --json" 0
if python3 - "$tmp/out" <<'EOF' >"$tmp/py" 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
pos = ["load_s", "ttft_s", "prefill_tps", "decode_tps", "decode_ms_per_token", "peak_rss_bytes", "rchar",
       "model_bytes_per_token", "model_file_size"]
nonneg = ["bytes_read", "bytes_read_per_token"]
for k in pos + nonneg + ["model", "threads", "n_prompt", "n_gen", "reps", "runs"]:
    assert k in d, "missing key " + k
for k in pos:
    assert d[k] > 0, "%s = %r" % (k, d[k])
for k in nonneg:
    assert d[k] >= 0, "%s = %r" % (k, d[k])
assert d["threads"] == 2 and d["n_prompt"] == 16 and d["n_gen"] == 4 and d["reps"] == 3 and d["n_batch"] == 8
assert len(d["runs"]) == 3
for r in d["runs"]:
    for k in ["load_s", "ttft_s", "prefill_tps", "decode_tps", "decode_ms_per_token", "peak_rss_bytes"]:
        assert r[k] > 0, "run %s = %r" % (k, r[k])
    assert r["bytes_read"] >= 0 and r["bytes_read_per_token"] >= 0
# the top level holds the medians
for k in ["prefill_tps", "decode_tps", "peak_rss_bytes"]:
    assert sorted(r[k] for r in d["runs"])[1] == d[k], k
assert abs(d["decode_ms_per_token"] * d["decode_tps"] - 1000) < 1e-3 * 1000 or len(d["runs"]) > 1
# process start to the first sampled token: the first repetition's load and prompt, and more
f = d["first_token_from_start_s"]
r0 = d["runs"][0]
assert f > 0 and f >= r0["load_s"] + r0["ttft_s"] and f < 600, "first_token_from_start_s = %r (run 1: load %r, ttft %r)" % (f, r0["load_s"], r0["ttft_s"])
EOF
then ok "bench --json: keys and values"; else bad "bench --json" "$(cat "$tmp/py")" "$(head -c 400 "$tmp/out")"; fi
sp bench -m "$tmp/tiny-q4_0.gguf" -p 8 -n 0 -r 1 --cold --json
t_rc "bench -n 0 --cold" 0
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["cold"] and d["decode_tps"] is None and d["prefill_tps"] > 0' "$tmp/out" 2>"$tmp/py"; then
    ok "bench -n 0: decode is null"; else bad "bench -n 0" "$(cat "$tmp/py")" "$(head -c 300 "$tmp/out")"; fi
sp bench -m "$tmp/missing.gguf" -p 8 -n 2 -r 1
t_rc "bench: missing model" 1

harness_report

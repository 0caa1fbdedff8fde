#!/bin/sh
# test_eval.sh -- black-box tests of `sparrow eval`: usage errors (exit 2, one
# line), runtime errors (exit 1: missing files, a text shorter than 2 x CTX,
# a reference that cannot run), the --json object (keys, nulls without --ref,
# perplexity of the F32 stories260K file against llama-perplexity's golden),
# the human summary and per-chunk progress, --ref figures on a quantized file,
# and --gen (deterministic per seed).  The numerics are tested in
# test_eval.c.  Run by tests/run.sh with SPARROW = the binary and
# SPARROW_SHARED = the fixtures folder.  Needs python3 to read the JSON.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}

name=eval
. "$root/tests/lib/harness.sh"

if [ ! -x "$SPARROW" ]; then
    echo "FAIL sparrow binary not found at $SPARROW (build it first)"
    exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "FAIL python3 not found: it is needed to read eval's JSON"
    exit 1
fi

# t_json NAME PYTHON-EXPR...: each expression is true of j = the JSON on stdout
t_json() {
    tname=$1; shift
    for e in "$@"; do
        if python3 -c '
import json, math, sys
j = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2]) else 1)
' "$tmp/out" "$e" 2>"$tmp/pyerr"; then ok "$tname: $e"; else bad "$tname: not $e" "$(show_out)" "$(head -c 300 "$tmp/pyerr")"; fi
    done
}

F32=models/stories260K/stories260K-f32.gguf
Q4=models/stories260K/stories260K-q4_0.gguf
TEXT=peer-golden/tinystories-valid-excerpt.txt
need "$F32" && f32=$fx || f32=/nonexistent
need "$Q4" && q4=$fx || q4=/nonexistent
need "$TEXT" && text=$fx || text=/nonexistent
# The first ~2000 bytes: enough tokens for a few chunks of 128, quick to run.
head -c 3000 "$text" >"$tmp/short.txt"
printf 'Once upon a time, there was a cat.\n' >"$tmp/tiny.txt"

# ---- help and usage errors ---------------------------------------------------------
sp --help
t_out_has "sparrow --help" "eval"
sp eval --help
t_rc "eval --help" 0
t_out_has "eval --help" "usage: sparrow eval -m MODEL [--ref REFERENCE_MODEL] (--text FILE | --gen N)" \
    "--json" "kl_p99" "top1_agree" "bpw" "exit status"
t_usage "eval: no -m" eval --text "$text"
t_usage "eval: no text" eval -m "$f32"
t_usage "eval: --text and --gen" eval -m "$f32" --ref "$f32" --text "$text" --gen 512
t_usage "eval: --gen without --ref" eval -m "$q4" --gen 512
t_usage "eval: --gen 0" eval -m "$q4" --ref "$f32" --gen 0
t_usage "eval: --gen x" eval -m "$q4" --ref "$f32" --gen x
t_usage "eval: -c 3" eval -m "$f32" --text "$text" -c 3
t_usage "eval: -c -1" eval -m "$f32" --text "$text" -c -1
t_usage "eval: --seed without --gen" eval -m "$f32" --text "$text" --seed 1
t_usage "eval: --json=1" eval -m "$f32" --text "$text" --json=1
t_usage "eval: unknown option" eval -m "$f32" --text "$text" --frobnicate
t_usage "eval: stray argument" eval -m "$f32" "$text"

# ---- runtime errors --------------------------------------------------------------------
sp eval -m "$tmp/missing.gguf" --text "$text"
t_rc "eval: missing model" 1
t_err_one_line "eval: missing model"
sp eval -m "$f32" --text "$tmp/missing.txt"
t_rc "eval: missing text" 1
t_err_one_line "eval: missing text"
sp eval -m "$f32" --text "$tmp/tiny.txt" -c 128
t_rc "eval: text too short" 1
t_err_one_line "eval: text too short"
t_err_has "eval: text too short" "need at least 256"
t_empty_out "eval: text too short"
sp eval -m "$q4" --ref "$f32" --gen 255 -c 128
t_rc "eval: --gen too short" 1
t_err_has "eval: --gen too short" "need at least 256"
# a reference of the same vocabulary size (512) but other tokens: refused before sampling anything
sp synth --shape tiny --type f16 -q -o "$tmp/other-vocab.gguf"
for mode in "--gen 512" "--text $text"; do
    # shellcheck disable=SC2086
    sp eval -m "$f32" --ref "$tmp/other-vocab.gguf" $mode -c 128
    t_rc "eval: same-size other vocabulary ($mode)" 1
    t_err_one_line "eval: same-size other vocabulary ($mode)"
    t_err_has "eval: same-size other vocabulary ($mode)" "vocabulary" "differs from the reference's" "token "
    t_empty_out "eval: same-size other vocabulary ($mode)"
done
if need peer-tests/tokenizer/ggml-vocab-llama-spm.gguf; then
    sp eval -m "$f32" --ref "$fx" --text "$text"
    t_rc "eval: vocabulary-only reference" 1
    t_err_one_line "eval: vocabulary-only reference"
fi

# ---- perplexity, JSON: the llama-perplexity golden -----------------------------------
sp eval -m "$f32" --text "$text" -c 128 --json -t 1
t_rc "eval f32 --json" 0
t_json "eval f32 --json" \
    'all(k in j for k in ("ppl", "ref_ppl", "kl_mean", "kl_p99", "top1_agree", "bpw", "n_tokens", "n_chunks", "ctx", "ppl_err"))' \
    'abs(j["ppl"] - 3.7191) < 2e-4 * 3.7191 + 5e-5' 'abs(j["ppl_err"] - 0.10604) < 1e-3 * 0.10604 + 5e-6' \
    'j["n_tokens"] == 7159 and j["n_chunks"] == 55 and j["ctx"] == 128 and j["n_scored"] == 55 * 63' \
    'j["ref_ppl"] is None and j["kl_mean"] is None and j["kl_p99"] is None and j["top1_agree"] is None' \
    'j["bpw"] == 32' 'j["gen"] is None and j["ref"] is None'
t_err_has "eval f32 --json" "[1/55] ppl 3.3682" "[55/55] ppl 3.7191"

# ---- human summary, text on stdin, --ref -----------------------------------------------
"$SPARROW" eval -m "$q4" --ref "$f32" --text - -c 128 -t 1 <"$tmp/short.txt" >"$tmp/out" 2>"$tmp/err"
rc=$?
t_rc "eval q4_0 --ref f32 (stdin)" 0
t_out_has "eval q4_0 --ref f32 (stdin)" "ppl  " "ref_ppl  " "kl_mean  " "kl_p99  " "top1_agree  " "bpw  " "+/-"
t_err_has "eval q4_0 --ref f32 (stdin)" "[1/" " kl "
sp eval -m "$q4" --ref "$f32" --text "$tmp/short.txt" -c 128 --json -t 1
t_rc "eval q4_0 --ref f32 --json" 0
t_json "eval q4_0 --ref f32 --json" \
    'j["ref_ppl"] < j["ppl"] and j["kl_mean"] > 0 and j["kl_p99"] > j["kl_mean"] and j["kl_max"] >= j["kl_p99"]' \
    '0.5 < j["top1_agree"] < 1' 'abs(j["bpw"] * j["n_params"] / 8 - j["tensor_bytes"]) < 1e-6 * j["tensor_bytes"]' \
    '4 < j["bpw"] < 8 and j["tensor_bytes"] < j["file_size"]' 'j["n_chunks"] == j["n_tokens"] // 128'
cp "$tmp/out" "$tmp/q4.json"
sp eval -m "$f32" --ref "$f32" --text "$tmp/short.txt" -c 128 --json -t 1
t_json "eval f32 --ref f32" 'j["kl_mean"] == 0 and j["kl_p99"] == 0 and j["top1_agree"] == 1' \
    'j["ref_ppl"] == j["ppl"]'

# ---- --gen ----------------------------------------------------------------------------------
sp eval -m "$q4" --ref "$f32" --gen 512 -c 128 --json -t 1
t_rc "eval --gen 512" 0
t_json "eval --gen 512" 'j["gen"] == 512 and j["n_tokens"] == 512 and j["n_chunks"] == 4 and j["text"] is None' \
    'j["seed"] is not None and j["kl_mean"] > 0 and 0 < j["top1_agree"] < 1'
cp "$tmp/out" "$tmp/gen1.json"
sp eval -m "$q4" --ref "$f32" --gen 512 -c 128 --json -t 1
if cmp -s "$tmp/out" "$tmp/gen1.json"; then ok "eval --gen: same output twice"; else
    bad "eval --gen: output differs between runs" "$(show_out)"; fi
sp eval -m "$q4" --ref "$f32" --gen 512 -c 128 --json -t 1 --seed 99
t_json "eval --gen --seed 99" 'j["seed"] == 99'
if ! cmp -s "$tmp/out" "$tmp/gen1.json"; then ok "eval --gen: another seed, another text"; else
    bad "eval --gen: --seed changed nothing"; fi

# ---- KV cache types: q4h against q4_0 in the same run --------------------------------------
# On the tiny-qwen F32 files (32-wide heads) and the first 6000 bytes of the
# excerpt, each model against itself with an F32 cache: q4h's KL must stay
# under half of q4_0's at the same 4.5 bits (issue 15's bar, against
# llama.cpp's q4_0, which ours matches).  Its value-bias rewrite (qwen2) and
# key balance (qwen3's q/k norms) are exact only if done right (a wrong RoPE
# pairing or a lost bias shows up as a larger KL), and its trellis code
# must decode what was stored.  Ratios measured: qwen2 0.446, qwen3 0.380
# (with q4h's 4-bit levels before the trellis code 0.61 and 0.49).
# A quality figure, not a memory check: skipped in the sanitizer build
# (SPARROW_SANITIZED, make asan), where q4h's trellis search alone took
# minutes of CI's 30; test_kv and test_session run q4h's code under ASan.
head -c 6000 "$text" >"$tmp/kv.txt"
qms="qwen2:0.48 qwen3:0.42"
[ -n "${SPARROW_SANITIZED:-}" ] && { echo "skip q4h vs q4_0 quality: sanitizer build"; qms=; }
for qm in $qms; do
    model=${qm%%:*} ratio=${qm#*:}
    if need "models/tiny-qwen/tiny-$model-f32.gguf"; then
        for ct in q4_0 q4h; do
            sp eval -m "$fx" --ref "$fx" -ctk $ct -ctv $ct --text "$tmp/kv.txt" -c 128 --json -t 1
            t_rc "eval tiny-$model -ctk $ct -ctv $ct" 0
            cp "$tmp/out" "$tmp/kv-$ct.json"
        done
        t_json "eval tiny-$model q4h vs q4_0" 'j["kv_bits_per_value"] == 4.5' \
            "j['kl_mean'] <= $ratio * json.load(open('$tmp/kv-q4_0.json'))['kl_mean']"
    fi
done

harness_report eval

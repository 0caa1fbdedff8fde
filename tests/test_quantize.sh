#!/bin/sh
# test_quantize.sh -- black-box tests of `sparrow quantize`: help, usage
# errors (exit 2, one line), a malformed policy file refused with its line
# (exit 1, no output left), a quantized stories260K that runs and says in its
# metadata what it needs, the llama2.c input with pruning, KV heads folded
# (and a count that does not divide them refused), synthetic F16 and
# Q8_0 inputs (Q4_0 refused), and an existing output left as it was when a
# run fails.  Numbers (bpw, quality) are checked
# in test_quantize.c.  Run by tests/run.sh with SPARROW = the binary.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SHARED=${SPARROW_SHARED:-$root/../shared}
M=$SHARED/models/stories260K

name=quantize
. "$root/tests/lib/harness.sh"

# expect NAME RC ARGS...: run sparrow quantize, check the exit status
expect() {
    what=$1; want=$2; shift 2
    sp quantize "$@"
    if [ "$rc" -eq "$want" ]; then ok "$what: exit $want"; else bad "$what: exit $rc, want $want" "$(show_err)"; fi
}
# usage NAME ARGS...: exit 2 with one 'sparrow: ' line and no stdout
usage() {
    what=$1; shift
    expect "$what" 2 "$@"
    if [ "$(wc -l <"$tmp/err" | tr -d ' ')" = 1 ] && grep -q '^sparrow: quantize: ' "$tmp/err" && [ ! -s "$tmp/out" ]
    then ok "$what: one-line error"; else bad "$what: want one 'sparrow: quantize: ' line" "$(show_err)"; fi
}
# has NAME FILE STRING...
has() {
    what=$1; f=$2; shift 2
    for s in "$@"; do
        if grep -qF -e "$s" "$f"; then ok "$what: has '$s'"; else bad "$what: lacks '$s'" "$(head -c 400 "$f")"; fi
    done
}
# none_left NAME PATH: neither PATH nor a temporary of it exists
none_left() {
    if [ ! -e "$2" ] && ! ls "$tmp" | grep -qF "$(basename "$2").tmp."; then ok "$1: nothing left"; else
        bad "$1: a file was left behind" "$(ls -la "$tmp")"; fi
}

for f in "$M/stories260K-f32.gguf" "$M/stories260K.bin" "$M/tok512.bin"; do
    [ -r "$f" ] || { bad "missing fixture: $f (set SPARROW_SHARED)"; harness_report quantize; exit 1; }
done
out=$tmp/out.gguf

# ---- help and usage errors -----------------------------------------------------------
sp --help
has "--help" "$tmp/out" "quantize"
expect "quantize --help" 0 --help
has "quantize --help" "$tmp/out" "--policy NAME" "--policy-file F" "--calib TEXT_FILE" "--prune-ffn" \
    "--prune-heads" "--merge-kv-heads G" "mem4" "mem4x" "mem4l" "mem3" "q4" "q8" "f32" "--calib-skip"
usage "no arguments"
usage "no OUT" "$M/stories260K-f32.gguf"
usage "third argument" "$M/stories260K-f32.gguf" "$out" extra
usage "unknown policy" "$M/stories260K-f32.gguf" "$out" --policy mem5
has "unknown policy" "$tmp/err" "unknown policy 'mem5'"
usage "policy and policy file" "$M/stories260K-f32.gguf" "$out" --policy q8 --policy-file x
usage "prune-ffn 1" "$M/stories260K-f32.gguf" "$out" --prune-ffn 1
usage "prune-ffn text" "$M/stories260K-f32.gguf" "$out" --prune-ffn half
usage "prune-heads negative" "$M/stories260K-f32.gguf" "$out" --prune-heads -1
usage "merge-kv-heads 0" "$M/stories260K-f32.gguf" "$out" --merge-kv-heads 0
usage "merge-kv-heads text" "$M/stories260K-f32.gguf" "$out" --merge-kv-heads two
usage "calib-skip unknown" "$M/stories260K-f32.gguf" "$out" --calib-skip awq
usage "unknown option" "$M/stories260K-f32.gguf" "$out" --bits 4
none_left "usage errors" "$out"

# ---- failures leave nothing -------------------------------------------------------------
printf '# rules\noutput.weight i6_b64\n*.attn_* i4_b65\n* i4_b64\n' >"$tmp/bad.txt"
expect "malformed policy file" 1 "$M/stories260K-f32.gguf" "$out" --policy-file "$tmp/bad.txt"
has "malformed policy file" "$tmp/err" "bad.txt' line 3: unknown type 'i4_b65'"
none_left "malformed policy file" "$out"
expect "prune-heads 3 under GQA" 1 "$M/stories260K-f32.gguf" "$out" --prune-heads 3
has "prune-heads 3 under GQA" "$tmp/err" "cannot be expressed" "multiple of 2"
none_left "prune-heads 3" "$out"
expect "merge-kv-heads 3 of 4" 1 "$M/stories260K-f32.gguf" "$out" --merge-kv-heads 3
has "merge-kv-heads 3 of 4" "$tmp/err" "--merge-kv-heads 3: the model has 4 KV heads" "G must divide 4 (one of 1, 2, 4)"
none_left "merge-kv-heads 3" "$out"
printf 'keep' >"$out"
expect "missing input" 1 "$tmp/no-such.gguf" "$out"
if [ "$(cat "$out")" = keep ]; then ok "missing input: existing OUT untouched"; else bad "missing input: OUT changed"; fi
rm -f "$out"

# ---- a quantized model that runs ----------------------------------------------------------
expect "mem4" 0 "$M/stories260K-f32.gguf" "$out" --policy mem4 -t 2
has "mem4 summary" "$tmp/out" "policy        mem4" "bpw           4.2" "params        292800" "native_types  yes"
has "mem4 progress" "$tmp/err" "[  1/ 48] token_embd.weight" "i6_b64" "rmse"
if [ "$(grep -c '^\[' "$tmp/err")" = 48 ]; then ok "mem4: one line per tensor"; else bad "mem4: tensor lines"; fi
sp run -m "$out" -p "Once upon a time" -n 16 --temp 0
if [ "$rc" -eq 0 ] && [ -s "$tmp/out" ]; then ok "mem4: runs"; else bad "mem4: does not run" "$(show_err)"; fi
sp inspect "$out"
has "mem4 metadata" "$tmp/out" "sparrow.requires" "native-types-1" "sparrow.quant.policy" "general.alignment                       4096"

# ---- moe3 on the MoE model: routed experts 3-bit, router F32, the rest as q4 --------------------
MOE=$SHARED/models/stories260K-moe/stories260K-moe-f32.gguf
if [ -r "$MOE" ]; then
    expect "moe3" 0 "$MOE" "$out" --policy moe3 -t 2 -q
    has "moe3 summary" "$tmp/out" "policy        moe3" "bpw           3.4"
    sp inspect "$out"
    for pair in "blk.0.ffn_gate_exps.weight i3_b64" "blk.4.ffn_down_exps.weight i3_b64" \
        "blk.0.ffn_gate_inp.weight F32" "blk.2.attn_k.weight i6_b64_l8" "blk.2.attn_q.weight i4n_b32_l8"; do
        set -- $pair
        if grep -E " $1 +$2 " "$tmp/out" >/dev/null; then ok "moe3: $1 is $2"; else
            bad "moe3: $1 is not $2" "$(grep -F "$1" "$tmp/out")"; fi
    done
    sp run -m "$out" -p "Once upon a time" -n 16 --temp 0
    if [ "$rc" -eq 0 ] && [ -s "$tmp/out" ]; then ok "moe3: runs"; else bad "moe3: does not run" "$(show_err)"; fi
else
    bad "missing fixture: $MOE (set SPARROW_SHARED)"
fi

# ---- llama2.c input, calibrated, pruned -----------------------------------------------------
head -c 4000 "$SHARED/peer-golden/tinystories-valid-excerpt.txt" >"$tmp/calib.txt"
expect "llama2.c pruned" 0 "$M/stories260K.bin" "$out" --tokenizer "$M/tok512.bin" --policy q4 \
    --calib "$tmp/calib.txt" --calib-chunks 4 --prune-ffn 0.25 --prune-heads 2 -q
has "llama2.c pruned" "$tmp/out" "n_ff          129" "heads         6 (kv 3)" "calib_tokens  512"
if [ ! -s "$tmp/err" ]; then ok "-q: quiet"; else bad "-q: stderr not empty" "$(show_err)"; fi
sp run -m "$out" -p "Once upon a time" -n 8 --temp 0
if [ "$rc" -eq 0 ] && [ -s "$tmp/out" ]; then ok "pruned: runs"; else bad "pruned: does not run" "$(show_err)"; fi
sp inspect "$out"
has "pruned metadata" "$tmp/out" "llama.attention.head_count              6" "llama.feed_forward_length               129" \
    "sparrow.prune.heads" "native-types-2"

# calibrating takes seconds: it reports its progress (the last chunk at least), before the tensors
expect "calibrated progress" 0 "$M/stories260K-f32.gguf" "$out" --calib "$tmp/calib.txt" --calib-chunks 4
has "calibrated progress" "$tmp/err" "calibrating: 4 of 4 chunks of the text" "scaling: 6 of 6 layers"
if [ "$(grep -n 'calibrating: 4 of 4' "$tmp/err" | cut -d: -f1)" -lt "$(grep -n '^\[  1/' "$tmp/err" | cut -d: -f1)" ]; then
    ok "calibrated progress: before the first tensor"; else bad "calibrated progress: order" "$(show_err)"; fi

# ---- KV heads folded: 4 into 2, F32 kept -------------------------------------------------------
expect "merge-kv-heads 2" 0 "$M/stories260K-f32.gguf" "$out" --policy f32 --merge-kv-heads 2 -q
has "merge-kv-heads 2" "$tmp/out" "policy        f32" "bpw           32.000" "heads         8 (kv 2)" "native_types  no"
sp run -m "$out" -p "Once upon a time" -n 8 --temp 0
if [ "$rc" -eq 0 ] && [ -s "$tmp/out" ]; then ok "folded: runs"; else bad "folded: does not run" "$(show_err)"; fi
sp inspect "$out"
has "folded metadata" "$tmp/out" "llama.attention.head_count              8" "llama.attention.head_count_kv           2" \
    "sparrow.fold.source_kv_heads            4" "blk.0.attn_k.weight       F32   64 x 16"

# ---- other inputs: a synthetic F16 / Q8_0 file; quantized files are refused --------------------
for t in f16 q8_0 q4_0; do
    sp synth --shape tiny --type $t -o "$tmp/tiny-$t.gguf" -q
    [ "$rc" -eq 0 ] || bad "synth tiny $t" "$(show_err)"
done
for t in f16 q8_0; do
    expect "synth tiny $t" 0 "$tmp/tiny-$t.gguf" "$out" --policy mem3 -q
    sp run -m "$out" -p "hello" -n 4 --temp 0
    if [ "$rc" -eq 0 ]; then ok "synth tiny $t: runs"; else bad "synth tiny $t: does not run" "$(show_err)"; fi
done
expect "Q4_0 input" 1 "$tmp/tiny-q4_0.gguf" "$tmp/requant.gguf"
has "Q4_0 input" "$tmp/err" "is Q4_0; the quantizer reads F32, F16, BF16 or Q8_0"
none_left "Q4_0 input" "$tmp/requant.gguf"

harness_report quantize

#!/bin/sh
# test_convert.sh -- black-box tests of `sparrow convert` (issue 21): help and
# usage errors; a Q4_0 file (made by `sparrow quantize`) and a Q4_K_M file
# converted, whose `run --temp 0` prints exactly the original's 16 tokens,
# mapped in place (-v says so); the same with SPARROW_REPACK=0, the fallback
# (stored layouts un-repacked at load, one warning line); `quantize --layout
# resident`; converted files truncated, with an unknown sparrow.requires, a
# requires that does not cover the layouts, an unknown tensor type id, or
# scribbled tensor data: refused with a message naming the file, or run, but
# never a crash.  Logits bit for bit, the budgeted and fallback loads in
# detail: test_convert.c.  Needs python3.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}

name=convert
. "$root/tests/lib/harness.sh"
P=$SPARROW_SHARED/models/stories260K-pad256
f32=$P/stories260K-pad256-f32.gguf q4k=$P/stories260K-pad256-q4_k_m.gguf
for f in "$f32" "$q4k"; do [ -f "$f" ] || { bad "missing fixture: $f (set SPARROW_SHARED)"; harness_report; exit 1; }; done
prompt="Once upon a time"

# one_line NAME: exit 2, one 'sparrow: convert: ' line, nothing on stdout
one_line() {
    t_rc "$1" 2
    if [ "$(wc -l <"$tmp/err" | tr -d ' ')" = 1 ] && grep -q '^sparrow: convert: ' "$tmp/err" && [ ! -s "$tmp/out" ]
    then ok "$1: one-line error"; else bad "$1: want one 'sparrow: convert: ' line" "$(show_err)"; fi
}
# no_crash NAME: the last run ended by itself (no signal)
no_crash() {
    if [ "$rc" -lt 128 ]; then ok "$1: no crash (exit $rc)"; else bad "$1: killed by a signal (exit $rc)" "$(show_err)"; fi
}

# ---- help and usage ---------------------------------------------------------------------
sp --help
t_out_has "--help" "convert"
sp convert --help
t_rc "convert --help" 0
t_out_has "convert --help" "--layout L" "auto:" "resident:" "none:" "--tokenizer FILE"
sp help convert
t_rc "help convert" 0
sp convert
one_line "no arguments"
sp convert "$q4k"
one_line "no OUT"
sp convert "$q4k" "$tmp/x.gguf" extra
one_line "third argument"
sp convert "$q4k" "$tmp/x.gguf" --layout fast
one_line "unknown layout"
t_err_has "unknown layout" "unknown layout 'fast'"
sp convert "$q4k" "$q4k"
t_rc "output is the input" 1
t_err_has "output is the input" "is the input file"
[ ! -e "$tmp/x.gguf" ] && ok "usage errors: nothing written" || bad "usage errors: a file was written"

# ---- converted files run as the originals ------------------------------------------------
printf '* Q4_0\n' >"$tmp/q4_0.txt"
sp quantize "$f32" "$tmp/q4_0.gguf" --policy-file "$tmp/q4_0.txt" -q
t_rc "quantize Q4_0" 0
for src in "$tmp/q4_0.gguf" "$q4k"; do
    m=$(basename "$src" .gguf)
    conv=$tmp/$m-conv.gguf
    sp convert "$src" "$conv" -q
    t_rc "convert $m" 0
    t_out_has "convert $m" "layout        auto" "in resident layouts"
    sp run -m "$src" -p "$prompt" -n 16 --temp 0
    t_rc "run $m" 0
    cp "$tmp/out" "$tmp/want"
    sp run -m "$conv" -p "$prompt" -n 16 --temp 0 -v
    t_rc "run $m converted" 0
    t_file "run $m converted" "$tmp/want"
    t_err_has "run $m converted" "weights used in place"
    # the fallback: a kernel table without the layouts
    export SPARROW_REPACK=0
    sp run -m "$src" -p "$prompt" -n 16 --temp 0
    cp "$tmp/out" "$tmp/want0"
    sp run -m "$conv" -p "$prompt" -n 16 --temp 0
    unset SPARROW_REPACK
    t_rc "run $m converted, fallback" 0
    t_file "run $m converted, fallback" "$tmp/want0"
    t_err_has "run $m converted, fallback" "resident layouts this CPU's kernels do not read"
    if [ "$(grep -c 'warning' "$tmp/err")" = 1 ]; then ok "fallback $m: one warning line"; else
        bad "fallback $m: want one warning line" "$(show_err)"; fi
done
sp quantize "$f32" "$tmp/q4_0-res.gguf" --policy-file "$tmp/q4_0.txt" --layout resident -q
t_rc "quantize --layout resident" 0
sp run -m "$tmp/q4_0.gguf" -p "$prompt" -n 16 --temp 0
cp "$tmp/out" "$tmp/want"
sp run -m "$tmp/q4_0-res.gguf" -p "$prompt" -n 16 --temp 0 -v
t_file "quantize --layout resident: run" "$tmp/want"
t_err_has "quantize --layout resident: run" "weights used in place"

# ---- damaged converted files -------------------------------------------------------------
conv=$tmp/q4_0-conv.gguf
size=$(wc -c <"$conv" | tr -d ' ')
head -c $((size / 2)) "$conv" >"$tmp/trunc.gguf"
sp run -m "$tmp/trunc.gguf" -p "$prompt" -n 4 --temp 0
t_rc "truncated" 1
t_err_has "truncated" "trunc.gguf"
no_crash "truncated"
python3 - "$conv" "$tmp" <<'EOF'
import struct, sys
src, out = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
def save(name, c):
    open(out + "/" + name, "wb").write(c)
save("req9.gguf", b.replace(b"native-types-3", b"native-types-9", 1))
save("req1.gguf", b.replace(b"native-types-3", b"native-types-1", 1))
# the type field of blk.0.attn_q.weight: after its name, n_dims and dims
name = b"blk.0.attn_q.weight"
i = b.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
n_dims = struct.unpack_from("<I", b, i)[0]
t = i + 4 + 8 * n_dims
assert struct.unpack_from("<I", b, t)[0] == 1149, "attn_q is not Q4_0_g8"
c = bytearray(b)
struct.pack_into("<I", c, t, 1150)
save("type.gguf", bytes(c))
# scribble over the middle of the tensor data
c = bytearray(b)
mid = len(c) // 2
c[mid:mid + 65536] = bytes((k * 131 + 7) & 255 for k in range(65536))
save("scribbled.gguf", bytes(c))
EOF
sp run -m "$tmp/req9.gguf" -p "$prompt" -n 4 --temp 0
t_rc "unknown sparrow.requires" 1
t_err_has "unknown sparrow.requires" "req9.gguf" "requires 'native-types-9'"
sp run -m "$tmp/req1.gguf" -p "$prompt" -n 4 --temp 0
t_rc "requires without the layouts" 1
t_err_has "requires without the layouts" "req1.gguf" "resident layout Q4_0_g8" "native-types-3"
sp run -m "$tmp/type.gguf" -p "$prompt" -n 4 --temp 0
t_rc "unknown tensor type" 1
t_err_has "unknown tensor type" "type.gguf" "unknown type id 1150"
sp run -m "$tmp/scribbled.gguf" -p "$prompt" -n 4 --temp 0
no_crash "scribbled tensor data"
sp convert "$tmp/trunc.gguf" "$tmp/x.gguf"
t_rc "convert a truncated file" 1
[ ! -e "$tmp/x.gguf" ] && ok "convert a truncated file: nothing written" || bad "convert a truncated file: a file was written"

harness_report

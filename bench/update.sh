#!/bin/sh
# update.sh -- update sizes and times (docs/PACKAGES.md, acceptance 3), all
# file pairs made with Sparrow's own tools from one F16 source:
#   base  sparrow quantize SRC --policy q4
#   (a)   one layer re-quantized at a higher precision: a policy file that is
#         q4 with blk.$LAYER.* at i8_b32
#   (b)   metadata only: base with a new chat template (sparrow edit)
#   (c)   Q and V of every layer changed: q4 with attn_q at i6_b64_l8 and
#         attn_v at i8_b32 (as a LoRA merged into Q and V and re-quantized
#         changes every byte of them)
# For each pair, in one run: Sparrow's patch (sparrow diff), a full download
# (the new model packed: what a blob store re-fetches for any change inside
# its weights blob), `zstd --patch-from` on the whole files (time and peak
# memory of making and of applying it) and xdelta3; the compressed size of
# the shards that changed; applying Sparrow's patch to the GGUF (sparrow
# patch) against a full install of the new package; the checks of the
# acceptance (patch <= 1.05 x changed shards + 64 KiB, (b) <= 1 MiB, apply
# faster than install) and that every applied file is byte-identical.
#
# usage: bench/update.sh [SRC.gguf]   (default: $SPARROW_SCRATCH/deep-moe-f16.gguf,
#        written with `sparrow synth --shape deep-moe --type f16` if absent)
# Needs: the Debian packages zstd and xdelta3 (apt-get install zstd xdelta3),
# GNU time (/usr/bin/time, package time) for peak memory, python3, bc.
# Environment: SPARROW (build/sparrow), THREADS (2), LAYER (7), REPS (5: apply and
# install timings, the median), SPARROW_SCRATCH, ALTERNATIVES (1; 0 skips
# zstd and xdelta3, whose columns then read '-').
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
THREADS=${THREADS:-2}
LAYER=${LAYER:-7}
SCR=${SPARROW_SCRATCH:-$root/../scratch}
SRC=${1:-$SCR/deep-moe-f16.gguf}
for t in zstd xdelta3 python3 bc /usr/bin/time; do
    command -v "$t" >/dev/null 2>&1 || { echo "update.sh: needs $t (apt-get install zstd xdelta3 time bc python3)" >&2; exit 1; }
done
if [ ! -f "$SRC" ]; then
    echo "update.sh: writing $SRC"
    "$SPARROW" synth --shape deep-moe --type f16 -o "$SRC" -q
fi
W=$(mktemp -d "$SCR/update-bench.XXXXXX")
trap 'rm -rf "$W"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $THREADS; source $(basename "$SRC")"
echo "load before: $(uptime | sed 's/.*load average/load average/')"

q4='*ffn_gate_inp*       F32
token_embd.weight    i4n_b64_l8
*.attn_k.weight      i6_b64_l8
*.attn_v.weight      i6_b64_l8
*                    i4n_b32_l8'
printf '%s\n' "$q4" > "$W/base.policy"
{ printf '*ffn_gate_inp* F32\nblk.%s.* i8_b32\n' "$LAYER"; printf '%s\n' "$q4"; } > "$W/a.policy"
{ printf '*ffn_gate_inp* F32\n*.attn_q.weight i6_b64_l8\n*.attn_v.weight i8_b32\n'; printf '%s\n' "$q4"; } > "$W/c.policy"
Q() { "$SPARROW" quantize "$SRC" "$1" --policy-file "$2" -t "$THREADS" -q; }
Q "$W/base.gguf" "$W/base.policy"
Q "$W/a.gguf" "$W/a.policy"
Q "$W/c.gguf" "$W/c.policy"
cp "$W/base.gguf" "$W/b.gguf"
"$SPARROW" edit "$W/b.gguf" --set 'tokenizer.chat_template={% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}<|assistant|>'
"$SPARROW" pack "$W/base.gguf" -o "$W/base.spk" -t "$THREADS" -q
echo "base: $(stat -c %s "$W/base.gguf") bytes, package $(stat -c %s "$W/base.spk")"

# seconds and peak KiB of a command: "S KIB"
measure() { /usr/bin/time -f '%e %M' -o "$W/time" "$@" >/dev/null 2>&1; cat "$W/time"; }
J() { python3 -c "import json,sys; print(json.load(open('$1'))$2)"; }

printf '%-4s %12s %12s %12s %12s %12s %10s %10s %9s %9s %s\n' case full_dl sparrow changed zstd_patch xdelta3 \
    zstd_mk_s zstd_mk_MiB apply_s inst_s checks
fail=0
for c in a b c; do
    new="$W/$c.gguf"
    "$SPARROW" pack "$new" -o "$W/$c.spk" -t "$THREADS" -q
    full=$(stat -c %s "$W/$c.spk")
    "$SPARROW" diff "$W/base.gguf" "$new" -o "$W/$c.spkd" -t "$THREADS" -q --json > "$W/d.json"
    sp=$(J "$W/d.json" "['patch_bytes']")
    changed=$(J "$W/d.json" "['changed_comp_bytes']")
    kinds="$(J "$W/d.json" "['n_ref']")/$(J "$W/d.json" "['n_whole']")/$(J "$W/d.json" "['n_delta']")"
    if [ "${ALTERNATIVES:-1}" = 1 ]; then
        set -- $(measure zstd -q -f -19 --long=31 --patch-from="$W/base.gguf" "$new" -o "$W/$c.zst")
        zmk_s=$1 zmk_kib=$2
        zs=$(stat -c %s "$W/$c.zst")
        set -- $(measure zstd -q -f -d --long=31 --patch-from="$W/base.gguf" "$W/$c.zst" -o "$W/$c.unz")
        zap_s=$1 zap_kib=$2
        cmp -s "$W/$c.unz" "$new" || { echo "FAIL: zstd --patch-from did not round-trip"; fail=1; }
        rm -f "$W/$c.unz"
        set -- $(measure xdelta3 -e -f -9 -B 536870912 -s "$W/base.gguf" "$new" "$W/$c.xd3")
        xd_s=$1 xd_kib=$2
        xd=$(stat -c %s "$W/$c.xd3")
    else # ALTERNATIVES=0: Sparrow's own figures only (zstd -19 --patch-from takes ~10 min a case)
        zmk_s=- zmk_kib=0 zs=- zap_s=- zap_kib=- xd_s=- xd_kib=- xd=-
    fi
    # apply Sparrow's patch (GGUF -> GGUF) against a full install of the new package, both warm,
    # alternating, the median of REPS each (single runs on a shared machine are noise)
    cat "$W/base.gguf" "$W/$c.spkd" "$W/$c.spk" > /dev/null
    : > "$W/ap"; : > "$W/in"
    for r in $(seq "${REPS:-5}"); do
        "$SPARROW" patch "$W/base.gguf" "$W/$c.spkd" -o "$W/$c.applied" -t "$THREADS" -q --json | J /dev/stdin "['seconds']" >> "$W/ap"
        "$SPARROW" install "$W/$c.spk" -o "$W/$c.inst" -t "$THREADS" -q --json | J /dev/stdin "['seconds']" >> "$W/in"
    done
    ap=$(sort -n "$W/ap" | sed -n "$(( (${REPS:-5} + 1) / 2 ))p")
    in=$(sort -n "$W/in" | sed -n "$(( (${REPS:-5} + 1) / 2 ))p")
    cmp -s "$W/$c.applied" "$new" || { echo "FAIL: $c: the patched file differs"; fail=1; }
    cmp -s "$W/$c.inst" "$new" || { echo "FAIL: $c: the installed file differs"; fail=1; }
    # and the package route: patch the base package, install, compare
    "$SPARROW" patch "$W/base.spk" "$W/$c.spkd" -o "$W/$c.p.spk" -t "$THREADS" -q
    "$SPARROW" install "$W/$c.p.spk" -o "$W/$c.p.gguf" -t "$THREADS" -q
    cmp -s "$W/$c.p.gguf" "$new" || { echo "FAIL: $c: patched package differs"; fail=1; }
    rm -f "$W/$c.applied" "$W/$c.inst" "$W/$c.p.spk" "$W/$c.p.gguf"
    ok=$(python3 -c "
sp, ch, ap, inn = $sp, $changed, $ap, $in
r = []
r.append('size ok' if sp <= 1.05 * ch + 65536 else 'SIZE OVER')
if '$c' == 'b': r.append('<=1MiB' if sp <= 1 << 20 else 'OVER 1 MiB')
r.append('apply<install' if ap < inn else 'APPLY SLOWER')
print(','.join(r))")
    case "$ok" in *OVER*|*SLOWER*) fail=1 ;; esac
    printf '%-4s %12s %12s %12s %12s %12s %10s %10s %9.2f %9.2f %s (shards ref/whole/delta %s; zstd apply %ss %sKiB; xdelta3 %ss %sKiB)\n' \
        "($c)" "$full" "$sp" "$changed" "$zs" "$xd" "$zmk_s" "$((zmk_kib / 1024))" "$ap" "$in" "$ok" "$kinds" \
        "$zap_s" "$zap_kib" "$xd_s" "$xd_kib"
done
echo "sizes in bytes; full_dl = the new model's package; changed = its changed shards compressed whole"
echo "load after: $(uptime | sed 's/.*load average/load average/')"
exit $fail

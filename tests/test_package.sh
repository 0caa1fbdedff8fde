#!/bin/sh
# test_package.sh -- black-box tests of the package commands: pack, install,
# diff, update, patch, edit and -m PKG.spk on run, tokenize and inspect:
# help and usage errors, a round trip byte for byte, the same text from a
# package as from its GGUF, a metadata edit travelling as a tiny patch,
# --json figures, and refusals that name the shard or field while the old
# model stays byte-identical.  The library side is tests/test_package.c.
# Run by tests/run.sh with SPARROW = the binary.  Needs python3 (JSON).
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
: "${SPARROW_SHARED:=$root/../shared}"

name=package
. "$root/tests/lib/harness.sh"
export SPARROW_CACHE="$tmp/cache"
t_same() { if cmp -s "$2" "$3"; then ok "$1: byte-identical"; else bad "$1: $2 and $3 differ"; fi; }
t_nofile() { if [ ! -e "$2" ] && ! ls "$tmp" | grep -q '\.tmp'; then ok "$1: nothing left"; else bad "$1: a file was left" "$(ls "$tmp")"; fi; }

# ---- help and usage errors
for c in pack install diff update patch edit; do
    sp $c --help
    t_rc "$c --help" 0
done
sp --help
t_out_has "--help" "pack" "install" "diff" "update" "patch" "edit"
sp pack --help
t_out_has "pack --help" "-o, --output" "--level" "--shard-size" "-t, --threads" "--json"
t_usage "pack: no output" pack x.gguf
t_usage "pack: no input" pack -o "$tmp/x.spk"
t_usage "pack: bad level" pack x.gguf -o "$tmp/x.spk" --level 30
t_usage "install: --level" install x.spk -o y.gguf --level 3
t_usage "diff: one model" diff a.gguf -o p.spkd
t_usage "update: -o" update a.gguf p.spkd -o b.gguf
t_usage "patch: no -o" patch a.gguf p.spkd
t_usage "edit: no --set" edit a.gguf
t_nofile "usage errors" "$tmp/x.spk"

need models/stories260K/stories260K-q8_0.gguf || exit 1
M=$fx
# ---- round trip, tokens
sp pack "$M" -o "$tmp/m.spk" --shard-size 64K -q --json
t_rc "pack" 0
if python3 -c "import json,sys; d=json.load(open('$tmp/out')); sys.exit(0 if d['n_shards'] > 1 and 0 < d['package_bytes'] < d['model_bytes'] else 1)"; then
    ok "pack --json: shards and sizes"; else bad "pack --json" "$(show_out)"; fi
sp install "$tmp/m.spk" -o "$tmp/m.gguf" -q
t_rc "install" 0
t_same "install" "$M" "$tmp/m.gguf"
sp run -m "$M" -p "Once upon a time" -n 24 --temp 0
cp "$tmp/out" "$tmp/gguf.txt"
sp run -m "$tmp/m.spk" -p "Once upon a time" -n 24 --temp 0
t_rc "run -m PKG.spk" 0
t_file "run -m PKG.spk: the GGUF's text" "$tmp/gguf.txt"
sp run -m "$tmp/m.spk" -p "Once upon a time" -n 24 --temp 0 --mem-budget 64M
t_file "run -m PKG.spk --mem-budget: the GGUF's text" "$tmp/gguf.txt"
t_err_has "run -m PKG.spk --mem-budget: says it installs" "budgeted run" "installed the package once into"
sp run -m "$tmp/m.spk" -p "Once upon a time" -n 24 --temp 0 --mem-budget 64M
t_err_has "run -m PKG.spk --mem-budget again: the cached copy" "running from its copy installed in"
sp tokenize -m "$tmp/m.spk" "Once upon a time"
t_rc "tokenize -m PKG.spk" 0
sp inspect "$tmp/m.spk"
t_out_has "inspect PKG.spk" "gguf v3 package"

# ---- edit, diff, update, patch
cp "$M" "$tmp/e.gguf"
sp edit "$tmp/e.gguf" --set "tokenizer.chat_template={{ messages }}" --set llama.rope.freq_base:f32=20000
t_rc "edit" 0
sp inspect "$tmp/e.gguf"
t_out_has "edit: the keys" "tokenizer.chat_template" "20000"
sp edit "$tmp/e.gguf" --set "x:u8=300"
t_rc "edit: out of range" 1
t_err_has "edit: out of range names the assignment" "x:u8=300"
sp diff "$M" "$tmp/e.gguf" -o "$tmp/e.spkd" -q --json
t_rc "diff" 0
if python3 -c "import json,sys; d=json.load(open('$tmp/out')); sys.exit(0 if d['n_whole'] == 0 and d['n_delta'] == 0 and d['patch_bytes'] < 4096 else 1)"; then
    ok "diff: a metadata edit is a manifest only"; else bad "diff: metadata edit" "$(show_out)"; fi
cp "$M" "$tmp/u.gguf"
sp update "$tmp/u.gguf" "$tmp/e.spkd" -q
t_rc "update" 0
t_same "update" "$tmp/u.gguf" "$tmp/e.gguf"
sp patch "$tmp/m.spk" "$tmp/e.spkd" -o "$tmp/e.spk" -q
t_rc "patch a package cut otherwise (64K shards)" 1
t_err_has "patch a package cut otherwise" "another model" "7 shards of 65536"
sp pack "$M" -o "$tmp/m16.spk" -q
sp patch "$tmp/m16.spk" "$tmp/e.spkd" -o "$tmp/e.spk" -q
t_rc "patch a package" 0
sp install "$tmp/e.spk" -o "$tmp/e2.gguf" -q
t_same "patch a package, install" "$tmp/e2.gguf" "$tmp/e.gguf"

# ---- refusals: the old model is kept
sp update "$tmp/u.gguf" "$tmp/e.spkd" -q
t_rc "update twice" 1
t_err_has "update twice: for another model" "another model"
t_same "update twice: kept" "$tmp/u.gguf" "$tmp/e.gguf"
python3 -c "
b = bytearray(open('$tmp/m.spk','rb').read()); b[len(b)//2] ^= 1; open('$tmp/bad.spk','wb').write(b)"
sp install "$tmp/bad.spk" -o "$tmp/m.gguf" -q
t_rc "install a damaged package" 1
t_err_has "install a damaged package: names the shard" "shard"
t_err_one_line "install a damaged package"
t_same "install a damaged package: kept" "$M" "$tmp/m.gguf"
sp run -m "$tmp/bad.spk" -p "x" -n 2
t_rc "run a damaged package" 1
head -c 300 "$tmp/e.spkd" > "$tmp/t.spkd"
sp update "$tmp/u.gguf" "$tmp/t.spkd" -q
t_rc "update with a truncated patch" 1
t_same "update with a truncated patch: kept" "$tmp/u.gguf" "$tmp/e.gguf"
t_nofile "refusals" "$tmp/none"

harness_report package

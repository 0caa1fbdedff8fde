#!/bin/sh
# test_cli.sh -- black-box tests of the `sparrow` command: exit codes, the
# exact bytes on stdout and the shape of stderr for help, usage errors,
# tokenize, run (greedy golden on GGUF and llama2.c files, seeds, context
# limits) and inspect.  Not a test of the library's numerics (test_*.c are).
# Run by tests/run.sh with SPARROW = the binary, SPARROW_SHARED = the fixtures
# folder (default ../shared beside the repository).  A missing fixture is a
# failure that names the file.  Needs python3 to read the golden JSON.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}

name=cli
. "$root/tests/lib/harness.sh"

if [ ! -x "$SPARROW" ]; then
    echo "FAIL sparrow binary not found at $SPARROW (build it first)"
    exit 1
fi

# ---- help and version --------------------------------------------------------
sp --help
t_rc "--help" 0
t_out_has "--help" "usage: sparrow" "run" "tokenize" "inspect" "exit status"
t_empty_err "--help"
sp help
t_rc "help" 0
t_out_has "help" "usage: sparrow"
sp -h
t_rc "-h" 0
sp --version
t_rc "--version" 0
t_out_has "--version" "sparrow "

for c in run tokenize inspect; do
    sp "$c" --help
    t_rc "$c --help" 0
    t_out_has "$c --help" "usage: sparrow $c" "exit status"
    t_empty_err "$c --help"
    cp "$tmp/out" "$tmp/help1"
    sp help "$c"
    t_rc "help $c" 0
    if cmp -s "$tmp/help1" "$tmp/out"; then ok "help $c == $c --help"; else bad "help $c differs from $c --help"; fi
done
sp run --help
t_out_has "run --help" "-m, --model" "-p, --prompt" "-f, --file" "-n, --n-predict" "--temp" "--top-k" "--top-p" \
    "--min-p" "--repeat-penalty" "--presence-penalty" "--frequency-penalty" "--repeat-last-n" "--seed" "-t, --threads" "-c, --ctx-size" "--kv-type" \
    "--tokenizer" "(default: 128)" "(default: 0.8)" "(default: 40)" "(default: 0.95)" "(default: 0.05)" \
    "(default: 64)"
sp tokenize --help
t_out_has "tokenize --help" "-m, --model" "--file" "--no-bos" "--tokenizer"
sp inspect --help
t_out_has "inspect --help" "--tokenizer" "--vocab-only"

# ---- usage errors (exit 2, one line) -------------------------------------------
t_usage "no command"
t_usage "unknown command" frobnicate
t_err_has "unknown command" "frobnicate"
t_usage "unknown top-level option" --frobnicate
t_usage "help unknown" help frobnicate
t_usage "run: unknown option" run -m x.gguf --bogus
t_err_has "run: unknown option" "--bogus"
t_usage "run: no model" run -p hello
t_usage "run: stray argument" run -m x.gguf hello
t_usage "run: --top-k abc" run -m x.gguf --top-k abc
printf "%s\n" "sparrow: run: --top-k: expected an integer, got 'abc'" >"$tmp/want"
if cmp -s "$tmp/want" "$tmp/err"; then ok "run: --top-k abc message"; else bad "run: --top-k abc message" "$(show_err)"; fi
t_usage "run: --top-k 12x" run -m x.gguf --top-k 12x
t_usage "run: --top-k -1" run -m x.gguf --top-k -1
t_usage "run: --top-k empty" run -m x.gguf --top-k ""
t_usage "run: -n missing value" run -m x.gguf -n
t_err_has "run: -n missing value" "missing value"
t_usage "run: -n 1e3" run -m x.gguf -n 1e3
t_usage "run: -n -2" run -m x.gguf -n -2
t_usage "run: -n overflow" run -m x.gguf -n 99999999999999999999
t_usage "run: --temp -1" run -m x.gguf --temp -1
t_usage "run: --temp nan" run -m x.gguf --temp nan
t_usage "run: --temp inf" run -m x.gguf --temp inf
t_usage "run: --temp=0.5x" run -m x.gguf --temp=0.5x
t_usage "run: --top-p 0" run -m x.gguf --top-p 0
t_usage "run: --top-p 1.5" run -m x.gguf --top-p 1.5
t_usage "run: --min-p 2" run -m x.gguf --min-p 2
t_usage "run: --repeat-penalty 0" run -m x.gguf --repeat-penalty 0
t_usage "run: --repeat-last-n -1" run -m x.gguf --repeat-last-n -1
t_usage "run: --presence-penalty nan" run -m x.gguf --presence-penalty nan
t_usage "run: --frequency-penalty inf" run -m x.gguf --frequency-penalty inf
t_usage "run: --frequency-penalty x" run -m x.gguf --frequency-penalty x
t_usage "run: --seed -1" run -m x.gguf --seed -1
t_usage "run: --seed 2^64" run -m x.gguf --seed 18446744073709551616
t_usage "run: -t 0" run -m x.gguf -t 0
t_usage "run: -c -5" run -m x.gguf -c -5
t_usage "run: --kv-type q4" run -m x.gguf --kv-type q4
t_usage "run: -p and -f" run -m x.gguf -p a -f b
t_usage "run: --verbose=1" run -m x.gguf --verbose=1
t_usage "tokenize: no model" tokenize hello
t_usage "tokenize: no text" tokenize -m x.gguf
t_usage "tokenize: text and --file" tokenize -m x.gguf hello --file y
t_usage "tokenize: two texts" tokenize -m x.gguf hello world
t_usage "tokenize: unknown option" tokenize -m x.gguf --bos hello
t_usage "inspect: no model" inspect
t_usage "inspect: two models" inspect a.gguf b.gguf
t_usage "inspect: unknown option" inspect --tensors a.gguf

# ---- missing files (exit 1, one line naming the file) ----------------------------
for c in "run -p hi -m" "tokenize hi -m" "inspect"; do
    # shellcheck disable=SC2086
    sp $c "$tmp/no-such-model.gguf"
    t_rc "$c missing model" 1
    t_empty_out "$c missing model"
    t_err_one_line "$c missing model"
    t_err_has "$c missing model" "no-such-model.gguf"
done

# ---- tokenize ------------------------------------------------------------------------
if need models/stories260K/stories260K-f32.gguf; then
    f32=$fx
    sp tokenize -m "$f32" "Once upon a time"
    t_rc "tokenize" 0
    t_line "tokenize" "1 403 407 261 378"
    t_empty_err "tokenize"
    sp tokenize -m "$f32" --no-bos "Once upon a time"
    t_line "tokenize --no-bos" "403 407 261 378"
    printf 'Once upon a time' >"$tmp/prompt.txt"
    sp tokenize -m "$f32" --file "$tmp/prompt.txt"
    t_rc "tokenize --file" 0
    t_line "tokenize --file" "1 403 407 261 378"
    sp tokenize -m "$f32" --file - <"$tmp/prompt.txt"
    t_line "tokenize --file -" "1 403 407 261 378"
    sp tokenize -m "$f32" -- "Once upon a time"
    t_line "tokenize --" "1 403 407 261 378"
    sp tokenize -m "$f32" --no-bos ""
    t_rc "tokenize empty" 0
    t_line "tokenize empty --no-bos" ""
    sp tokenize -m "$f32" ""
    t_line "tokenize empty" "1"
    # bytes after a NUL are tokenized too: the file's length counts, not strlen
    printf 'a\000b' >"$tmp/nul.bin"
    sp tokenize -m "$f32" --no-bos --file "$tmp/nul.bin"
    t_rc "tokenize --file with NUL" 0
    n_ids=$(wc -w <"$tmp/out" | tr -d ' ')
    if [ "$n_ids" -ge 3 ]; then ok "tokenize --file with NUL: $n_ids ids"; else
        bad "tokenize --file with NUL: $n_ids ids, want >= 3" "$(show_out)"; fi
    sp tokenize -m "$tmp/prompt.txt" "x"
    t_rc "tokenize on a text file" 1
    t_err_one_line "tokenize on a text file"
fi
if need models/stories260K/stories260K.bin && need models/stories260K/tok512.bin; then
    sp tokenize -m "$SPARROW_SHARED/models/stories260K/stories260K.bin" \
        --tokenizer "$SPARROW_SHARED/models/stories260K/tok512.bin" "Once upon a time"
    t_rc "tokenize llama2.c" 0
    t_line "tokenize llama2.c" "1 403 407 261 378"
fi
if need peer-tests/tokenizer/ggml-vocab-llama-spm.gguf; then
    sp tokenize -m "$fx" --no-bos "Hello world"
    t_rc "tokenize vocab-only spm" 0
    t_line "tokenize vocab-only spm" "15043 3186"
    sp tokenize -m "$fx" "Hello world"
    t_line "tokenize vocab-only spm +bos" "1 15043 3186"
    sp run -m "$fx" -p "Hello" -n 4
    t_rc "run on a vocab-only file" 1
    t_err_one_line "run on a vocab-only file"
    sp inspect --vocab-only "$fx"
    t_rc "inspect --vocab-only" 0
    t_out_has "inspect --vocab-only" "32000" "tokenizer.ggml.model"
fi
if need peer-tests/tokenizer/ggml-vocab-gpt-2.gguf; then
    sp tokenize -m "$fx" --no-bos "Hello world"
    t_rc "tokenize vocab-only gpt-2" 0
    t_line "tokenize vocab-only gpt-2" "15496 995"
fi

# ---- run -----------------------------------------------------------------------------
golden=""
if need peer-golden/stories260K.json; then
    if command -v python3 >/dev/null 2>&1; then
        # the exact bytes of the 64 greedy pieces of the first run of the first (f32) variant
        if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
v = d["variants"][0]
assert v["name"] == "f32", v["name"]
r = v["runs"][0]
assert r["prompt"] == "Once upon a time", r["prompt"]
sys.stdout.buffer.write(b"".join(bytes.fromhex(h) for h in r["generated_pieces_hex"]))
' "$fx" >"$tmp/golden.txt"; then
            golden=$tmp/golden.txt
        else
            bad "could not extract the golden text from $fx"
        fi
    else
        bad "python3 not found: it is needed to read $fx"
    fi
fi

if [ -n "$golden" ] && need models/stories260K/stories260K-f32.gguf; then
    f32=$fx
    sp run -m "$f32" -p "Once upon a time" -n 64 --temp 0
    t_rc "run greedy gguf" 0
    t_file "run greedy gguf" "$golden"
    t_err_has "run greedy gguf" "tok/s"
    if [ -s "$tmp/out" ] && [ "$(tail -c 1 "$tmp/out" | od -An -c | tr -d ' ')" != '\n' ]; then
        ok "run: no trailing newline"
    else
        bad "run: output ends with a newline (or is empty)"
    fi
    if grep -q 'sparrow' "$tmp/out"; then bad "run: diagnostics leaked to stdout" "$(show_out)"; else ok "run: stdout is text only"; fi

    sp run -m "$f32" -f "$tmp/prompt.txt" -n 64 --temp 0 --kv-type f32 -t 1
    t_rc "run -f" 0
    t_file "run -f" "$golden"

    sp run -m "$f32" -p "Once upon a time" -n 64 --temp 0 --kv-type f16 -t 2
    t_rc "run --kv-type f16" 0
    t_file "run --kv-type f16" "$golden"

    # a full context stops generation cleanly with what was produced so far:
    # 5 prompt tokens in 8 slots leave room for 3 decodes, so 4 pieces print
    sp run -m "$f32" -p "Once upon a time" -n 64 --temp 0 -c 8
    t_rc "run context full" 0
    t_err_has "run context full" "context full"
    n_out=$(wc -c <"$tmp/out" | tr -d ' ')
    head -c "$n_out" "$golden" >"$tmp/prefix"
    if [ "$n_out" -gt 0 ] && cmp -s "$tmp/prefix" "$tmp/out"; then ok "run context full: output is a golden prefix"; else
        bad "run context full: output is not a non-empty prefix of the golden" "$(show_out)"; fi

    sp run -m "$f32" -p "Once upon a time" -n 0
    t_rc "run -n 0" 0
    t_empty_out "run -n 0"

    sp run -m "$f32" -p "" -n 8 --temp 0
    t_rc "run empty prompt" 0
    if [ -s "$tmp/out" ]; then ok "run empty prompt: output"; else bad "run empty prompt: no output" "$(show_err)"; fi

    sp run -m "$f32" -p "Once upon a time there was a dog" -c 4
    t_rc "run prompt longer than -c" 1
    t_empty_out "run prompt longer than -c"
    t_err_one_line "run prompt longer than -c"

    sp run -m "$f32" -p "Once upon a time" -n 40 --seed 1234
    t_rc "run --seed" 0
    cp "$tmp/out" "$tmp/seed1"
    t_err_has "run --seed" "tok/s" "load"
    sp run -m "$f32" -p "Once upon a time" -n 40 --seed 1234
    if [ -s "$tmp/seed1" ] && cmp -s "$tmp/seed1" "$tmp/out"; then ok "run: same seed, same output"; else
        bad "run: same seed gave different (or empty) output" "$(show_out)"; fi
    sp run -m "$f32" -p "Once upon a time" -n 40 --seed 1235 --temp 1.5 --top-k 0 --top-p 1 --min-p 0
    cp "$tmp/out" "$tmp/seed2"
    sp run -m "$f32" -p "Once upon a time" -n 40 --seed 1236 --temp 1.5 --top-k 0 --top-p 1 --min-p 0
    if cmp -s "$tmp/seed2" "$tmp/out"; then bad "run: different seeds gave the same output at temp 1.5"; else
        ok "run: different seeds, different output"; fi
    sp run -m "$f32" -p "Once upon a time" -n 8
    t_rc "run without --seed" 0
    t_err_has "run without --seed" "seed "
    sp run -m "$f32" -p "Once upon a time" -n 8 --repeat-penalty 1.3 --repeat-last-n 16 --temp=0.5 --top-k=10
    t_rc "run with --flag=value options" 0
    # OpenAI's penalties: greedy text changes once repeats cost something, and
    # 0 is the same as leaving them out
    sp run -m "$f32" -p "Once upon a time" -n 48 --temp 0 --seed 1
    cp "$tmp/out" "$tmp/greedy"
    sp run -m "$f32" -p "Once upon a time" -n 48 --temp 0 --seed 1 --presence-penalty 0 --frequency-penalty 0
    if cmp -s "$tmp/greedy" "$tmp/out"; then ok "run: penalties of 0 change nothing"; else bad "run: penalties of 0 changed the output"; fi
    sp run -m "$f32" -p "Once upon a time" -n 48 --temp 0 --seed 1 --frequency-penalty 2 --presence-penalty 1
    t_rc "run with --frequency-penalty and --presence-penalty" 0
    if cmp -s "$tmp/greedy" "$tmp/out"; then bad "run: the penalties did not change greedy text"; else ok "run: the penalties change greedy text"; fi
fi

if [ -n "$golden" ] && need models/stories260K/stories260K.bin && need models/stories260K/tok512.bin; then
    bin=$SPARROW_SHARED/models/stories260K/stories260K.bin
    sp run -m "$bin" --tokenizer "$SPARROW_SHARED/models/stories260K/tok512.bin" -p "Once upon a time" -n 64 --temp 0
    t_rc "run greedy llama2.c" 0
    t_file "run greedy llama2.c" "$golden"
    sp run -m "$bin" -p "Once upon a time" -n 4 --temp 0
    t_rc "run llama2.c without tokenizer.bin" 1
    t_empty_out "run llama2.c without tokenizer.bin"
    t_err_one_line "run llama2.c without tokenizer.bin"
    t_err_has "run llama2.c without tokenizer.bin" "tokenizer.bin"
fi

# ---- inspect -------------------------------------------------------------------------
if need models/stories260K/stories260K-f32.gguf; then
    sp inspect "$fx"
    t_rc "inspect" 0
    t_empty_err "inspect"
    t_out_has "inspect" "llama" "gguf" "token_embd.weight" "output_norm.weight" "blk.4.ffn_down.weight" "F32" \
        "64 x 512" "general.architecture" "bytes/token" "parameters"
    rows=$(grep -c '^ *[0-9][0-9]*  *[a-z_.0-9]*weight ' "$tmp/out")
    if [ "$rows" -eq 48 ]; then ok "inspect: 48 tensor rows"; else bad "inspect: $rows tensor rows, want 48" "$(show_out)"; fi
fi
if need models/stories260K/stories260K-q4_0.gguf; then
    sp inspect -m "$fx"
    t_rc "inspect q4_0" 0
    t_out_has "inspect q4_0" "Q4_0" "Q8_0" "F16"
fi
if need models/stories260K/stories260K.bin; then
    sp inspect "$fx" --tokenizer "$SPARROW_SHARED/models/stories260K/tok512.bin"
    t_rc "inspect llama2.c" 0
    t_out_has "inspect llama2.c" "llama2.c" "512"
fi

harness_report test_cli.sh

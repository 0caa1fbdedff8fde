#!/bin/sh
# longctx.sh [MODEL] -- issue 15's acceptance 4: the memory budget holds with
# a long context.  llama3-8b Q4_K_M (4.58 GiB) in a 5.5 GiB memory cgroup,
# Sparrow with --mem-budget 5G -c 8192 and a q8_0 cache (weights and KV no
# longer fit together, so some weights stream) decodes an 8,000-token prompt
# and 64 generated tokens; llama.cpp runs beside it in the same cgroup with
# flash attention and the same quantized cache, as llama-bench (its default
# loading) and llama-completion -nr (weights left mmap-backed).  The 8,000
# tokens are a depth of 7,936 and a timed prompt of 64 (bench -d 7936 -p 64),
# then 64 decodes at that depth; llama-bench decodes 64 at depth 7,936 and
# llama-completion reads an 8,000-token prompt and writes 64.  A wrapper
# of bench/memwall.sh, which prints the table (decode tok/s, cgroup peak, peak
# RSS, bytes read per token) and whether Sparrow's peak stayed in the budget.
# Expect tens of minutes (the prompt alone is 8,000 tokens for each engine).
#
# MODEL defaults to $SPARROW_SCRATCH/llama3-8b-q4_k_m.gguf (write it with
# `sparrow synth --shape llama3-8b --type q4_k_m -o ...`).  LIMIT, BUDGET,
# DEPTH, N_PROMPT, N_GEN, CTK (default 5.5G, 5G, 7936, 64, 64, q8_0)
# override the settings; LLAMA_BENCH, LLAMA_COMPLETION and the rest as
# memwall.sh.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-${SPARROW_SCRATCH:-/tmp}/llama3-8b-q4_k_m.gguf}
LIMIT=${LIMIT:-5.5G}
BUDGET=${BUDGET:-5G}
CTK=${CTK:-q8_0}
export DEPTH="${DEPTH:-7936}" N_PROMPT="${N_PROMPT:-64}" N_GEN="${N_GEN:-64}"
ctx=$((DEPTH + N_PROMPT + N_GEN))
[ "$ctx" -le 8192 ] && ctx=8192
export SPARROW_ARGS="-c $ctx -ctk $CTK -ctv $CTK ${SPARROW_ARGS:-}"
export LLAMA_ARGS="-fa on -ctk $CTK -ctv $CTK ${LLAMA_ARGS:-}"
exec sh "$root/bench/memwall.sh" "$MODEL" "$LIMIT" "$BUDGET"

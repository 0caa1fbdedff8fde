#!/bin/sh
# test_writers.sh -- writers that survive kill -9 (issue 20): synth and
# quantize killed at 8 random moments each (bench/killwriters.sh, which the
# issue's 30 x large run uses too): the target is never a partial file, a
# leftover temporary is never taken for a model and the next run removes it.
# Also `quantize IN IN` (and a hard link of IN) is refused at once, IN intact.
# Run by tests/run.sh with SPARROW = the binary.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}

name=writers
. "$root/tests/lib/harness.sh"

if out=$(SPARROW="$SPARROW" SPARROW_SCRATCH="$tmp" sh "$root/bench/killwriters.sh" 8 small 2>&1); then
    ok "kill -9 at random moments: $(echo "$out" | tr '\n' ' ')"
else
    bad "kill -9 at random moments" "$out"
fi

"$SPARROW" synth --shape tiny --type f16 -q -o "$tmp/in.gguf" || bad "synth the input"
cp "$tmp/in.gguf" "$tmp/orig.gguf"
ln "$tmp/in.gguf" "$tmp/link.gguf"
for o in in.gguf link.gguf; do
    sp quantize "$tmp/in.gguf" "$tmp/$o"
    t_rc "quantize IN $o" 1
    if grep -q "is the input file" "$tmp/err"; then ok "quantize IN $o: says the output is the input file"; else
        bad "quantize IN $o: message" "$(show_err)"; fi
done
if cmp -s "$tmp/in.gguf" "$tmp/orig.gguf" && [ -z "$(ls "$tmp" | grep sparrow-tmp)" ]; then ok "the input is intact, no temporary"; else
    bad "the input changed or a temporary was left"; fi
harness_report

#!/bin/sh
# bench/chat-history.sh -- issue 16, acceptance 2: history is never
# recomputed.  A scripted chat of TURNS (20) user messages of equal length
# through `sparrow chat --json` on synthetic llama3-8b Q4_K_M with a system
# prompt of about 1,000 tokens (the chatml template; answers capped at N = 4
# tokens to keep it short), checking per turn
#   tokens_decoded <= the new turn's tokens + 2
#                     (n_past - the previous n_past - tokens_generated + 2),
#   every later turn's ttft_s below half of turn 1's,
#   turn TURNS's ttft_s within 1.5x of turn 2's.
# The model is $SPARROW_SCRATCH/llama3-8b-q4_k_m.gguf (default ../scratch),
# written with `sparrow synth` if absent (4.6 GiB).  Runs niced; prints the
# CPU and the load first and last, a line per turn, and exits 1 if a check
# fails.  Needs python3 (the JSON lines).
#   usage: bench/chat-history.sh [TURNS] [N]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
SPARROW=${SPARROW:-$root/$BUILD/sparrow}
scratch=${SPARROW_SCRATCH:-$root/../scratch}
turns=${1:-20}
n=${2:-4}
threads=${THREADS:-$(nproc)}
model=${MODEL:-$scratch/llama3-8b-q4_k_m.gguf}
[ -x "$SPARROW" ] || { echo "chat-history: $SPARROW not built (make)" >&2; exit 1; }
if [ ! -f "$model" ]; then
    echo "chat-history: writing $model"
    nice -n 19 "$SPARROW" synth --shape llama3-8b --type q4_k_m -o "$model"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-chat-history.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# the system prompt: sentences until it is about 1,000 tokens
python3 - "$tmp/in.jsonl" "$turns" <<'EOF'
import json, sys
out, turns = sys.argv[1], int(sys.argv[2])
words = ("the device keeps every weight it can in memory and streams the rest from storage while it "
         "computes so a model larger than the memory can still answer questions about the world ").split()
sysp, i = [], 0
while len(" ".join(sysp)) < 950:
    sysp.append(words[i % len(words)]); i += 1
with open(out, "w") as f:
    f.write(json.dumps({"role": "system", "content": "You are a helpful assistant. " + " ".join(sysp)}) + "\n")
    for t in range(1, turns + 1):
        f.write(json.dumps({"role": "user", "content": "Question %03d: what comes next?" % t}) + "\n")
EOF
sys_tokens=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["content"])' "$tmp/in.jsonl" |
    "$SPARROW" tokenize -m "$model" --file - | wc -w)

echo "chat-history: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $threads threads"
echo "chat-history: load at start: $(uptime | sed 's/.*load average: //')"
echo "chat-history: $model, system prompt $sys_tokens tokens, $turns turns, answers <= $n tokens"
nice -n 19 "$SPARROW" chat -m "$model" --chat-template chatml --json -c 4096 -n "$n" --seed 1 -t "$threads" \
    <"$tmp/in.jsonl" >"$tmp/out.jsonl"
echo "chat-history: load at end: $(uptime | sed 's/.*load average: //')"

python3 - "$tmp/out.jsonl" "$turns" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
turns = int(sys.argv[2])
bad = []
if len(rows) != turns:
    bad.append("%d answers for %d turns" % (len(rows), turns))
print("turn  decoded  new_turn  generated  n_past  ttft_s   decode_tps")
prev = 0
for i, r in enumerate(rows, 1):
    new_turn = r["n_past"] - prev - r["tokens_generated"]
    print("%4d  %7d  %8d  %9d  %6d  %7.3f  %10.2f" % (i, r["tokens_decoded"], new_turn, r["tokens_generated"],
                                                      r["n_past"], r["ttft_s"], r["decode_tps"]))
    if r["tokens_decoded"] > new_turn + 2:
        bad.append("turn %d: tokens_decoded %d > %d + 2" % (i, r["tokens_decoded"], new_turn))
    prev = r["n_past"]
if len(rows) >= 2:
    t1 = rows[0]["ttft_s"]
    for i, r in enumerate(rows[1:], 2):
        if not r["ttft_s"] < t1 / 2:
            bad.append("turn %d: ttft %.3f s not below half of turn 1's %.3f s" % (i, r["ttft_s"], t1))
    t2, tn = rows[1]["ttft_s"], rows[-1]["ttft_s"]
    print("ttft: turn 1 %.3f s, turn 2 %.3f s, turn %d %.3f s (%.2fx turn 2's), later max %.3f s" %
          (t1, t2, len(rows), tn, tn / t2 if t2 else float("inf"), max(r["ttft_s"] for r in rows[1:])))
    if len(rows) > 2 and not tn <= 1.5 * t2:
        bad.append("turn %d: ttft %.3f s > 1.5x turn 2's %.3f s" % (len(rows), tn, t2))
for b in bad:
    print("FAIL " + b)
print("chat-history: %s" % ("FAILED" if bad else "all checks passed"))
sys.exit(1 if bad else 0)
EOF

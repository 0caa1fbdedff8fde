#!/bin/sh
# bench/chat-long.sh -- issue 16, acceptance 3: a long chat inside the memory
# wall.  TURNS (50) scripted user turns of about 100 tokens (the words per
# turn are set from the model's tokenizer), answers capped at 64, through
# `sparrow chat --json --context-shift` on synthetic qwen3-30b-a3b Q4_0 in a
# memory cgroup of LIMIT (8G) with --mem-budget
# BUDGET (7.5G) and -c 2048, so that it runs well past the context (about
# 160 positions a turn).  Checks: every turn answers (no error line, the
# process exits 0, no OOM kill), the cgroup's peak <= the budget, and the
# resident set (VmRSS, read after each answer) drifts less than 1% between
# turn 10 and turn TURNS.  Prints the CPU and load first and last and a line
# per turn.  About half an hour on a 2-core machine, more when shared.
# The chat runs at nice NICE (default 19: it yields to other work).
# The model is $SPARROW_SCRATCH/qwen3-30b-a3b-q4_0.gguf (default ../scratch),
# written with `sparrow synth` if absent: about 17 GB, so check the free
# space first (df -h).  Needs root (a memory cgroup, v2 or v1: bench/cgroup.sh) and python3.
#   usage: bench/chat-long.sh [TURNS]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
SPARROW=${SPARROW:-$root/$BUILD/sparrow}
scratch=${SPARROW_SCRATCH:-$root/../scratch}
turns=${1:-50}
LIMIT=${LIMIT:-8G}
BUDGET=${BUDGET:-7.5G}
threads=${THREADS:-$(nproc)}
model=${MODEL:-$scratch/qwen3-30b-a3b-q4_0.gguf}
[ -x "$SPARROW" ] || { echo "chat-long: $SPARROW not built (make)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "chat-long: needs root (a memory cgroup)" >&2; exit 2; }
. "$root/bench/cgroup.sh"
cg_init sparrow-chat-long || { echo "chat-long: no memory cgroup controller (neither v2 nor v1)" >&2; exit 2; }
if [ ! -f "$model" ]; then
    echo "chat-long: writing $model ($(df -h "$scratch" | awk 'NR == 2 { print $4 }') free)"
    nice -n 19 "$SPARROW" synth --shape qwen3-30b-a3b --type q4_0 -o "$model"
fi
bytes() { awk -v s="$1" 'BEGIN { u = substr(s, length(s)); v = substr(s, 1, length(s) - 1);
    m = u == "G" ? 1073741824 : u == "M" ? 1048576 : 1; if (m == 1) v = s; printf "%.0f", v * m }'; }
trap cg_remove EXIT
trap 'exit 1' INT TERM
cg_make "$(bytes "$LIMIT")"

echo "chat-long: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $threads threads"
echo "chat-long: load at start: $(uptime | sed 's/.*load average: //')"
echo "chat-long: $model, cgroup v$CGV $LIMIT, --mem-budget $BUDGET, -c 2048, $turns turns"
st=0
python3 - "$SPARROW" "$model" "$CG" "$turns" "$BUDGET" "$(bytes "$BUDGET")" "$threads" "$CGV" "${NICE:-19}" <<'EOF' || st=$?
import json, subprocess, sys, time
sparrow, model, cg, turns, budget, budget_bytes, threads, cgv, nice = sys.argv[1:10]
turns, budget_bytes = int(turns), int(budget_bytes)
words = ("the device keeps every weight it can in memory and streams the rest from storage while it "
         "computes so a model larger than the memory can still answer questions about the world").split()
def message(t, n):
    return "Turn %d. " % t + " ".join(words[(t + i) % len(words)] for i in range(n))
# about 100 tokens a turn with this model's vocabulary (70 words of English are
# ~100 tokens for a real tokenizer, several times more for a synthetic one)
ids = subprocess.run([sparrow, "tokenize", "-m", model, "--no-bos", message(1, 70)], capture_output=True,
                     text=True, check=True).stdout.split()
n_words = max(4, round(70 * 100 / max(1, len(ids))))
print("chat-long: %d words a turn (70 words are %d tokens here)" % (n_words, len(ids)), flush=True)
cmd = ["nice", "-n", nice, "sh", "-c", 'echo $$ > "$0/cgroup.procs"; exec "$@"', cg,
       sparrow, "chat", "-m", model, "--json", "--context-shift", "--keep", "4", "-c", "2048", "-n", "64",
       "--mem-budget", budget, "--seed", "1", "-t", threads, "--chat-template", "chatml"]
p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
def rss():
    for l in open("/proc/%d/status" % p.pid):
        if l.startswith("VmRSS:"): return int(l.split()[1]) * 1024
bad, rows = [], []
print("turn  decoded  generated  n_past  ttft_s  decode_tps  rss_MiB  wall_s")
for t in range(1, turns + 1):
    t0 = time.time()
    p.stdin.write(json.dumps({"role": "user", "content": message(t, n_words)}) + "\n")
    p.stdin.flush()
    line = p.stdout.readline()
    if not line:
        bad.append("turn %d: no answer (the process ended)" % t); break
    a = json.loads(line)
    if "error" in a:
        bad.append("turn %d: %s" % (t, a["error"])); continue
    r = rss()
    rows.append((t, r))
    print("%4d  %7d  %9d  %6d  %6.2f  %10.2f  %7.1f  %6.1f" % (t, a["tokens_decoded"], a["tokens_generated"],
          a["n_past"], a["ttft_s"], a["decode_tps"], r / 1048576, time.time() - t0), flush=True)
p.stdin.close()
rc = p.wait()
if rc != 0: bad.append("chat exited %d" % rc)
v2 = cgv == "2"
events = dict(l.split()[:2] for l in open(cg + ("/memory.events" if v2 else "/memory.oom_control")))
if int(events.get("oom_kill", 0)): bad.append("the cgroup OOM-killed it")
peak = int(open(cg + ("/memory.peak" if v2 else "/memory.max_usage_in_bytes")).read())
print("cgroup peak %.1f MiB, budget %.1f MiB" % (peak / 1048576, budget_bytes / 1048576))
if peak > budget_bytes: bad.append("cgroup peak %d > budget %d" % (peak, budget_bytes))
r10 = [r for t, r in rows if t == 10]
if r10 and rows:
    drift = (rows[-1][1] - r10[0]) / r10[0]
    print("RSS turn 10 %.1f MiB, turn %d %.1f MiB: drift %+.2f%%" % (r10[0] / 1048576, rows[-1][0],
          rows[-1][1] / 1048576, drift * 100))
    if abs(drift) >= 0.01: bad.append("RSS drift %.2f%% >= 1%%" % (drift * 100))
for b in bad: print("FAIL " + b)
print("chat-long: %s" % ("FAILED" if bad else "all checks passed"))
sys.exit(1 if bad else 0)
EOF
echo "chat-long: load at end: $(uptime | sed 's/.*load average: //')"
exit $st

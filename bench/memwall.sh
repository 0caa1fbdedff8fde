#!/bin/sh
# memwall.sh MODEL LIMIT [BUDGET] -- Sparrow and llama.cpp inside a memory
# cgroup whose limit counts the page cache: the memory wall, measured.
#
# For each engine setting, the page cache is dropped, the engine runs inside
# a fresh memory cgroup limited to LIMIT (v2, or the v1 memory controller
# where that is what the machine has), and the script records decode tok/s,
# the cgroup's peak (page cache included), the process's peak RSS and the
# bytes it read from storage.  Settings:
#   sparrow       sparrow bench --mem-budget BUDGET (default: LIMIT - 512 MiB)
#   peer-default  llama-bench (weights repacked into a heap copy)
#   peer-mmap     llama-completion -nr (weights left mmap-backed), its printed
#                 eval timings
# It also measures the storage read speed (O_DIRECT, bench/membw) in the same
# run and prints Sparrow's storage bound: read speed / bytes read per token.
#
# LIMIT and BUDGET take binary units: 8G = 8 GiB, 7.5G, 512M.
#
# Environment:
#   LLAMA_BENCH, LLAMA_COMPLETION  peer binaries; a setting is skipped when unset
#   SPARROW     sparrow binary (default: build/sparrow)
#   MEMBW, RUNIO  bench tools (default: build/bench/membw, build/bench/runio; make bench)
#   THREADS     threads (default 2)
#   N_PROMPT, N_GEN   prompt and generated tokens (default 16 and 16)
#   DEPTH       tokens already in the context (default 0): sparrow bench -d DEPTH
#               (decodes at that depth), llama-bench -d DEPTH -p 0 (its decode test
#               alone: the depth is filled once), llama-completion a prompt of
#               DEPTH + N_PROMPT tokens
#   PEER_TIMEOUT  seconds before a peer run is stopped (default 1800)
#   SPARROW_ARGS  extra arguments for sparrow bench (e.g. "-c 8192 -ctk q8_0 -ctv q8_0")
#   LLAMA_ARGS  extra arguments for both peer settings (e.g. "-fa on -ctk q8_0 -ctv q8_0")
#   PROMPT_TEXT  a text the mmap setting's prompt is cut from when DEPTH + N_PROMPT > 16,
#               to that many tokens by Sparrow's tokenizer of MODEL (default: the
#               TinyStories excerpt in SPARROW_SHARED, repeated as needed); its context
#               is then the prompt + N_GEN (llama-bench sizes its own)
#   KEEP        a folder to keep the raw outputs in
# Needs root (cgroups, drop_caches) and python3 (JSON).
set -eu

usage() {
    echo "usage: [LLAMA_BENCH=...] [LLAMA_COMPLETION=...] $0 MODEL LIMIT [BUDGET]" >&2
    exit 2
}
[ $# -ge 2 ] && [ $# -le 3 ] || usage
MODEL=$1
root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
MEMBW=${MEMBW:-$root/build/bench/membw}
RUNIO=${RUNIO:-$root/build/bench/runio}
THREADS=${THREADS:-2}
N_PROMPT=${N_PROMPT:-16}
N_GEN=${N_GEN:-16}
DEPTH=${DEPTH:-0}
PEER_TIMEOUT=${PEER_TIMEOUT:-1800}
SPARROW_ARGS=${SPARROW_ARGS:-}
LLAMA_ARGS=${LLAMA_ARGS:-}
SPARROW_SHARED=${SPARROW_SHARED:-$root/../shared}
PROMPT_TEXT=${PROMPT_TEXT:-$SPARROW_SHARED/peer-golden/tinystories-valid-excerpt.txt}

to_bytes() { # 7.5G -> bytes (binary units)
    python3 -c '
import re, sys
m = re.fullmatch(r"([0-9]*\.?[0-9]+)([KMGT]?)(i?B)?", sys.argv[1], re.I)
if not m: sys.exit(1)
mul = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
print(int(float(m.group(1)) * mul))' "$1" || { echo "memwall.sh: bad size '$1'" >&2; exit 2; }
}
command -v python3 >/dev/null || { echo "memwall.sh: python3 is needed" >&2; exit 2; }
LIMIT=$(to_bytes "$2")
if [ $# -ge 3 ]; then BUDGET=$(to_bytes "$3"); else BUDGET=$((LIMIT - 536870912)); fi
[ -r "$MODEL" ] || { echo "memwall.sh: cannot read model '$MODEL'" >&2; exit 2; }
for b in "$SPARROW" "$MEMBW" "$RUNIO"; do
    [ -x "$b" ] || { echo "memwall.sh: missing '$b' (run make && make bench)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "memwall.sh: needs root (cgroups, drop_caches)" >&2; exit 2; }

# ---- the cgroup ----------------------------------------------------------
. "$(dirname "$0")/cgroup.sh"
cg_init sparrow-memwall || { echo "memwall.sh: no memory cgroup controller (neither v2 nor v1)" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-memwall.XXXXXX")
cleanup() {
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$tmp"/* "$KEEP"/ 2>/dev/null || true; fi
    rm -rf "$tmp"
    cg_remove
}
trap cleanup EXIT
trap 'exit 1' INT TERM

drop_caches() {
    sync
    echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "memwall.sh: warning: cannot drop the page cache" >&2
}
in_cg() { # run "$@" inside the group
    procs=$CG/cgroup.procs
    sh -c 'echo $$ > "$1"; shift; exec "$@"' sh "$procs" "$@"
}

echo "memwall: $MODEL ($(du -h "$MODEL" | cut -f1)), cgroup v$CGV limit $(($LIMIT / 1048576)) MiB," \
     "budget $(($BUDGET / 1048576)) MiB, threads $THREADS, depth $DEPTH, prompt $N_PROMPT, gen $N_GEN"

# ---- storage read speed -----------------------------------------------------------------
# O_DIRECT, 8 MiB blocks, 8 in flight (the pager's 8 I/O threads), 3 passes over the
# same 4 GiB of the model.  On this machine kind a range read again soon after
# comes faster (~1.1 GB/s) than the first time (~0.65 GB/s) -- a cache below
# the VM -- and an engine re-reads the same weights every token, so the bound
# uses the best pass: the most the storage delivered, which makes the bound
# the hardest to reach.
drop_caches
"$MEMBW" --file "$MODEL" --mode direct --limit 4096 --passes 3 --block 8192 --qd 8 --json > "$tmp/membw.json"
READ_GBPS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][0]["gbps_best"])' "$tmp/membw.json")
READ_MED=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][0]["gbps_median"])' "$tmp/membw.json")
echo "storage: O_DIRECT read, best of 3 passes $READ_GBPS GB/s (median $READ_MED GB/s)"

# ---- Sparrow ------------------------------------------------------------------
drop_caches
cg_make "$LIMIT"
set +e
# shellcheck disable=SC2086
in_cg "$SPARROW" bench -m "$MODEL" --mem-budget "$BUDGET" -d "$DEPTH" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" --json \
    $SPARROW_ARGS > "$tmp/sparrow.json" 2> "$tmp/sparrow.err"
rc=$?
set -e
echo "{\"rc\": $rc, \"cg_peak\": $(cg_peak), \"oom\": $(cg_oom)}" > "$tmp/sparrow.cg"
[ $rc = 0 ] || { echo "memwall.sh: sparrow failed (rc $rc):" >&2; tail -5 "$tmp/sparrow.err" >&2; }

# ---- llama.cpp, default (repacked heap copy) ---------------------------------------
if [ -n "${LLAMA_BENCH:-}" ]; then
    peer_pp="-p $N_PROMPT"
    [ "$DEPTH" -gt 0 ] && peer_pp="-d $DEPTH -p 0"
    drop_caches
    cg_make "$LIMIT"
    set +e
    # shellcheck disable=SC2086
    in_cg timeout "$PEER_TIMEOUT" "$RUNIO" -o "$tmp/peer-default.io" -- "$LLAMA_BENCH" -m "$MODEL" \
        $peer_pp -n "$N_GEN" -r 1 -t "$THREADS" -o json $LLAMA_ARGS > "$tmp/peer-default.json" \
        2> "$tmp/peer-default.err"
    rc=$?
    set -e
    echo "{\"rc\": $rc, \"cg_peak\": $(cg_peak), \"oom\": $(cg_oom)}" > "$tmp/peer-default.cg"
fi

# ---- llama.cpp, mmap-backed (-nr) ----------------------------------------------------
if [ -n "${LLAMA_COMPLETION:-}" ]; then
    printf 'Once upon a time' > "$tmp/prompt.txt"
    peer_ctx=""
    n_mmap=$((DEPTH + N_PROMPT))
    if [ "$n_mmap" -gt 16 ]; then # a prompt of DEPTH + N_PROMPT tokens (BOS included) by MODEL's vocabulary
        [ -r "$PROMPT_TEXT" ] || { echo "memwall.sh: cannot read PROMPT_TEXT '$PROMPT_TEXT'" >&2; exit 2; }
        python3 - "$SPARROW" "$MODEL" "$PROMPT_TEXT" "$n_mmap" "$tmp/prompt.txt" <<'EOF2'
import subprocess, sys
sparrow, model, src, want, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
base = open(src, encoding="utf-8", errors="replace").read()
def count(t):
    r = subprocess.run([sparrow, "tokenize", "-m", model, "--file", "-"], input=t.encode(), capture_output=True, check=True)
    return len(r.stdout.split())
text = base
while count(text) < want: text += "\n" + base
lo, hi = 0, len(text)  # the longest prefix with at most `want` tokens
while lo < hi:
    mid = (lo + hi + 1) // 2
    if count(text[:mid]) <= want: lo = mid
    else: hi = mid - 1
open(out, "w", encoding="utf-8").write(text[:lo])
print("memwall: the mmap setting's prompt: %d tokens (%d characters)" % (count(text[:lo]), lo))
EOF2
        peer_ctx="-c $((n_mmap + N_GEN))"
    fi
    drop_caches
    cg_make "$LIMIT"
    set +e
    # shellcheck disable=SC2086
    in_cg timeout "$PEER_TIMEOUT" "$RUNIO" -o "$tmp/peer-mmap.io" -- "$LLAMA_COMPLETION" -m "$MODEL" -nr \
        -f "$tmp/prompt.txt" -n "$N_GEN" -t "$THREADS" --temp 0 -no-cnv --ignore-eos $peer_ctx $LLAMA_ARGS \
        > "$tmp/peer-mmap.out" 2> "$tmp/peer-mmap.err" < /dev/null
    rc=$?
    set -e
    echo "{\"rc\": $rc, \"cg_peak\": $(cg_peak), \"oom\": $(cg_oom)}" > "$tmp/peer-mmap.cg"
fi

# ---- the table ------------------------------------------------------------------------
python3 - "$tmp" "$READ_GBPS" "$N_GEN" "$BUDGET" "$LIMIT" <<'EOF'
import json, os, re, sys
tmp, read_gbps, n_gen, budget, limit = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def load(name):
    p = os.path.join(tmp, name)
    if not os.path.exists(p): return None
    try: return json.load(open(p))
    except Exception: return None
rows = []
MiB = 1048576
# Sparrow
s, scg = load("sparrow.json"), load("sparrow.cg")
if scg is not None:
    if s:
        bpt = s.get("bytes_read_per_token")
        bound = read_gbps * 1e9 / bpt if bpt and bpt >= MiB else None  # no bound when (almost) nothing streams
        rows.append(("sparrow --mem-budget %.2fG" % (budget / 2**30), s["decode_tps"], scg["cg_peak"], s["peak_rss_bytes"],
                     bpt, bound, s.get("expert_hit_rate"), s.get("prefetch_accuracy"), "ok"))
    else:
        rows.append(("sparrow", None, scg["cg_peak"], None, None, None, None, None, "failed rc %d" % scg["rc"]))
# peer default
pcg = load("peer-default.cg")
if pcg is not None:
    io = load("peer-default.io") or {}
    tps, status = None, "ok"
    try:
        runs = json.load(open(os.path.join(tmp, "peer-default.json")))
        for r in runs:
            if r.get("n_gen", 0) > 0: tps = r["avg_ts"]
    except Exception:
        pass
    if pcg["oom"] or (tps is None and pcg["rc"] != 0):
        status = "OOM-killed" if pcg["oom"] else "failed rc %d" % pcg["rc"]
    if pcg["rc"] == 124: status = "timed out"
    rows.append(("llama.cpp default (repacked)", tps, pcg["cg_peak"], io.get("max_rss_bytes"), None, None, None, None, status))
# peer mmap
mcg = load("peer-mmap.cg")
if mcg is not None:
    io = load("peer-mmap.io") or {}
    tps, ntok, status = None, None, "ok"
    err = open(os.path.join(tmp, "peer-mmap.err"), errors="replace").read() if os.path.exists(os.path.join(tmp, "peer-mmap.err")) else ""
    m = re.search(r"\beval time =\s*([0-9.]+) ms /\s*(\d+) runs.*?([0-9.]+) tokens per second", err)
    if m and "prompt" not in err[max(0, m.start() - 8):m.start()]:
        tps, ntok = float(m.group(3)), int(m.group(2))
    for m in re.finditer(r"(prompt )?eval time =\s*([0-9.]+) ms /\s*(\d+) (runs|tokens).*?([0-9.]+) tokens per second", err):
        if not m.group(1): tps, ntok = float(m.group(5)), int(m.group(3))
    if mcg["oom"]: status = "OOM-killed"
    elif mcg["rc"] == 124: status = "timed out"
    elif tps is None: status = "failed rc %d" % mcg["rc"]
    rb = io.get("read_bytes")
    rows.append(("llama.cpp mmap (-nr)", tps, mcg["cg_peak"], io.get("max_rss_bytes"), None, None, None, None, status))
    if rb is not None:
        print("llama.cpp mmap: %.1f MiB read from storage in all (load, prompt and %d generated tokens)" % (rb / MiB, n_gen))
def f(v, fmt):
    return "-" if v is None else fmt % v
print()
print("| setting | decode tok/s | cgroup peak MiB | peak RSS MiB | read/token MiB | storage bound tok/s | expert hit | prefetch acc | status |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (r[0], f(r[1], "%.3f"), f(r[2] / MiB, "%.0f") if isinstance(r[2], (int, float)) else "-",
          f(r[3] / MiB if r[3] else None, "%.0f"), f(r[4] / MiB if r[4] else None, "%.1f"), f(r[5], "%.3f"),
          f(r[6], "%.3f"), f(r[7], "%.3f"), r[8]))
sp = rows[0] if rows and rows[0][0].startswith("sparrow") else None
peers = [r[1] for r in rows[1:] if r[1]]
print()
if sp and sp[1]:
    print("sparrow: peak within budget: %s (cgroup peak %.0f MiB, budget %.0f MiB, +5%% = %.0f MiB)" % (
        "yes" if sp[2] <= budget * 1.05 else "NO", sp[2] / MiB, budget / MiB, budget * 1.05 / MiB))
    if sp[5]: print("sparrow: %.0f%% of its storage bound (%.3f tok/s at %.2f GB/s)" % (100 * sp[1] / sp[5], sp[5], read_gbps))
    if peers: print("sparrow / best llama.cpp setting: %.2fx" % (sp[1] / max(peers)))
    elif len(rows) > 1: print("sparrow / llama.cpp: no peer setting produced a figure (see status)")
EOF

#!/bin/sh
# serve-wall.sh [MODEL] -- issue 17, acceptance 4: `sparrow serve` inside the
# memory wall.  The server runs in a fresh memory cgroup limited to LIMIT
# (whose count includes the page cache the model's reads bring in) with
# --mem-budget BUDGET -np SLOTS; CHATS conversations of TURNS turns each run
# at once against it (bench/serve-chats.mjs: streamed chat completions, the
# whole history every turn); then the script reports the cgroup's peak
# against the budget and exits 1 if the peak is over the budget, a turn
# failed, or the group OOM-killed anything.
#
# MODEL defaults to $SPARROW_SCRATCH/qwen3-30b-a3b-q4_0.gguf (synthetic
# qwen3-30b-a3b, Q4_0, ~17 GB).  Sizes take binary units: 8G = 8 GiB, 7.5G.
#
# Environment:
#   LIMIT       the cgroup's limit (default 8G)
#   BUDGET      sparrow's --mem-budget (default 7.5G)
#   SLOTS       -np (default 2)
#   CHATS       conversations at once (default: SLOTS)
#   TURNS       turns per conversation (default 3)
#   MAX_TOKENS  tokens per answer (default 48)
#   CTX         -c, each slot's context (default 2048)
#   THREADS     -t (default 2)
#   LOAD_TIMEOUT  seconds to wait for the server to listen (default 600)
#   RUN_TIMEOUT   seconds the chats may take in all (default 3600)
#   SPARROW     the sparrow binary (default build/sparrow; it runs build/sparrow-server)
#   SERVE_ARGS  more arguments for sparrow serve (e.g. "-ctk q8_0 -ctv q8_0")
#   KEEP        a folder to keep the server's log and the chats' JSON in
#   DROP_CACHES 0 keeps the page cache as it is (default 1: dropped first, so
#               that the model's pages are read, and charged, inside the group)
# Needs root (cgroups, drop_caches), python3 (sizes) and node (the chats).
# cgroup v2 (a group under the root: memory.max, memory.peak; where the
# kernel has no memory.peak, memory.current sampled every 0.2 s) or v1 (a
# group under the shell's own memory group, or CG_PARENT: memory/<group>/
# memory.limit_in_bytes, memory.max_usage_in_bytes, cgroup.procs).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW_SCRATCH=${SPARROW_SCRATCH:-$root/../scratch}
MODEL=${1:-$SPARROW_SCRATCH/qwen3-30b-a3b-q4_0.gguf}
SPARROW=${SPARROW:-$root/build/sparrow}
LIMIT_ARG=${LIMIT:-8G}
BUDGET_ARG=${BUDGET:-7.5G}
SLOTS=${SLOTS:-2}
CHATS=${CHATS:-$SLOTS}
TURNS=${TURNS:-3}
MAX_TOKENS=${MAX_TOKENS:-48}
CTX=${CTX:-2048}
THREADS=${THREADS:-2}
LOAD_TIMEOUT=${LOAD_TIMEOUT:-600}
RUN_TIMEOUT=${RUN_TIMEOUT:-3600}
SERVE_ARGS=${SERVE_ARGS:-}

die() { echo "serve-wall.sh: $*" >&2; exit 2; }
command -v python3 >/dev/null || die "python3 is needed"
command -v node >/dev/null || die "node is needed"
command -v curl >/dev/null || die "curl is needed"
to_bytes() { # 7.5G -> bytes (binary units)
    python3 -c '
import re, sys
m = re.fullmatch(r"([0-9]*\.?[0-9]+)([KMGT]?)(i?B)?", sys.argv[1], re.I)
if not m: sys.exit(1)
mul = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
print(int(float(m.group(1)) * mul))' "$1" || die "bad size '$1'"
}
LIMIT=$(to_bytes "$LIMIT_ARG")
BUDGET=$(to_bytes "$BUDGET_ARG")
[ -r "$MODEL" ] || die "cannot read model '$MODEL'"
[ -x "$SPARROW" ] || die "missing '$SPARROW' (run make)"
[ -x "$(dirname "$SPARROW")/sparrow-server" ] || die "missing $(dirname "$SPARROW")/sparrow-server (run make)"
[ "$(id -u)" = 0 ] || die "needs root (cgroups, drop_caches)"

# ---- the cgroup (as bench/memwall.sh) ---------------------------------------------
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    CGV=2
    CG=/sys/fs/cgroup/sparrow-serve-wall.$$
    # the memory controller must be enabled for the root's children
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
        echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
elif [ -d /sys/fs/cgroup/memory ]; then
    CGV=1
    # under this shell's own memory group (v1 nests freely): what limits the
    # caller limits the server too
    own=$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)
    CG=/sys/fs/cgroup/memory${CG_PARENT:-$own}/sparrow-serve-wall.$$
    CG=$(echo "$CG" | sed 's|//*|/|g')
else
    die "no memory cgroup controller (neither v2 nor v1)"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-serve-wall.XXXXXX")
server_pid= sampler_pid=
cleanup() {
    [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null || true
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        i=0
        while kill -0 "$server_pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        kill -KILL "$server_pid" 2>/dev/null || true
    fi
    if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$tmp"/* "$KEEP"/ 2>/dev/null || true; fi
    rm -rf "$tmp"
    if [ -d "$CG" ]; then
        i=0 # the group goes once its last process has
        while ! rmdir "$CG" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

mkdir "$CG"
if [ $CGV = 2 ]; then
    echo "$LIMIT" > "$CG/memory.max"
    [ -f "$CG/memory.swap.max" ] && echo 0 > "$CG/memory.swap.max"
else
    echo "$LIMIT" > "$CG/memory.limit_in_bytes"
    [ -f "$CG/memory.memsw.limit_in_bytes" ] && echo "$LIMIT" > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
    echo 0 > "$CG/memory.max_usage_in_bytes" 2>/dev/null || true
fi
cg_current() {
    if [ $CGV = 2 ]; then cat "$CG/memory.current"; else cat "$CG/memory.usage_in_bytes"; fi
}
cg_oom() { # 1 if the group OOM-killed something
    if [ $CGV = 2 ]; then awk '$1 == "oom_kill" { k = $2 } END { print (k > 0) ? 1 : 0 }' "$CG/memory.events"
    else awk '$1 == "oom_kill" { k = $2 } END { print (k > 0) ? 1 : 0 }' "$CG/memory.oom_control"; fi
}
# the peak: the kernel's own where it keeps one, else the largest sample
cg_peak() {
    if [ $CGV = 2 ] && [ -f "$CG/memory.peak" ]; then cat "$CG/memory.peak"
    elif [ $CGV = 1 ]; then cat "$CG/memory.max_usage_in_bytes"
    else sort -n "$tmp/samples" | tail -n 1; fi
}
peak_source() {
    if [ $CGV = 2 ] && [ -f "$CG/memory.peak" ]; then echo "memory.peak"
    elif [ $CGV = 1 ]; then echo "memory.max_usage_in_bytes"
    else echo "memory.current sampled every 0.2 s"; fi
}

# a cold page cache: pages cached before would be charged to whoever read them
# first, not to this group, and the peak would look smaller than it is
if [ "${DROP_CACHES:-1}" != 0 ]; then
    sync
    echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "serve-wall.sh: warning: cannot drop the page cache" >&2
fi

echo "serve-wall: $MODEL ($(du -h "$MODEL" | cut -f1)), cgroup v$CGV limit $((LIMIT / 1048576)) MiB," \
     "budget $((BUDGET / 1048576)) MiB, -np $SLOTS -c $CTX -t $THREADS, $CHATS chats x $TURNS turns x $MAX_TOKENS tokens"

# ---- the server, inside the group -------------------------------------------------
: > "$tmp/samples"
( while :; do cg_current >> "$tmp/samples" 2>/dev/null || true; sleep 0.2; done ) &
sampler_pid=$!
: > "$tmp/server.log"
# shellcheck disable=SC2086
sh -c 'echo $$ > "$1"; shift; exec "$@"' sh "$CG/cgroup.procs" \
    "$SPARROW" serve -m "$MODEL" --mem-budget "$BUDGET" -np "$SLOTS" -c "$CTX" -t "$THREADS" --port 0 $SERVE_ARGS \
    > "$tmp/server.log" 2>&1 &
server_pid=$!
url= i=0
t_start=$(date +%s)
while [ -z "$url" ]; do
    url=$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$tmp/server.log" | head -n 1)
    [ -n "$url" ] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "serve-wall.sh: the server exited before listening:" >&2
        tail -n 8 "$tmp/server.log" >&2
        echo "cgroup peak $(($(cg_peak) / 1048576)) MiB, OOM kill: $(cg_oom)" >&2
        exit 1
    fi
    [ $(($(date +%s) - t_start)) -lt "$LOAD_TIMEOUT" ] || { echo "serve-wall.sh: no server after $LOAD_TIMEOUT s" >&2; exit 1; }
    sleep 0.2
done
t_listen=$(($(date +%s) - t_start))
echo "serve-wall: listening at $url after $t_listen s; cgroup at $(($(cg_current) / 1048576)) MiB"

# ---- the chats --------------------------------------------------------------------
set +e
timeout "$RUN_TIMEOUT" node "$root/bench/serve-chats.mjs" "$url" "$CHATS" "$TURNS" "$MAX_TOKENS" \
    > "$tmp/chats.json" 2> "$tmp/chats.err"
chats_rc=$?
set -e
slots=$(curl -s --max-time 10 "$url/slots" || true)
alive=1
kill -0 "$server_pid" 2>/dev/null || alive=0

peak=$(cg_peak)
oom=$(cg_oom)
kill -TERM "$server_pid" 2>/dev/null || true
i=0
while kill -0 "$server_pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
server_rc=0
wait "$server_pid" 2>/dev/null || server_rc=$?
server_pid=

# ---- the report --------------------------------------------------------------------
python3 - "$tmp/chats.json" <<'EOF' || true
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
print("| chat | turn | prompt tokens | answer tokens | ttft ms | ms |")
print("|---:|---:|---:|---:|---:|---:|")
for c in r["results"]:
    for t, x in enumerate(c["turns"]):
        print("| %d | %d | %s | %s | %s | %s |" % (c["chat"], t + 1, x["prompt_tokens"], x["completion_tokens"],
                                                 x["ttft_ms"], x["ms"]))
EOF
[ -s "$tmp/chats.err" ] && sed 's/^/chats: /' "$tmp/chats.err"
echo "serve-wall: cgroup peak $((peak / 1048576)) MiB ($(peak_source)), budget $((BUDGET / 1048576)) MiB," \
     "limit $((LIMIT / 1048576)) MiB; OOM kill: $oom; chats: $([ $chats_rc = 0 ] && echo all turns served || echo "FAILED (rc $chats_rc)");" \
     "server: $([ $alive = 1 ] && echo "alive, exit $server_rc on SIGTERM" || echo died)"
case "$slots" in *'"is_processing":true'*) echo "serve-wall: a slot was still busy at the end: $slots"; chats_rc=1;; esac
fail=0
if [ "$peak" -le "$BUDGET" ]; then echo "serve-wall: peak within the budget: yes"; else
    echo "serve-wall: peak within the budget: NO (over by $(((peak - BUDGET) / 1048576)) MiB)"; fail=1; fi
[ "$oom" = 0 ] || fail=1
[ "$chats_rc" = 0 ] || fail=1
[ "$alive" = 1 ] || fail=1
exit $fail

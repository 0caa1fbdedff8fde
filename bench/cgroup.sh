# bench/cgroup.sh -- sourced by the bench scripts that run a process inside a
# memory cgroup: cgroup v2 (/sys/fs/cgroup/<group>: memory.max, memory.peak,
# memory.events) or, on hosts still on the v1 hierarchy,
# /sys/fs/cgroup/memory/<group> (memory.limit_in_bytes,
# memory.max_usage_in_bytes, memory.oom_control).  Needs root.
#   cg_init NAME      sets CGV (2 or 1) and CG (the group's folder; not made yet);
#                     returns 1 when there is no memory controller
#   cg_make LIMIT     a fresh group with LIMIT bytes (swap off), peak reset
#   cg_enter          prints a sh -c program that moves itself into the group and
#                     execs its arguments: sh -c "$(cg_enter)" "$CG" cmd args...
#   cg_peak           the group's peak usage in bytes
#   cg_oom            1 if the group OOM-killed something, else 0
#   cg_remove         kills what is left in the group (a script stopped early
#                     leaves its child running there), then removes the group
cg_init() {
    if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
        CGV=2; CG=/sys/fs/cgroup/$1.$$
    elif [ -d /sys/fs/cgroup/memory ]; then
        CGV=1; CG=/sys/fs/cgroup/memory/$1.$$
    else
        return 1
    fi
}
cg_make() {
    [ -d "$CG" ] && rmdir "$CG" 2>/dev/null || true
    mkdir "$CG"
    if [ "$CGV" = 2 ]; then
        echo "$1" >"$CG/memory.max"
        [ -f "$CG/memory.swap.max" ] && echo 0 >"$CG/memory.swap.max"
    else
        echo "$1" >"$CG/memory.limit_in_bytes"
        [ -f "$CG/memory.memsw.limit_in_bytes" ] && echo "$1" >"$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
        echo 0 >"$CG/memory.max_usage_in_bytes" 2>/dev/null || true
    fi
}
cg_enter() { echo 'echo $$ > "$0/cgroup.procs"; exec "$@"'; }
cg_peak() {
    if [ "$CGV" = 2 ]; then cat "$CG/memory.peak" 2>/dev/null || echo null
    else cat "$CG/memory.max_usage_in_bytes"; fi
}
cg_oom() {
    if [ "$CGV" = 2 ]; then f=$CG/memory.events; else f=$CG/memory.oom_control; fi
    awk '$1 == "oom_kill" { k = ($2 > 0) } END { print k + 0 }' "$f"
}
cg_remove() {
    [ -d "$CG" ] || return 0
    for i in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(cat "$CG/cgroup.procs" 2>/dev/null)
        [ -z "$pids" ] && break
        kill $pids 2>/dev/null || true
        sleep 0.5
    done
    rmdir "$CG" 2>/dev/null || true
}

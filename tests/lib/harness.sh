# harness.sh -- sourced by the black-box shell tests (tests/test_*.sh): a
# scratch folder removed on exit, pass/fail counters with ok/bad, sp, which
# runs $SPARROW with stdout in $tmp/out, stderr in $tmp/err and the exit
# status in $rc, assertions on those (t_rc, t_usage, t_out_has, ...) and need
# for fixtures under $SPARROW_SHARED.  The caller sets `name` (the scratch
# folder's prefix), SPARROW and SPARROW_SHARED first, and ends with
# harness_report.

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sparrow-${name:?set name before sourcing harness.sh}.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

n_pass=0
n_fail=0
ok() { n_pass=$((n_pass + 1)); echo "ok   $1"; }
bad() {
    n_fail=$((n_fail + 1))
    echo "FAIL $1"
    shift
    for line in "$@"; do echo "     $line"; done
}

# sp ARGS...: run sparrow; stdout -> $tmp/out, stderr -> $tmp/err, status -> $rc
sp() {
    "$SPARROW" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}

show_err() { printf 'stderr: %s' "$(head -c 400 "$tmp/err")"; }

# Assertions on the last sp call (stdout, stderr, $rc).
show_out() { printf 'stdout: %s' "$(head -c 400 "$tmp/out")"; }

# t_rc NAME WANT
t_rc() {
    if [ "$rc" -eq "$2" ]; then ok "$1: exit $2"; else bad "$1: exit $rc, want $2" "$(show_err)"; fi
}
# t_line NAME EXPECTED: stdout is exactly EXPECTED plus a newline
t_line() {
    printf '%s\n' "$2" >"$tmp/want"
    if cmp -s "$tmp/want" "$tmp/out"; then ok "$1: stdout '$2'"; else bad "$1: stdout differs, want '$2'" "$(show_out)" "$(show_err)"; fi
}
# t_file NAME FILE: stdout is byte-identical to FILE
t_file() {
    if cmp -s "$2" "$tmp/out"; then ok "$1: stdout matches $(basename "$2")"; else
        bad "$1: stdout differs from $(basename "$2")" "want:   $(head -c 300 "$2")" "$(show_out)" "$(show_err)"; fi
}
# t_empty_out NAME / t_empty_err NAME
t_empty_out() { if [ ! -s "$tmp/out" ]; then ok "$1: stdout empty"; else bad "$1: stdout not empty" "$(show_out)"; fi; }
t_empty_err() { if [ ! -s "$tmp/err" ]; then ok "$1: stderr empty"; else bad "$1: stderr not empty" "$(show_err)"; fi; }
# t_out_has NAME STRING... / t_err_has NAME STRING...: fixed strings present
t_out_has() {
    name=$1; shift
    for s in "$@"; do
        if grep -qF -e "$s" "$tmp/out"; then ok "$name: stdout has '$s'"; else bad "$name: stdout lacks '$s'" "$(show_out)"; fi
    done
}
t_err_has() {
    name=$1; shift
    for s in "$@"; do
        if grep -qF -e "$s" "$tmp/err"; then ok "$name: stderr has '$s'"; else bad "$name: stderr lacks '$s'" "$(show_err)"; fi
    done
}
# t_err_one_line NAME: stderr is exactly one line starting "sparrow: "
t_err_one_line() {
    lines=$(wc -l <"$tmp/err" | tr -d ' ')
    if [ "$lines" = 1 ] && head -n 1 "$tmp/err" | grep -q '^sparrow: '; then ok "$1: one-line error"; else
        bad "$1: stderr should be one 'sparrow: ' line, has $lines" "$(show_err)"; fi
}
# t_usage NAME ARGS...: a usage error: exit 2, nothing on stdout, one line on stderr
t_usage() {
    name=$1; shift
    sp "$@"
    t_rc "$name" 2
    t_empty_out "$name"
    t_err_one_line "$name"
}

# need REL: the fixture's path in $fx, or a failure naming it (returns 1)
need() {
    fx=$SPARROW_SHARED/$1
    if [ -r "$fx" ]; then return 0; fi
    bad "missing fixture: $fx (set SPARROW_SHARED to the shared/ folder)"
    return 1
}

# The closing "[NAME: ]N passed, N failed" line; the status says whether all passed.
harness_report() {
    echo "${1:+$1: }$n_pass passed, $n_fail failed"
    [ "$n_fail" -eq 0 ]
}

# harness.sh -- sourced by the black-box shell tests (tests/test_*.sh): a
# scratch folder removed on exit, pass/fail counters with ok/bad, and sp,
# which runs $SPARROW with stdout in $tmp/out, stderr in $tmp/err and the
# exit status in $rc.  The caller sets `name` (the scratch folder's prefix)
# and SPARROW first, and ends with harness_report.

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

# The closing "[NAME: ]N passed, N failed" line; the status says whether all passed.
harness_report() {
    echo "${1:+$1: }$n_pass passed, $n_fail failed"
    [ "$n_fail" -eq 0 ]
}

#!/bin/sh
# Runs every test binary in $BUILD/tests (default build/) and the CLI
# black-box script; prints one line per test and a closing "N passed, N failed".
# Fixtures come from $SPARROW_SHARED (default ../shared beside the repository).
# A test that runs longer than $TEST_TIMEOUT seconds (default 1200) fails: a
# hang (a deadlock, say) must not stall the whole run.
BUILD=${BUILD:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
: "${SPARROW_SHARED:=$root/../shared}"
export SPARROW_SHARED
TEST_TIMEOUT=${TEST_TIMEOUT:-1200}
pass=0; fail=0; failed=""
for t in "$root/$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.o|*.d) continue;; esac
    name=$(basename "$t")
    if timeout "$TEST_TIMEOUT" "$t" > "$root/$BUILD/tests/$name.log" 2>&1; then
        echo "PASS $name"; pass=$((pass+1))
    else
        echo "FAIL $name (log: $BUILD/tests/$name.log)"; tail -n 20 "$root/$BUILD/tests/$name.log"
        fail=$((fail+1)); failed="$failed $name"
    fi
done
for s in "$root"/tests/*.sh; do
    [ "$(basename "$s")" = run.sh ] && continue
    [ -f "$s" ] || continue
    name=$(basename "$s")
    if SPARROW="$root/$BUILD/sparrow" timeout "$TEST_TIMEOUT" sh "$s" > "$root/$BUILD/tests/$name.log" 2>&1; then
        echo "PASS $name"; pass=$((pass+1))
    else
        echo "FAIL $name (log: $BUILD/tests/$name.log)"; tail -n 20 "$root/$BUILD/tests/$name.log"
        fail=$((fail+1)); failed="$failed $name"
    fi
done
[ $fail -eq 0 ] || echo "failed:$failed"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

#!/bin/sh
# bench/iofault.sh -- the exhaustive storage-fault run (issue 20, acceptance 1):
# tests/test_iofault.c with --all, i.e. each fault kind (EIO -- hard on odd
# reads, once on even ones --, short read, EINTR, a 1 ms stall) injected at
# every read of a streaming run of stories260K-moe and tiny-qwen3moe under a
# budget, not only the first 200 and 200 drawn at random as the suite does.
# Every pass of every run must give the unbudgeted logits bit for bit or fail
# cleanly (SP_E_IO naming file and offset) and then continue.  BUILD selects
# the build (default build; build-asan for the sanitizers).  Runs niced;
# prints the machine's load before and after.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
export SPARROW_SHARED="${SPARROW_SHARED:-$root/../shared}"
[ -x "$root/$BUILD/tests/test_iofault" ] || { echo "build $BUILD/tests/test_iofault first (make)" >&2; exit 1; }
echo "iofault: $(lscpu | sed -n 's/^Model name: *//p'); $(uptime)"
rc=0
nice "$root/$BUILD/tests/test_iofault" --all || rc=$?
echo "iofault: done; $(uptime)"
exit "$rc"

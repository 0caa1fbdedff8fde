#!/bin/sh
# serve-load.sh -- issue 17, acceptance 3 in full: 8 clients x 50 requests
# against `sparrow serve` (tests/test_serve_load.sh with the full counts; the
# suite runs a short version).  MODEL, SLOTS, MAX_TOKENS may be set.
root=$(cd "$(dirname "$0")/.." && pwd)
CLIENTS=${CLIENTS:-8} REQUESTS=${REQUESTS:-50} FIRST=${FIRST:-5} MAX_TOKENS=${MAX_TOKENS:-32} \
    SPARROW=${SPARROW:-$root/build/sparrow} exec sh "$root/tests/test_serve_load.sh"

#!/bin/sh
# quant-table.sh [-r REF] [-t TEXT] [-c CTX] [-H] FILE[#LABEL]... -- quality at
# a size: runs `sparrow eval --json` on each model file against the reference
# REF and prints one Markdown table row per file: bpw, file size, perplexity,
# mean and 99th-percentile KL divergence (nats, KL(REF || file)) and top-1
# agreement, with the header first unless -H.  docs/QUANT.md is made with it;
# to add rows there, run it with -H on the new files and paste.
#
#   -r REF    reference model (default: the F32 stories260K file in $SPARROW_SHARED)
#   -t TEXT   text to evaluate on (default: the TinyStories excerpt in peer-golden/)
#   -c CTX    chunk length (default: 128)
#   -H        rows only, no header
#   LABEL     the row's name (default: the file's name); e.g. "out/mem4.gguf#mem4, calibrated"
#
# Environment: SPARROW (default build/sparrow beside this script), SPARROW_SHARED
# (default ../shared beside the repository), THREADS (default 2).  Needs python3.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
SPARROW=${SPARROW:-$root/build/sparrow}
SHARED=${SPARROW_SHARED:-$root/../shared}
THREADS=${THREADS:-2}
REF=$SHARED/models/stories260K/stories260K-f32.gguf
TEXT=$SHARED/peer-golden/tinystories-valid-excerpt.txt
CTX=128
HEADER=1

usage() {
    echo "usage: $0 [-r REF] [-t TEXT] [-c CTX] [-H] FILE[#LABEL]..." >&2
    exit 2
}
while getopts r:t:c:H opt; do
    case $opt in
    r) REF=$OPTARG ;;
    t) TEXT=$OPTARG ;;
    c) CTX=$OPTARG ;;
    H) HEADER= ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
[ -x "$SPARROW" ] || { echo "quant-table.sh: no sparrow binary at $SPARROW (run make)" >&2; exit 1; }

if [ -n "$HEADER" ]; then
    echo "| model | bpw | file size | ppl | kl_mean | kl_p99 | top1_agree |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
fi
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp" "$tmp.err"' EXIT
for arg in "$@"; do
    file=${arg%%#*}
    label=$(basename "$file")
    case $arg in *'#'*) label=${arg#*#} ;; esac
    if ! "$SPARROW" eval -m "$file" --ref "$REF" --text "$TEXT" -c "$CTX" -t "$THREADS" --json >"$tmp" 2>"$tmp.err"; then
        echo "quant-table.sh: eval failed on $file: $(tail -n 1 "$tmp.err")" >&2
        rm -f "$tmp.err"
        exit 1
    fi
    rm -f "$tmp.err"
    python3 - "$tmp" "$label" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
size = j["file_size"]
human = "%.1f KiB" % (size / 1024) if size < 1 << 20 else "%.2f MiB" % (size / (1 << 20))
print("| %s | %.3f | %s | %.4f ± %.4f | %.6f | %.4f | %.4f |" % (
    sys.argv[2], j["bpw"], human, j["ppl"], j["ppl_err"], j["kl_mean"], j["kl_p99"], j["top1_agree"]))
PY
done

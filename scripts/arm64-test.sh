#!/bin/sh
# arm64-test.sh -- cross-builds Sparrow for AArch64 (build-arm64/) and runs
# the ARM kernel tests and the stories260K golden test under qemu-user:
#   - test_kernels on a CPU with the dot product extension (-cpu max): both
#     levels, neon and dotprod, against the reference kernels;
#   - test_native (Sparrow's native block types) on -cpu max (neon and
#     dotprod) and on a Cortex-A72 (neon only);
#   - test_neon: the dispatch table follows detection and SPARROW_ISA, on
#     -cpu max (dotprod expected), with SPARROW_ISA=neon, and on a
#     Cortex-A72 (no dotprod: detection must say so);
#   - test_golden (SPARROW_GOLDEN_FILTER=stories260K) through the dotprod
#     kernels and again through the plain NEON ones (SPARROW_ISA=neon).
# Installs what is missing first (Debian: the cross compiler, qemu-user and
# the arm64 -dev libraries through multiarch; needs root or sudo then).
# Options: --all also runs every other test binary under qemu;
#          --no-install fails instead of installing.
# Prints one line per step and "N passed, N failed"; exits non-zero on any
# failure.  Fixtures: $SPARROW_SHARED (default ../shared beside the repo).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD=${ARM64_BUILD:-build-arm64}
CROSS_CC=${ARM64_CC:-aarch64-linux-gnu-gcc}
: "${SPARROW_SHARED:=$root/../shared}"
export SPARROW_SHARED

all=0
install=1
for a in "$@"; do
    case "$a" in
    --all) all=1 ;;
    --no-install) install=0 ;;
    *) echo "usage: $0 [--all] [--no-install]" >&2; exit 2 ;;
    esac
done

# ---- packages -------------------------------------------------------------
# The arm64 libpcre2/libcjson/libzstd/libssl/libedit/libmicrohttpd (and with them libc6:arm64, whose loader
# /lib/ld-linux-aarch64.so.1 qemu then uses) come from Debian's arm64
# archive through multiarch; they install beside the amd64 ones.
need=""
for p in gcc-aarch64-linux-gnu libc6-dev-arm64-cross libpcre2-dev:arm64 libcjson-dev:arm64 libzstd-dev:arm64 libssl-dev:arm64 libedit-dev:arm64 libmicrohttpd-dev:arm64; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
command -v qemu-aarch64 >/dev/null 2>&1 || command -v qemu-aarch64-static >/dev/null 2>&1 || need="$need qemu-user"
if [ -n "$need" ]; then
    if [ "$install" -eq 0 ]; then
        echo "arm64-test: missing packages:$need (run without --no-install, as root)" >&2
        exit 1
    fi
    echo "arm64-test: installing$need"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64 || exit 1
    $SUDO apt-get update -qq || exit 1
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null || {
        echo "arm64-test: apt-get install$need failed" >&2
        exit 1
    }
fi
QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
# With multiarch libc6:arm64 present, its own loader must be used: mixing the
# cross toolchain's ld.so (-L /usr/aarch64-linux-gnu) with the multiarch
# libc.so hangs in pthread_create when their versions differ.
if [ -e /lib/ld-linux-aarch64.so.1 ]; then
    QEMU_L=""
else
    QEMU_L="-L /usr/aarch64-linux-gnu"
fi

# ---- build ----------------------------------------------------------------
t0=$(date +%s)
mkdir -p "$root/$BUILD"
echo "arm64-test: make CC=$CROSS_CC BUILD=$BUILD all"
if ! make -s CC="$CROSS_CC" BUILD="$BUILD" -j2 all >"$root/$BUILD/build.log" 2>&1; then
    tail -n 30 "$root/$BUILD/build.log"
    echo "FAIL arm64 cross-build (log: $BUILD/build.log)"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "arm64-test: built in $(($(date +%s) - t0)) s; running under $QEMU"

# ---- runs -----------------------------------------------------------------
pass=0
fail=0
failed=""
# step NAME QEMU_CPU BINARY [VAR=VALUE ...]
step() {
    name=$1 cpu=$2 bin=$3
    shift 3
    log="$root/$BUILD/tests/$name.log"
    s0=$(date +%s)
    # shellcheck disable=SC2086
    if env "$@" "$QEMU" $QEMU_L -cpu "$cpu" "$root/$BUILD/tests/$bin" >"$log" 2>&1; then
        echo "PASS $name ($(($(date +%s) - s0)) s)"
        pass=$((pass + 1))
    else
        echo "FAIL $name ($(($(date +%s) - s0)) s, log: $BUILD/tests/$name.log)"
        tail -n 20 "$log"
        fail=$((fail + 1))
        failed="$failed $name"
    fi
}

step kernels-max max test_kernels
step kv-max max test_kv
step kv-a72 cortex-a72 test_kv
step native-max max test_native
step native-a72 cortex-a72 test_native
step dispatch-max max test_neon SPARROW_EXPECT_DOTPROD=1
step dispatch-isa-neon max test_neon SPARROW_EXPECT_DOTPROD=1 SPARROW_ISA=neon
step dispatch-a72 cortex-a72 test_neon SPARROW_EXPECT_DOTPROD=0
step golden-dotprod max test_golden SPARROW_GOLDEN_FILTER=stories260K
step golden-neon max test_golden SPARROW_GOLDEN_FILTER=stories260K SPARROW_ISA=neon
if [ "$all" -eq 1 ]; then
    for t in "$root/$BUILD"/tests/test_*; do
        [ -x "$t" ] || continue
        b=$(basename "$t")
        case "$b" in *.o | *.d | *.log | test_kernels | test_native | test_neon | test_golden) continue ;; esac
        step "$b" max "$b"
    done
fi

echo "arm64-test: total $(($(date +%s) - t0)) s"
[ "$fail" -eq 0 ] || echo "arm64 failed:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

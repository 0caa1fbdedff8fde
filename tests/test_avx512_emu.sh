#!/bin/sh
# Runs tests/test_kernels.c and tests/test_native.c against src/quant/x86/avx512.c built with SIMDe
# (portable AVX-512 intrinsics), so the AVX-512/VNNI kernels are checked on
# CPUs without AVX-512 too.  Skips (passes) where SIMDe's headers or an
# x86-64 compiler are missing.  Builds into $BUILD/emu (default build/).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
CC=${CC:-cc}
case "$($CC -dumpmachine)" in x86_64*) ;; *) echo "skip: not x86-64"; exit 0;; esac
if ! printf '#include <simde/x86/avx512.h>\n' | $CC -E -x c - >/dev/null 2>&1; then
    echo "skip: SIMDe headers not installed (Debian: libsimde-dev)"; exit 0
fi
lib="$root/$BUILD/libsparrow.a"
[ -f "$lib" ] || { echo "missing $lib (build first)"; exit 1; }
out="$root/$BUILD/emu"
mkdir -p "$out"
flags="-std=c11 -D_GNU_SOURCE -O1 -g -Wno-psabi -I$root/include -I$root/src -I$root/tests -mavx2 -mfma -mf16c"
# a sanitizer build of the library (make asan) needs the same at link time
if nm "$lib" 2>/dev/null | grep -q __asan_init; then
    flags="$flags -fsanitize=address,undefined -fno-sanitize-recover=all"
fi
$CC $flags -include "$root/tests/emu/simde_avx512.h" -c "$root/src/quant/x86/avx512.c" -o "$out/avx512_emu.o"
$CC $flags -DSP_TEST_EMULATED_AVX512 "$root/tests/test_kernels.c" "$out/avx512_emu.o" "$lib" \
    -lpcre2-8 -lzstd -lcrypto -lm -lpthread -o "$out/test_kernels_emu"
"$out/test_kernels_emu"
# the native block types' kernels (x86/native_kernels.inc, inside avx512.c)
$CC $flags -DSP_TEST_EMULATED_AVX512 "$root/tests/test_native.c" "$out/avx512_emu.o" "$lib" \
    -lpcre2-8 -lzstd -lcrypto -lm -lpthread -o "$out/test_native_emu"
"$out/test_native_emu"

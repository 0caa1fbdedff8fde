# Sparrow -- one small Makefile in calm's shape: wildcard sources, out-of-tree
# build directory, -MMD -MP dependencies, per-ISA flags per file.
#
#   make deps       install the Debian packages the build needs (apt-get)
#   make            build build/sparrow and build/libsparrow.a
#   make test       build and run every test binary (tests/run.sh)
#   make asan       the same tests under AddressSanitizer + UBSan (build-asan/)
#   make fuzz       libFuzzer targets in tests/fuzz/ (clang, ASan + UBSan) into build-fuzz/
#   make fuzz-run   run each of them FUZZ_SECONDS (default 30) on its corpus, as CI does
#   make arm64      cross-build for AArch64 into build-arm64/ and run the ARM kernel and
#                   stories260K golden tests under qemu (scripts/arm64-test.sh); the build
#                   alone is make CC=aarch64-linux-gnu-gcc BUILD=build-arm64 all
#   make format     clang-format the tree
#   make clean

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -g $(WARN) -Iinclude -Isrc -MMD -MP
LDLIBS  += -lpcre2-8 -lzstd -lcrypto -lm -lpthread
TEST_LDLIBS := -lcjson
# the CLI alone: JSON lines and line editing for `sparrow chat`
CLI_LDLIBS := -lcjson -ledit

ARCH := $(shell $(CC) -dumpmachine)
ifneq (,$(findstring x86_64,$(ARCH)))
ISA_DIR := x86
else ifneq (,$(findstring aarch64,$(ARCH)))
ISA_DIR := arm
else
ISA_DIR := none
endif

# Every src/*.c and src/<module>/*.c (a new module folder needs no edit here);
# ISA folders (src/quant/x86, src/quant/arm) only for the target's ISA.
LIB_SRC := $(wildcard src/*.c src/*/*.c) $(wildcard src/quant/$(ISA_DIR)/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
LIB     := $(BUILD)/libsparrow.a
CLI     := $(BUILD)/sparrow
# tools/common: what the CLI (and the server) share; tools/cli: main.c + one cmd_<name>.c per command
TOOLS_COMMON_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/common/*.c))
CLI_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/cli/*.c)) $(TOOLS_COMMON_OBJ)
# tools/server: sparrow-server, which `sparrow serve` runs (libmicrohttpd, cJSON:
# linked into it alone, so the other commands do not load them)
SERVER := $(BUILD)/sparrow-server
SERVER_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/server/*.c)) $(TOOLS_COMMON_OBJ)
SERVER_LDLIBS := -lmicrohttpd -lcjson
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

# Per-ISA flags: each kernel file is compiled for its own instruction set and
# only called after CPU detection says it may be.
$(BUILD)/src/quant/x86/avx2.o:   CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/src/quant/x86/avx512.o: CFLAGS += -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512bf16 -mfma -mf16c
$(BUILD)/src/quant/x86/amx.o: CFLAGS += -mamx-tile -mamx-int8 -mamx-bf16 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c
$(BUILD)/src/quant/x86/amx_emu.o: CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/src/quant/arm/dotprod.o: CFLAGS += -march=armv8.2-a+dotprod
# Debian's aarch64 gcc 12 crashes (internal compiler error in
# vect_transform_reduction) vectorizing the fmax reductions the tests use to
# compare results; the tests do not need vectorizing.
ifeq ($(ISA_DIR),arm)
$(BUILD)/tests/%.o: CFLAGS += -fno-tree-vectorize
endif

# keep the test objects (else make deletes them as intermediates and rebuilds them every run)
.SECONDARY:

.PHONY: all test asan format clean bench fuzz fuzz-run deps arm64
all: $(LIB) $(CLI) $(SERVER) $(TEST_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(CLI): $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS) $(CLI_LDLIBS)

$(SERVER): $(SERVER_OBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS) $(SERVER_LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS) $(TEST_LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

bench: $(BENCH_BIN)

deps:
	sh scripts/install-deps.sh

test: all
	BUILD=$(BUILD) sh tests/run.sh

asan:
	SPARROW_SANITIZED=1 $(MAKE) BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all" \
	    LDFLAGS="-fsanitize=address,undefined" test

# Fuzz targets: the library rebuilt with clang and sanitizers in build-fuzz/,
# each tests/fuzz/*.c linked with -fsanitize=fuzzer.  fuzz-run runs every one
# of them (a new target needs no edit here) for FUZZ_SECONDS on its seeds,
# tests/fuzz/corpus/<target>/ when there is one (tests/fuzz/make-corpus.py),
# with the dictionary tests/fuzz/<target>.dict when there is one,
# keeping what it finds in build-fuzz/corpus-<target>/; a crash, leak or
# sanitizer report stops it with the input in build-fuzz/ (crash-*, leak-*).
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_SRC := $(wildcard tests/fuzz/*.c)
FUZZ_SECONDS ?= 30
# The ISA kernel files first, plain -O0: no fuzz target reaches them, and
# instrumented their intrinsics take clang minutes each to compile.
FUZZ_ISA_OBJ := $(patsubst %.c,build-fuzz/%.o,$(wildcard src/quant/$(ISA_DIR)/*.c))
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang OPT="-O0" $(FUZZ_ISA_OBJ)
	$(MAKE) BUILD=build-fuzz CC=clang OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $(FUZZ_SAN)" build-fuzz/libsparrow.a
	for f in $(FUZZ_SRC); do \
	    clang -std=c11 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer $(FUZZ_SAN) $(WARN) -Iinclude -Isrc \
	        $$f build-fuzz/libsparrow.a $(LDLIBS) -o build-fuzz/$$(basename $$f .c) || exit 1; \
	done

fuzz-run: fuzz
	@for f in $(FUZZ_SRC); do \
	    t=$$(basename $$f .c); mkdir -p build-fuzz/corpus-$$t; \
	    seeds=; [ -d tests/fuzz/corpus/$$t ] && seeds=tests/fuzz/corpus/$$t; \
	    dict=; [ -f tests/fuzz/$$t.dict ] && dict=-dict=tests/fuzz/$$t.dict; \
	    printf 'fuzz: %s for %s s ... ' $$t $(FUZZ_SECONDS); \
	    if build-fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $$dict -artifact_prefix=build-fuzz/ \
	        build-fuzz/corpus-$$t $$seeds >build-fuzz/$$t.log 2>&1; then \
	        grep -h 'stat::number_of_executed_units\|stat::new_units_added' build-fuzz/$$t.log | tr '\n' ' '; echo; \
	    else echo FAILED; tail -n 60 build-fuzz/$$t.log; exit 1; fi; \
	done

arm64:
	sh scripts/arm64-test.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-fuzz build-arm64

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(SERVER_OBJ:.o=.d) $(TEST_BIN:%=%.d) $(BENCH_BIN:%=%.d)

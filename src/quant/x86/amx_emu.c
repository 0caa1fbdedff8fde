/*
 * amx_emu.c -- amx.c compiled with its tile instructions emulated in plain C
 * (SP_AMX_EMU), for tests: tests/test_amx.c checks the packing, scaling and
 * tail handling of the AMX kernels through it on any AVX2 machine.  Never
 * installed in the dispatch table.  Hook: sp_quant_amx_emu_kernel (amx.h).
 */
#define SP_AMX_EMU 1
#include "amx.c"

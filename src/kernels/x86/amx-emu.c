/* The amx variant with its tile operations in plain C (amx-tile.h): the
 * same kernel source as amx.c, compiled without the AMX flags. The
 * -DNM_AMX_EMULATE=ON build runs `amx` through it, and the kernel tests
 * compare it with avx512vnni and, where the CPU has AMX, with amx.c. */
#define NM_AMX_EMU 1
#include "amx.c"

/* The blocked attention of attention.c with 16-lane vectors (AVX-512):
 * the same source and the same bits as the 8-lane build, twice the FMAs per
 * instruction (nm_attention_blocked16_forward). */
#define NM_ATTN_LANES 16
#include "attention.c"

/* The body of nm_gguf, shared by the reader (gguf_read.c) and the lookups
 * (gguf_get.c). Nothing outside src/gguf/ includes this. */
#ifndef NM_GGUF_IMPL_H
#define NM_GGUF_IMPL_H

#include "gguf.h"

/* Deepest nesting of arrays inside arrays the reader accepts (and the writer
 * produces); real files use none, so this only bounds hostile recursion. */
#define NM_GGUF_MAX_DEPTH 8

/* Bytes of one packed element of a numeric or bool type; 0 for STRING and
 * ARRAY, whose elements have variable size. */
size_t nm_gguf_scalar_bytes(nm_gguf_type type);

/* One reader-owned table (nm_gguf_str[] or nm_gguf_value[]); all of them are
 * freed together at close. */
typedef union nm_gguf_block {
    union nm_gguf_block *next;
    max_align_t align; /* the payload after the header is suitably aligned */
} nm_gguf_block;

struct nm_gguf {
    const uint8_t *base; /* [file_bytes], the mapping or the caller's memory */
    uint64_t file_bytes;
    bool mapped; /* close unmaps base */
    uint32_t version;
    uint64_t alignment;  /* general.alignment, else 32 */
    uint64_t data_start; /* file offset of the data section (aligned) */

    uint64_t n_kv;
    nm_gguf_kv *kvs;              /* [n_kv] in file order */
    const nm_gguf_kv **kv_sorted; /* [n_kv] by key bytes, for lookups */

    uint64_t n_tensors;
    nm_gguf_tensor *tensors;              /* [n_tensors] in file order */
    const nm_gguf_tensor **tensor_sorted; /* [n_tensors] by name */

    nm_gguf_block *blocks; /* reader-owned element tables, a list */
};

/* Orders strings by bytes, then by length (memcmp order of the shorter, the
 * prefix first). */
int nm_gguf_str_cmp(nm_gguf_str a, nm_gguf_str b);

#endif /* NM_GGUF_IMPL_H */

/* GGUF files (v2 and v3), the format llama.cpp writes models in: a validating
 * reader over a read-only mmap (or a caller's memory), and a writer for tools
 * and tests. The reader never trusts the file: every count, length, type,
 * offset and size is checked before use, and failures name the key or tensor.
 * Not here: what the keys mean (model/) or how types compute (tensor/). */
#ifndef NM_GGUF_H
#define NM_GGUF_H

#include "npumoe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Metadata value types, numbered as in the GGUF specification. */
typedef enum nm_gguf_type {
    NM_GGUF_UINT8 = 0,
    NM_GGUF_INT8 = 1,
    NM_GGUF_UINT16 = 2,
    NM_GGUF_INT16 = 3,
    NM_GGUF_UINT32 = 4,
    NM_GGUF_INT32 = 5,
    NM_GGUF_FLOAT32 = 6,
    NM_GGUF_BOOL = 7,
    NM_GGUF_STRING = 8,
    NM_GGUF_ARRAY = 9,
    NM_GGUF_UINT64 = 10,
    NM_GGUF_INT64 = 11,
    NM_GGUF_FLOAT64 = 12,
    NM_GGUF_TYPE_COUNT
} nm_gguf_type;

const char *nm_gguf_type_name(nm_gguf_type type);

/* A string inside the file: not NUL-terminated, may hold any bytes. */
typedef struct nm_gguf_str {
    const char *ptr;
    uint64_t len;
} nm_gguf_str;

/* A decoded metadata value. Arrays keep their elements where they are:
 * - numeric/bool elements: arr.data points at n packed little-endian
 *   elements in the file (read them with nm_gguf_arr_*);
 * - string elements: arr.data is an nm_gguf_str[n] owned by the reader;
 * - array elements (nested): arr.data is an nm_gguf_value[n] owned by the
 *   reader. */
typedef struct nm_gguf_value {
    nm_gguf_type type;
    union {
        uint64_t u64; /* UINT8/16/32/64 */
        int64_t i64;  /* INT8/16/32/64  */
        double f64;   /* FLOAT32/64     */
        bool b;       /* BOOL           */
        nm_gguf_str str;
        struct {
            nm_gguf_type type; /* element type */
            uint64_t n;
            const void *data;
        } arr;
    } v;
} nm_gguf_value;

typedef struct nm_gguf_kv {
    nm_gguf_str key;
    nm_gguf_value value;
} nm_gguf_kv;

typedef struct nm_gguf_tensor {
    nm_gguf_str name;
    uint32_t type;    /* ggml type id (tensor/tensor.h nm_dtype) */
    uint32_t n_dims;  /* 1..4 */
    int64_t ne[4];    /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint64_t offset;  /* from the start of the data section */
    uint64_t n_bytes; /* exact size from type and dims */
    const void *data; /* into the mapping */
} nm_gguf_tensor;

typedef struct nm_gguf nm_gguf;

/* Maps and validates a file. On failure *out is NULL and err names the file
 * and the problem. */
nm_status nm_gguf_open(const char *path, nm_gguf **out, nm_error *err);

/* Same over memory the caller keeps alive until nm_gguf_close (fuzzing,
 * tests). */
nm_status nm_gguf_open_memory(const void *data, size_t n_bytes, nm_gguf **out, nm_error *err);

void nm_gguf_close(nm_gguf *gguf);
/* The caller will not read the mapped file's bytes [p, p + n) for a while:
 * the whole pages among them leave the process's resident memory (they
 * are read from the file again if touched). Nothing for a file over the
 * caller's memory or a range outside the file. */
void nm_gguf_drop_pages(const nm_gguf *gguf, const void *p, size_t n);

uint32_t nm_gguf_version(const nm_gguf *gguf);
uint64_t nm_gguf_alignment(const nm_gguf *gguf);
uint64_t nm_gguf_file_bytes(const nm_gguf *gguf);

uint64_t nm_gguf_n_kv(const nm_gguf *gguf);
const nm_gguf_kv *nm_gguf_kv_at(const nm_gguf *gguf, uint64_t i);
/* NULL when the key is absent. */
const nm_gguf_value *nm_gguf_find(const nm_gguf *gguf, const char *key);

/* Typed getters. Each returns NM_ERR_NOT_FOUND when the key is absent (the
 * message names it), NM_ERR_FORMAT when it has a type that cannot represent
 * the request or a value out of range (integers of any width convert when
 * the value fits; floats accept FLOAT32/FLOAT64). */
nm_status nm_gguf_get_u32(const nm_gguf *gguf, const char *key, uint32_t *out, nm_error *err);
nm_status nm_gguf_get_i32(const nm_gguf *gguf, const char *key, int32_t *out, nm_error *err);
nm_status nm_gguf_get_u64(const nm_gguf *gguf, const char *key, uint64_t *out, nm_error *err);
nm_status nm_gguf_get_f32(const nm_gguf *gguf, const char *key, float *out, nm_error *err);
nm_status nm_gguf_get_bool(const nm_gguf *gguf, const char *key, bool *out, nm_error *err);
nm_status nm_gguf_get_str(const nm_gguf *gguf, const char *key, nm_gguf_str *out, nm_error *err);
/* An array whose elements have type elem (NM_GGUF_TYPE_COUNT = any). */
nm_status nm_gguf_get_arr(const nm_gguf *gguf, const char *key, nm_gguf_type elem,
                          const nm_gguf_value **out, nm_error *err);

/* Element i of a numeric or bool array, converted. The caller ensures
 * i < arr.n and the element type is numeric (programmer error otherwise). */
int64_t nm_gguf_arr_i64(const nm_gguf_value *arr, uint64_t i);
double nm_gguf_arr_f64(const nm_gguf_value *arr, uint64_t i);
/* Element i of a string array. */
nm_gguf_str nm_gguf_arr_str(const nm_gguf_value *arr, uint64_t i);

/* true when s equals the NUL-terminated c string. */
bool nm_gguf_str_eq(nm_gguf_str s, const char *c);

uint64_t nm_gguf_n_tensors(const nm_gguf *gguf);
const nm_gguf_tensor *nm_gguf_tensor_at(const nm_gguf *gguf, uint64_t i);
/* NULL when absent. */
const nm_gguf_tensor *nm_gguf_find_tensor(const nm_gguf *gguf, const char *name);

/* ---- writer ---------------------------------------------------------------- */

/* Builds a GGUF v3 file. Keys and tensors are written in the order added;
 * tensor data is copied at add time, or given by a source as the file is
 * streamed. */
typedef struct nm_gguf_writer nm_gguf_writer;

nm_gguf_writer *nm_gguf_writer_new(void); /* NULL on out-of-memory */
void nm_gguf_writer_free(nm_gguf_writer *w);

/* Each add returns NM_ERR_NOMEM on allocation failure, NM_ERR_INVALID_ARG for
 * a duplicate key or tensor name. */
nm_status nm_gguf_writer_set_u32(nm_gguf_writer *w, const char *key, uint32_t v);
nm_status nm_gguf_writer_set_i32(nm_gguf_writer *w, const char *key, int32_t v);
nm_status nm_gguf_writer_set_u64(nm_gguf_writer *w, const char *key, uint64_t v);
nm_status nm_gguf_writer_set_f32(nm_gguf_writer *w, const char *key, float v);
nm_status nm_gguf_writer_set_bool(nm_gguf_writer *w, const char *key, bool v);
nm_status nm_gguf_writer_set_str(nm_gguf_writer *w, const char *key, const char *v);
/* A numeric/bool array: n elements of type elem packed in data (host
 * little-endian). */
nm_status nm_gguf_writer_set_arr(nm_gguf_writer *w, const char *key, nm_gguf_type elem,
                                 const void *data, uint64_t n);
nm_status nm_gguf_writer_set_arr_str(nm_gguf_writer *w, const char *key, const char *const *strs,
                                     uint64_t n);
/* Any value, laid out as the reader returns it (so a kv read from one file
 * copies into another): every scalar width, strings holding any bytes,
 * arrays of strings (arr.data an nm_gguf_str[n]) and arrays of arrays
 * (arr.data an nm_gguf_value[n] of ARRAY values), nested at most 8 deep.
 * NM_ERR_INVALID_ARG for a value the reader would refuse (unknown type,
 * integer out of its type's range, bool element not 0/1, too deep). */
nm_status nm_gguf_writer_set_value(nm_gguf_writer *w, const char *key, const nm_gguf_value *value);

/* dims as ggml orders them: ne[0] contiguous. n_bytes must equal the size
 * implied by type and dims. */
nm_status nm_gguf_writer_add_tensor(nm_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    uint64_t n_bytes);

/* A tensor (checks as above) whose data is not given now: the source of
 * nm_gguf_writer_stream_file gives it when the file gets there, so a file
 * larger than memory can be written. */
nm_status nm_gguf_writer_add_tensor_info(nm_gguf_writer *w, const char *name, uint32_t type,
                                         uint32_t n_dims, const int64_t *ne);

/* The file's bytes (alignment 32 unless general.alignment was set); the
 * caller frees *out with nm_free. NM_ERR_INVALID_ARG when a tensor was
 * added without data. */
nm_status nm_gguf_writer_to_memory(const nm_gguf_writer *w, uint8_t **out, size_t *n_bytes,
                                   nm_error *err);

/* Gives tensor i's bytes (as many as its type and shape make), which must
 * stay valid until the next call; a status other than NM_OK (with err set)
 * stops the writing. */
typedef nm_status (*nm_gguf_tensor_source)(void *ctx, size_t i, const void **data, nm_error *err);

/* Writes the file to the stream f as it goes: the header, then each tensor,
 * its copy or, for a tensor added without data, what source gives (called in
 * tensor order), and flushes f. Holds no more than the header in memory.
 * name is for messages; *n_bytes (if not NULL) gets the file's size. */
nm_status nm_gguf_writer_stream(const nm_gguf_writer *w, FILE *f, const char *name,
                                nm_gguf_tensor_source source, void *ctx, uint64_t *n_bytes,
                                nm_error *err);
/* nm_gguf_writer_stream to path by the rules of nm_outfile (base.h): a
 * regular file is replaced atomically, a symbolic link followed, a
 * character device or FIFO written directly. On failure nothing but a
 * device or FIFO has been written. */
nm_status nm_gguf_writer_stream_file(const nm_gguf_writer *w, const char *path,
                                     nm_gguf_tensor_source source, void *ctx, nm_error *err);
/* nm_gguf_writer_stream_file without a source. */
nm_status nm_gguf_writer_write_file(const nm_gguf_writer *w, const char *path, nm_error *err);

#endif /* NM_GGUF_H */

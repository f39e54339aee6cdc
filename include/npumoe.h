/* npumoe public C API: load a Mixture-of-Experts GGUF model, open sessions,
 * tokenize, prefill, decode and sample. Opaque handles, *_default_params(),
 * init/free pairs; every fallible call returns an nm_status (table below) and,
 * when given an nm_error, a one-line message saying what was wrong and where. */
#ifndef NPUMOE_H
#define NPUMOE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* The library's version, written here and nowhere else: CMake's
 * project(VERSION) reads these lines (and checks the string against them). */
#define NPUMOE_VERSION_MAJOR 0
#define NPUMOE_VERSION_MINOR 1
#define NPUMOE_VERSION_PATCH 0
#define NPUMOE_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes. NM_OK is 0; every other value is a failure whose text is
 * nm_status_str(). */
typedef enum nm_status {
    NM_OK = 0,
    NM_ERR_INVALID_ARG, /* a caller-supplied value is out of its domain      */
    NM_ERR_IO,          /* a file could not be opened, read, mapped, written */
    NM_ERR_FORMAT,      /* a file or text is malformed or lies about itself  */
    NM_ERR_UNSUPPORTED, /* well-formed but not supported (type, arch, ...)   */
    NM_ERR_NOT_FOUND,   /* a required key, tensor or token is absent         */
    NM_ERR_NOMEM,       /* an allocation failed                              */
    NM_ERR_CAPACITY,    /* a fixed size (context, buffer) would be exceeded  */
    NM_STATUS_COUNT
} nm_status;

/* Static text for a status ("ok", "invalid argument", ...). */
const char *nm_status_str(nm_status status);

/* The version of the library linked in, NPUMOE_VERSION_STRING when it was
 * built ("0.1.0"); compare with the macro to catch a header of another
 * version. */
const char *nm_version(void);

/* Where a failing call explains itself. msg is always NUL-terminated. */
typedef struct nm_error {
    nm_status status;
    char msg[512];
} nm_error;

/* ---- model ---------------------------------------------------------------- */

typedef struct nm_model nm_model;

/* Whose semantics a model runs with. NM_COMPAT_NONE: the model as trained
 * (its reference implementation). NM_COMPAT_LLAMA_CPP: llama.cpp's graph
 * where it departs from that (phimoe: RMSNorm plus bias and softmax top-k
 * routing instead of LayerNorm and sparsemixer) and its numerics
 * (activations rounded to F16 before F16 matmuls). */
typedef enum nm_compat { NM_COMPAT_NONE, NM_COMPAT_LLAMA_CPP } nm_compat;

/* "none" or "llama.cpp"; anything else is NM_ERR_INVALID_ARG. */
nm_status nm_compat_parse(const char *name, nm_compat *out, nm_error *err);

typedef struct nm_model_params {
    bool verbose;     /* reserved for load progress; false = quiet */
    nm_compat compat; /* NM_COMPAT_NONE by default */
    /* false (default): weights whose kernels run faster from a layout of
     * their own (Q4_0 and K-quants under avx512vnni) are copied into it at
     * load, and the file's pages of them released; true: every weight is
     * read from the file's mapping as it is (no copy, no load-time pass
     * over the file) */
    bool no_repack;
    /* true: only the vocabulary and the file's metadata are read, no
     * weights (as llama.cpp's vocab_only): enough to tokenize and describe,
     * and the only way to open a file without tensors, which a full load
     * refuses; sessions cannot be made on such a model */
    bool vocab_only;
} nm_model_params;

nm_model_params nm_model_default_params(void);

/* Maps the GGUF file read-only and validates it completely. */
nm_status nm_model_load(const char *path, const nm_model_params *params, nm_model **out,
                        nm_error *err);
void nm_model_free(nm_model *model);

/* A few facts a caller needs; the rest is printed by nm_model_describe(). */
typedef struct nm_model_info {
    const char *arch; /* "qwen3moe", ...                 */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t bos_id; /* -1 when the file has none */
    int32_t eos_id; /* -1 when the file has none */
    bool add_bos;
    uint64_t weight_bytes;   /* bytes of all tensors in the file */
    uint64_t repacked_bytes; /* of them, copied at load into the kernels' layout */
    bool vocab_only;         /* loaded with nm_model_params.vocab_only */
} nm_model_info;

void nm_model_get_info(const nm_model *model, nm_model_info *out);

/* Writes a human-readable description (hyperparameters, tensor types and
 * sizes) to the stream, which is a FILE*. */
void nm_model_describe(const nm_model *model, void *file);

/* ---- tokenizer --------------------------------------------------------------- */

/* Encodes UTF-8 text (n_bytes, not NUL-terminated). With parse_special,
 * special-token text such as <|im_start|> becomes its id. BOS is added when
 * add_bos is true and the vocabulary has one. On NM_ERR_CAPACITY *n_out holds
 * the number of ids needed. Text that is not valid UTF-8 is NM_ERR_FORMAT. */
nm_status nm_tokenize(const nm_model *model, const char *text, size_t n_bytes, bool add_bos,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_out, nm_error *err);

/* The bytes of one token (control tokens render as empty unless
 * render_special). Returns the byte count, which may exceed cap (then
 * nothing beyond cap was written), or -1 for an id out of range. */
int32_t nm_token_to_piece(const nm_model *model, int32_t id, bool render_special, char *buf,
                          size_t cap);

/* Whether a token ends generation (end of sequence/turn/text). */
bool nm_token_is_eog(const nm_model *model, int32_t id);

/* ---- session: KV cache, prefill, decode -------------------------------------- */

typedef struct nm_session nm_session;

/* How the MoE blocks of a prefill run (docs/NPUMOE.md). Decode always runs
 * on the host (dense). */
typedef enum nm_mode {
    NM_MODE_DENSE = 0, /* host only, exact grouped GEMM: the reference        */
    NM_MODE_NAIVE,     /* one device graph per active expert at capacity T   */
    NM_MODE_TIERS,     /* the plan's tier capacities, one graph per expert   */
    NM_MODE_GROUPED,   /* tiers + the plan's grouped graphs, all on device   */
    NM_MODE_NPUMOE,    /* tiers + groups + the plan's residency              */
    NM_MODE_COUNT
} nm_mode;

/* What happens to assignments beyond an expert's capacity. */
typedef enum nm_overflow {
    NM_OVERFLOW_DROP = 0, /* discarded, lowest salience first (the paper) */
    NM_OVERFLOW_SPILL,    /* computed exactly on the host                 */
    NM_OVERFLOW_COUNT
} nm_overflow;

/* Which assignments keep their slots when an expert overflows. */
typedef enum nm_salience {
    NM_SALIENCE_ROUTER = 0, /* the assignment's router weight                  */
    NM_SALIENCE_RESIDUAL,   /* L2 norm of the residual stream before the FFN norm */
    NM_SALIENCE_INPUT,      /* L2 norm of the expert input (after the FFN norm) */
    NM_SALIENCE_COUNT
} nm_salience;

const char *nm_mode_name(nm_mode mode);
const char *nm_overflow_name(nm_overflow overflow);
const char *nm_salience_name(nm_salience salience);
/* Parse a name; NM_ERR_INVALID_ARG listing the choices otherwise. */
nm_status nm_mode_parse(const char *name, nm_mode *out, nm_error *err);
nm_status nm_overflow_parse(const char *name, nm_overflow *out, nm_error *err);
nm_status nm_salience_parse(const char *name, nm_salience *out, nm_error *err);

/* A static plan (tiers, groups, residency) made by `npumoe plan`. */
typedef struct nm_plan nm_plan;
/* A static-graph device ("cpu", ...). */
typedef struct nm_device nm_device;

/* Element type of the KV cache. */
typedef enum nm_kv_type {
    NM_KV_F32 = 0, /* exact: what llama.cpp's goldens use */
    NM_KV_F16 = 1  /* half the memory; keys and values rounded to IEEE half */
} nm_kv_type;

typedef struct nm_session_params {
    int32_t n_ctx;       /* KV-cache positions; 0 = min(model's trained, 4096) */
    int32_t n_batch;     /* max tokens per prefill step; 0 = 512; in static
                            modes the chunk T, taken from the plan when 0      */
    int32_t n_threads;   /* compute threads; 0 = one per online CPU           */
    nm_mode mode;        /* NM_MODE_DENSE by default                          */
    const nm_plan *plan; /* needed by tiers, grouped, npumoe; outlives the session;
                            made for the model and for device (else refused)  */
    nm_device *device;   /* needed by every mode but dense; outlives the session */
    nm_kv_type kv_type;  /* NM_KV_F32 by default                              */
} nm_session_params;

nm_session_params nm_session_default_params(void);

nm_status nm_session_new(const nm_model *model, const nm_session_params *params, nm_session **out,
                         nm_error *err);
void nm_session_free(nm_session *session);

/* Forgets every cached position. */
void nm_session_reset(nm_session *session);

/* Number of positions in the KV cache. */
int32_t nm_session_n_past(const nm_session *session);

/* The session's context size (positions) and its model's vocabulary size. */
int32_t nm_session_n_ctx(const nm_session *session);
int32_t nm_session_n_vocab(const nm_session *session);

/* Appends n tokens to the cache, processing them in batches of n_batch
 * (each batch layer by layer). When logits is non-NULL it receives
 * [n][n_vocab] logits if all_logits, else [n_vocab] for the last token. */
nm_status nm_session_eval(nm_session *session, const int32_t *ids, int32_t n, float *logits,
                          bool all_logits, nm_error *err);

/* A per-layer tap, as ggml's eval callback: called during nm_session_eval
 * with each intermediate tensor of each batch as it is computed, the
 * batch's real tokens only (never a static chunk's padding rows). values:
 * [n_rows][n_cols], row-major, valid during the call only. layer is the
 * layer index, or -1 for the tensors after the last layer. name, in order
 * within a layer (llama.cpp's names):
 *   attn_norm       [n][n_embd]             attention's input norm
 *   Qcur            [n][n_head*head_dim]    queries after q norm and RoPE
 *   Kcur            [n][n_head_kv*head_dim] keys after k norm and RoPE
 *   Vcur            [n][n_head_kv*head_dim] values
 *   kqv_out         [n][n_head*head_dim]    attention, before the output projection
 *   ffn_inp         [n][n_embd]             residual stream after attention
 *   ffn_norm        [n][n_embd]             the MoE block's input norm
 *   ffn_moe_logits  [n][n_expert]           router logits
 *   ffn_moe_out     [n][n_embd]             the experts' weighted sum
 *   l_out           [n][n_embd]             residual stream after the layer
 * then, at layer -1 and only when the call asked for logits, for the rows
 * whose logits it returns:
 *   result_norm     [rows][n_embd]          final norm
 *   result_output   [rows][n_vocab]         logits
 * Return true to go on; false stops the evaluation: nm_session_eval returns
 * NM_ERR_INVALID_ARG with a message naming the layer and tensor, the
 * positions of the stopped batch are not kept (earlier batches of the same
 * call are), and the session stays usable. */
typedef bool (*nm_tap_fn)(void *ctx, int32_t layer, const char *name, const float *values,
                          int32_t n_rows, int64_t n_cols);

/* Sets the session's tap (fn NULL: none, the default; no cost then). */
void nm_session_set_tap(nm_session *session, nm_tap_fn fn, void *ctx);

/* ---- sampling ----------------------------------------------------------------- */

typedef struct nm_sampler nm_sampler;

typedef struct nm_sampler_params {
    float temperature;     /* 0 = greedy (argmax, ties to the lowest id) */
    int32_t top_k;         /* 0 = off                                    */
    float top_p;           /* 1 = off                                    */
    float min_p;           /* 0 = off                                    */
    float repeat_penalty;  /* 1 = off                                    */
    int32_t repeat_last_n; /* window for the penalty                     */
    uint64_t seed;
} nm_sampler_params;

nm_sampler_params nm_sampler_default_params(void);

nm_status nm_sampler_new(const nm_sampler_params *params, int32_t n_vocab, nm_sampler **out,
                         nm_error *err);
void nm_sampler_free(nm_sampler *sampler);

/* Records a token in the penalty window (prompt and generated tokens). */
void nm_sampler_accept(nm_sampler *sampler, int32_t id);

/* Picks a token from [n_vocab] logits (not modified). */
int32_t nm_sampler_sample(nm_sampler *sampler, const float *logits);

#ifdef __cplusplus
}
#endif

#endif /* NPUMOE_H */

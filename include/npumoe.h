/* npumoe public C API: load a Mixture-of-Experts GGUF model, open sessions,
 * tokenize, prefill, decode and sample. Opaque handles, *_default_params(),
 * init/free pairs; every fallible call returns an nm_status (table below) and,
 * when given an nm_error, a one-line message saying what was wrong and where. */
#ifndef NPUMOE_H
#define NPUMOE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

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

/* Conventions of every function below, unless its comment says otherwise.
 * Ownership: a handle made by nm_X_new/_load/_open/_make/_create is the
 * caller's and is released by its nm_X_free (or _close), which accepts
 * NULL; memory the library hands out otherwise (lists, texts) is released
 * with nm_free. Inputs are borrowed: the library keeps no pointer to them
 * past the call, except where a params struct says what must outlive what.
 * Errors: a function returning nm_status leaves its outputs NULL or zeroed
 * on failure and, when err is not NULL, fills it. Threads: different
 * handles may be used from different threads at once; one handle (a
 * session, a sampler, a device) from one thread at a time; a loaded model,
 * plan, calibration or profile is read-only and may be shared. */

/* Records status and a printf-style message in err (which may be NULL) and
 * returns status, so callers write `return nm_errorf(err, NM_ERR_X, ...)`:
 * for callers reporting their own failures as the library does. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
nm_status
nm_errorf(nm_error *err, nm_status status, const char *fmt, ...);

/* Releases memory the library handed out (NULL is a no-op). */
void nm_free(void *ptr);

/* Online CPUs (at least 1): what a thread count of 0 means. */
int nm_cpu_count(void);

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
    uint64_t repacked_bytes; /* of them, copied at load for the kernels (their layout,
                              * or the file's into anonymous memory) */
    bool vocab_only;         /* loaded with nm_model_params.vocab_only */
} nm_model_info;

void nm_model_get_info(const nm_model *model, nm_model_info *out);

/* Any key of the model's file as text, as llama.cpp's
 * llama_model_meta_val_str: a string as it is (up to an embedded NUL), an
 * integer in decimal, a float with 9 digits, a bool as true/false, an array
 * as "[N x TYPE]" with gguf's short type names ("[4096 x str]"). Writes at
 * most cap bytes including the NUL (buf may be NULL with cap 0) and returns
 * the length of the whole text, which may exceed cap - 1 (then it is cut),
 * or -1 when the key is absent. Thread-safe. */
int32_t nm_model_meta_str(const nm_model *model, const char *key, char *buf, size_t cap);

/* Writes a human-readable description (hyperparameters, tensor types and
 * sizes) to the stream, which is a FILE*. */
void nm_model_describe(const nm_model *model, void *file);

/* ---- tokenizer --------------------------------------------------------------- */

/* Encodes UTF-8 text (n_bytes, not NUL-terminated). add_special: add the
 * special tokens the model's tokenizer asks for (llama.cpp's add_special):
 * BOS in front when the vocabulary has one and the file says to add it
 * (tokenizer.ggml.add_bos_token, else the tokenizer's custom:
 * nm_model_info.add_bos); false adds nothing. With parse_special,
 * special-token text such as <|im_start|> becomes its id. On
 * NM_ERR_CAPACITY *n_out holds the number of ids needed (call with cap 0 to
 * ask). Text that is not valid UTF-8 is NM_ERR_FORMAT. Thread-safe. */
nm_status nm_tokenize(const nm_model *model, const char *text, size_t n_bytes, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_out, nm_error *err);

/* ---- chat templates ---------------------------------------------------------- */

/* One message of a conversation: role "system", "user" or "assistant". */
typedef struct nm_chat_message {
    const char *role;
    const char *content;
} nm_chat_message;

/* Renders a conversation as the model's chat template does (tmpl NULL: the
 * file's tokenizer.chat_template, recognised as one of the formats below) or
 * as a named format: "chatml" (alias "qwen3"), "phi3", "mistral", "deepseek2", "harmony"
 * (alias "gpt-oss"; llama.cpp's built-in rendering of it). A system
 * message may come first; then user and assistant messages, the assistant
 * ones being earlier answers. add_generation_prompt appends what opens the
 * assistant's answer. BOS is not part of the text (nm_tokenize adds it).
 * *out (NUL-terminated, *n_out bytes before the NUL) is the caller's, freed
 * with nm_free. NM_ERR_NOT_FOUND: the model has no template;
 * NM_ERR_UNSUPPORTED: its template is not a known format;
 * NM_ERR_INVALID_ARG: an unknown name, no messages, or an unknown role or a
 * system message after the first. model may be NULL with a named format.
 * Thread-safe. */
nm_status nm_chat_apply_template(const nm_model *model, const char *tmpl,
                                 const nm_chat_message *messages, size_t n_messages,
                                 bool add_generation_prompt, char **out, size_t *n_out,
                                 nm_error *err);

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

/* A static plan (tiers, groups, residency): nm_plan_create or nm_plan_open. */
typedef struct nm_plan nm_plan;
/* A static-graph device ("cpu", "vulkan:0"): nm_device_open. */
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
 * [n][n_vocab] logits if all_logits, else [n_vocab] for the last token.
 * NM_ERR_CAPACITY when the cache cannot hold n more positions (nothing is
 * evaluated then). */
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
 * (a model with a shared expert adds ffn_shexp_out [n][n_embd] before
 * l_out; deepseek2: Kcur and Vcur are kv_compressed [n][kv_lora_rank +
 * rope dims], the normed latent and the RoPE key as cached, kqv_out is
 * [n][n_head*value_length], and a leading dense layer has ffn_out
 * [n][n_embd] instead of ffn_moe_logits and ffn_moe_out)
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
/* Bytes the session allocated (KV cache and work buffers). */
size_t nm_session_bytes(const nm_session *session);

/* ---- several sessions decoding at once (continuous batching) ------------------ */

typedef struct nm_batch nm_batch;

/* Work buffers and threads to decode one token for each of up to
 * max_sessions sessions of model in one pass, at positions below n_ctx.
 * n_threads 0: every CPU. */
nm_status nm_batch_new(const nm_model *model, int32_t max_sessions, int32_t n_ctx, int n_threads,
                       nm_batch **out, nm_error *err);
void nm_batch_free(nm_batch *batch);

/* Appends ids[i] to sessions[i] for i < n (1..max_sessions distinct sessions
 * of the batch's model, each with a free position below its own context and
 * the batch's, all of one RoPE choice: contexts on one side of the model's
 * original one) and writes logits [n][n_vocab]. Every weight's matrix
 * product runs once over the n rows (attention projections, router,
 * experts, head); attention runs per session over its own cache. The
 * logits are those of nm_session_eval of each token alone up to the
 * kernels' rounding, which may differ with the number of rows (equal with
 * NPUMOE_KERNELS=ref). The MoE blocks run on the host (as every decode
 * step); taps and metrics are not called nor counted. Nothing is
 * evaluated when an argument is refused (NM_ERR_INVALID_ARG,
 * NM_ERR_CAPACITY). */
nm_status nm_batch_decode(nm_batch *batch, nm_session *const *sessions, const int32_t *ids,
                          int32_t n, float *logits, nm_error *err);

/* Peak resident memory of the process, in bytes (0 if unknown). */
uint64_t nm_peak_rss_bytes(void);

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

/* Index of the largest of x[0..n), ties to the lowest index (greedy). */
int32_t nm_argmax(const float *x, int32_t n);

/* ---- devices ------------------------------------------------------------------ */

/* What nm_device_open opens. */
typedef struct nm_device_params {
    /* "cpu" (the host kernels on worker threads of the device's own),
     * "vulkan" (the first Vulkan device) or "vulkan:N" (npumoe devices) */
    const char *name;
    int32_t n_threads;            /* cpu: worker threads, >= 1 (default 1)   */
    uint64_t memory_budget_bytes; /* vulkan: most device memory the graphs may
                                     hold; 0 (default) = its largest heap;
                                     a graph beyond it is NM_ERR_CAPACITY */
} nm_device_params;

nm_device_params nm_device_default_params(void); /* "cpu", 1 thread */

/* Opens a device. NM_ERR_INVALID_ARG: no name, a bad index or thread count;
 * NM_ERR_UNSUPPORTED: an unknown name or a build without Vulkan;
 * NM_ERR_NOT_FOUND: no such Vulkan device or no driver. Never another
 * device instead. The device is the caller's (nm_device_close); a session
 * using it must be freed first. */
nm_status nm_device_open(const nm_device_params *params, nm_device **out, nm_error *err);
void nm_device_close(nm_device *device);

/* One device this machine can open. */
typedef struct nm_device_info {
    char name[32];         /* what nm_device_params.name takes: "cpu", "vulkan:0" */
    char description[256]; /* the hardware ("llvmpipe (LLVM 15.0.6, 256 bits)") */
    char driver[256];      /* driver name and version; "" for cpu          */
    uint64_t memory_bytes; /* largest device-local heap; host memory for cpu */
    bool float16;          /* shaders can compute in float16               */
    bool int8;             /* shaders can compute in int8                  */
    /* rows its graphs compute at once (a capacity is best a multiple of it;
     * the planner's default granule): cpu 16 under the amx kernels, else 1 */
    int32_t row_granule;
} nm_device_info;

/* Lists every device that can be opened: cpu first, then each Vulkan
 * device. *out (nm_free it) has *n entries. Vulkan that cannot be used (not
 * in this build, no loader, no driver) is not an error: its reason is
 * written to why_no_vulkan (which may be NULL), "" when it is usable.
 * Thread-safe. */
nm_status nm_device_list(nm_device_info **out, int *n, char *why_no_vulkan, size_t why_bytes,
                         nm_error *err);

/* Counters a device keeps about itself since it was opened. */
typedef struct nm_device_stats {
    uint64_t graphs_compiled;
    uint64_t dispatches;    /* submissions                       */
    int64_t busy_ns;        /* time spent executing graphs       */
    uint64_t rows_computed; /* capacity rows run, padding included */
    uint64_t device_bytes;  /* weight and buffer bytes the graphs hold */
    uint64_t upload_bytes;  /* bytes copied into device memory (weights at compile) */
    /* of the dispatches, dense-part graphs (a layer's attention and router) */
    uint64_t dense_dispatches;
    /* times the host waited for the device to finish (a fence, or the cpu
     * device's thread): each graph waited for, each copy of K/V or weights
     * through device memory */
    uint64_t syncs;
} nm_device_stats;

/* ---- metrics of the static path ---------------------------------------------- */

/* What the MoE blocks of one layer (or of all, summed) did in prompt batches. */
typedef struct nm_moe_layer_metrics {
    uint64_t chunks;
    uint64_t assignments;   /* (token, expert) pairs routed      */
    uint64_t dropped;       /* discarded by capacity             */
    double weight;          /* routing weight of all assignments */
    double dropped_weight;  /* routing weight of the dropped ones */
    uint64_t spilled;       /* overflow computed on the host     */
    uint64_t host_rows;     /* rows computed by the host (host experts, spills, dense) */
    uint64_t device_rows;   /* rows filled in device graphs      */
    uint64_t reserved_rows; /* capacity rows of the graphs dispatched */
    uint64_t dispatches;
    int64_t host_ns; /* host expert work                  */
    int64_t wait_ns; /* time the host waited for the device */
    int64_t moe_ns;  /* wall time of the whole MoE step after routing */
} nm_moe_layer_metrics;

typedef struct nm_session_metrics {
    nm_mode mode;    /* the mode prompt batches ran in */
    int32_t n_layer; /* the layers with experts (a leading dense layer has none) */
    const nm_moe_layer_metrics *layers; /* [n_layer], owned by the session, which
                                           updates them in place: valid until
                                           the session is freed */
    nm_moe_layer_metrics total;         /* summed over layers */
    nm_device_stats device;             /* zero without a device */
    /* [n_layer] what the device did inside each layer's step of prompt
     * batches (its dense part and its experts: dispatches, syncs, busy
     * time, rows, bytes uploaded), since creation or the last reset, owned
     * and updated by the session; NULL without a device. The counters that
     * grow over time only: graphs_compiled and device_bytes are 0 */
    const nm_device_stats *device_layers;
    nm_device_stats device_total; /* device_layers summed */
} nm_session_metrics;

/* MoE metrics of the prompt batches since creation or the last reset. */
void nm_session_get_metrics(nm_session *session, nm_session_metrics *out);
void nm_session_reset_metrics(nm_session *session);

/* ---- energy ------------------------------------------------------------------ */

#define NM_ENERGY_MAX_ZONES 16

/* The energy counters of the CPU packages at one moment: Linux's RAPL
 * zones (root/intel-rapl:N whose name starts with "package"; subzones and
 * a platform-wide "psys" zone are left out, since the packages hold their
 * energy). The packages' energy, the whole machine's sockets, not this
 * process's share. */
typedef struct nm_energy_sample {
    bool available;                       /* false: why says why (no powercap, no package zone,
                                             a counter that cannot be read, as energy_uj is
                                             root's only on recent kernels) */
    int32_t n_zones;                      /* package zones read */
    uint64_t uj[NM_ENERGY_MAX_ZONES];     /* each zone's energy_uj */
    uint64_t max_uj[NM_ENERGY_MAX_ZONES]; /* its max_energy_range_uj: where it wraps */
    char why[256];
} nm_energy_sample;

/* Reads the counters under root (NULL: /sys/class/powercap). Never fails:
 * a sample that cannot be taken is not available, with its reason. */
void nm_energy_read(const char *root, nm_energy_sample *out);
/* Joules between two samples of the same zones, a counter that wrapped
 * once counted from before to max_energy_range_uj and on from 0; -1 when
 * either sample is not available or they differ in zones. */
double nm_energy_joules(const nm_energy_sample *before, const nm_energy_sample *after);

/* ---- calibration: the per-chunk expert loads of a text ----------------------- */

typedef struct nm_calib nm_calib;

/* Called after each window with the tokens done of total and the chunks
 * recorded so far (per layer). */
typedef void (*nm_calib_progress_fn)(void *ctx, size_t done, size_t total, int64_t n_chunks);

typedef struct nm_calib_params {
    int32_t chunk; /* T, the prefill chunk the plan is made for; 0 = 256 */
    /* tokens per window (each from an empty cache), rounded down to a
     * multiple of chunk; 0 = min(the trained context, 2048): a model routes
     * positions it never saw differently */
    int32_t n_ctx;
    int32_t n_threads; /* 0 = one per online CPU */
    nm_kv_type kv_type;
    nm_calib_progress_fn progress; /* may be NULL */
    void *progress_ctx;
} nm_calib_params;

nm_calib_params nm_calib_default_params(void);

/* Runs the text's whole chunks (the rest is ignored) through a dense
 * session of the model window by window and records every layer's expert
 * loads per chunk. NM_ERR_INVALID_ARG: a window shorter than a chunk, or
 * fewer tokens than one chunk (the message says how many). The calibration
 * is the caller's (nm_calib_free). */
nm_status nm_calib_make(const nm_model *model, const int32_t *ids, size_t n_ids,
                        const nm_calib_params *params, nm_calib **out, nm_error *err);
void nm_calib_free(nm_calib *calib);

/* The file (JSON, docs/NPUMOE.md), written atomically; load validates every
 * field (NM_ERR_FORMAT naming the field) and refuses old versions. */
nm_status nm_calib_save(const nm_calib *calib, const char *path, nm_error *err);
nm_status nm_calib_load(const char *path, nm_calib **out, nm_error *err);

typedef struct nm_calib_info {
    int32_t chunk, k, n_layer, n_expert;
    int64_t n_chunks; /* chunks recorded (per layer) */
    int64_t n_tokens; /* tokens in those chunks (per layer) */
} nm_calib_info;

void nm_calib_get_info(const nm_calib *calib, nm_calib_info *out);
/* Mean assignments per chunk of one expert of one layer (0 when none). */
double nm_calib_mean(const nm_calib *calib, int32_t layer, int32_t expert);

/* ---- device profile: what graphs and the host cost --------------------------- */

/* One measured graph shape. */
typedef struct nm_profile_point {
    int32_t n_experts;
    int32_t capacity; /* rows per expert */
    double graph_ms;  /* median time of submit + wait */
} nm_profile_point;

/* What a device measured about itself, for the planner. Filled by
 * nm_profile_measure or nm_profile_load, released by nm_profile_free. */
typedef struct nm_profile {
    char device[32];
    int64_t d_model;
    int64_t d_ff;
    uint32_t weight_type;  /* ggml type the graphs were measured with */
    double dispatch_ms;    /* submit + wait of the smallest graph, minus its compute */
    double host_row_ms;    /* host wall time per expert row (gate, up, down) with the
                              whole host pool busy: one task's cost over the threads */
    double host_expert_ms; /* host fixed cost per active expert */
    /* What the host's MoE step of one layer costs per chunk beyond its
     * expert FFNs as fitted above (dispatch table, gathering and scattering
     * rows, combine, threads finishing unevenly, caches holding other
     * layers) over a chunk of `chunk` tokens; never below 0. */
    int32_t chunk;
    double host_overhead_ms;
    /* The dense part of the model's first layer (graph kind 2: norms,
     * projections, RoPE, attention, router logits) over one chunk of
     * `chunk` tokens at position 0, median of reps: one launch on the
     * device with the copies of its input and outputs, and the host doing
     * the same work on its pool; routing, the shared expert (on the
     * device when its graph computes it) and the residual add included on
     * both sides. 0 for
     * both: not measured (a device without dense graphs for the model's
     * form, or a profile file written before they were measured); the
     * planner then puts a layer's dense part where its experts' groups
     * are (on the device when one of its groups is). */
    double dense_device_ms;
    double dense_host_ms;
    /* the device's row granule (nm_device_info.row_granule) when measured;
     * 0 in a profile written before profiles recorded it */
    int32_t granule;
    int32_t n_points;
    nm_profile_point *points; /* [n_points], experts outer, capacity inner */
} nm_profile;

typedef struct nm_profile_params {
    int32_t chunk; /* 0 = 256 */
    /* graph shapes measured: expert counts (NULL = 1, 2, 4, ... up to the
     * model's experts) x rows per expert (NULL = 4, 8, ... up to chunk, and
     * chunk); at most 64 of each */
    const int32_t *grid_experts;
    int32_t n_grid_experts;
    const int32_t *grid_capacity;
    int32_t n_grid_capacity;
    int32_t reps;      /* timed runs per shape (median); 0 = 5 */
    int32_t n_threads; /* host threads of the host measurements; 0 = one per CPU */
    void (*progress)(void *ctx, int done, int total); /* may be NULL */
    void *progress_ctx;
} nm_profile_params;

nm_profile_params nm_profile_default_params(void);

/* Measures the host's MoE step of the model over a chunk, then every graph
 * shape of the grid on device with the model's first layer's experts. *out
 * is the caller's: nm_profile_free. The device is busy for the call. */
nm_status nm_profile_measure(const nm_model *model, nm_device *device,
                             const nm_profile_params *params, nm_profile *out, nm_error *err);
/* The file (JSON, docs/NPUMOE.md): written atomically; load checks it
 * completely (NM_ERR_FORMAT naming the field). */
nm_status nm_profile_save(const nm_profile *profile, const char *path, nm_error *err);
nm_status nm_profile_load(const char *path, nm_profile *out, nm_error *err);
void nm_profile_free(nm_profile *profile);

/* ---- plan: tiers, groups, residency ------------------------------------------ */

/* Where a plan puts the dense part of a layer (graph kind 2). */
typedef enum nm_dense_placement {
    /* the device when the profile measured its dense graph cheaper than
     * the host's; a profile without that measurement: where the layer's
     * expert groups are (on the device when one of them is) */
    NM_DENSE_BY_PROFILE = 0,
    NM_DENSE_ON_HOST,
    NM_DENSE_ON_DEVICE,
    NM_DENSE_PLACEMENT_COUNT
} nm_dense_placement;

/* "profile", "host", "device"; "unknown" out of range. */
const char *nm_dense_placement_name(nm_dense_placement placement);
/* The inverse of nm_dense_placement_name (NM_ERR_INVALID_ARG naming the
 * choices otherwise). */
nm_status nm_dense_placement_parse(const char *name, nm_dense_placement *out, nm_error *err);

/* How the planner chooses each expert's capacity. */
typedef enum nm_plan_objective {
    /* within a budget of rows per layer and chunk, the capacities (multiples
     * of a granule) that minimise the expected overflow per chunk: the
     * dropped routing weight with drop and router salience, the assignments
     * over capacity otherwise (docs/NPUMOE.md, "Budgeted tiers") */
    NM_PLAN_BUDGET,
    /* each expert: the smallest tier >= a quantile of its per-chunk load */
    NM_PLAN_QUANTILE,
    NM_PLAN_OBJECTIVE_COUNT
} nm_plan_objective;

const char *nm_plan_objective_name(nm_plan_objective objective);

typedef struct nm_plan_params {
    nm_plan_objective objective; /* default NM_PLAN_BUDGET */
    /* quantile: candidate capacities, strictly ascending in [1, chunk], at
     * most 32; NULL = the powers of two in [T/64, T) and T.
     * budget: must be NULL (the tiers are the multiples of granule) */
    const int32_t *tiers;
    int32_t n_tiers;
    double quantile; /* in (0, 1]: each expert gets the smallest tier >= this
                        quantile of its per-chunk load; default 0.95. The
                        budget objective's default budget is the rows
                        this rule reserves, layer by layer */
    /* budget: rows per layer and chunk (sum of the experts' capacities), at
     * least n_expert * granule, at most n_expert * chunk (a larger one is
     * taken as that); 0 = budget_ms, or else the quantile rule's */
    int64_t budget_rows;
    /* budget: > 0 = device time per layer and chunk, turned into rows by
     * the profile's per-row cost */
    double budget_ms;
    /* budget: capacities are multiples of it; a divisor of the chunk giving
     * at most 32 tiers; 0 = the profile's granule (the device's rows at
     * once: 16 for cpu under amx) or the smallest multiple of it dividing
     * the chunk in at most 32 tiers; when the profile has none or 1, or no
     * multiple divides the chunk, the smallest divisor >= chunk/16. The
     * quantile objective's default tiers are rounded up to the profile's
     * granule too */
    int32_t granule;
    nm_overflow overflow; /* default spill */
    nm_salience salience; /* default residual-norm */
    /* device bytes the resident groups may hold (the experts' weights and
     * the graphs' buffers), hottest (largest predicted saving) first;
     * UINT64_MAX = unlimited (the default), 0 = everything on the host */
    uint64_t device_memory_bytes;
    /* most experts in one graph; 0 = the largest expert count the profile
     * measured (shapes beyond the measurement are extrapolations, and real
     * devices have graph size limits the profile would have hit) */
    int32_t max_group_experts;
    /* where each layer's dense part (attention and router) runs in npumoe
     * mode: NM_DENSE_BY_PROFILE (default) weighs the profile's measured
     * costs, the others force every layer */
    nm_dense_placement dense;
} nm_plan_params;

nm_plan_params nm_plan_default_params(void);

/* Makes a plan from a calibration of this model (NM_ERR_INVALID_ARG
 * naming both fingerprints otherwise) and a profile of a device with the
 * model's d_model and d_ff. params NULL = defaults. How: docs/NPUMOE.md.
 * The plan is the caller's (nm_plan_free); it must outlive the sessions
 * that run it. */
nm_status nm_plan_create(const nm_model *model, const nm_calib *calib, const nm_profile *profile,
                         const nm_plan_params *params, nm_plan **out, nm_error *err);
/* Loads a plan file and checks it completely and against the model (another
 * model's plan is NM_ERR_INVALID_ARG naming both fingerprints); model NULL
 * checks everything but that. */
nm_status nm_plan_open(const char *path, const nm_model *model, nm_plan **out, nm_error *err);
nm_status nm_plan_save(const nm_plan *plan, const char *path, nm_error *err);
void nm_plan_free(nm_plan *plan);

typedef struct nm_plan_info {
    char device[32]; /* the device the profile measured ("cpu") */
    int32_t chunk;   /* T: sessions running the plan prefill in chunks of T */
    int32_t n_layer;
    nm_plan_objective objective;
    nm_overflow overflow;
    nm_salience salience;
    /* as the calibration predicts a new chunk, over all layers: the
     * fraction of assignments over capacity (dropped or spilled) and of
     * routing weight over capacity */
    double predicted_drop_rate;
    double predicted_drop_weight;
    double predicted_chunk_ms; /* MoE time of one chunk, all layers */
    uint64_t device_bytes;     /* device memory of the resident groups */
    /* layers whose dense part npumoe mode runs on the device (when the
     * device has their form); -1: a plan file made before the planner
     * chose this, where a layer's dense part follows its expert groups */
    int32_t dense_device_layers;
    /* the dense parts of one chunk, all layers, each where the plan puts
     * it, from the profile's measurement (0: not measured) */
    double predicted_dense_ms;
} nm_plan_info;

void nm_plan_get_info(const nm_plan *plan, nm_plan_info *out);
/* Writes a human-readable summary (tiers, groups per layer, residency,
 * predicted cost) to the stream. */
void nm_plan_describe(const nm_plan *plan, FILE *file);

/* ---- perplexity and comparison ----------------------------------------------- */

/* Negative log-likelihoods of scored tokens. */
typedef struct nm_nll_stats {
    double sum;    /* sum of -log p(target) */
    double sum_sq; /* sum of its squares    */
    uint64_t count;
} nm_nll_stats;

/* exp(mean nll). */
double nm_nll_stats_ppl(const nm_nll_stats *s);
/* llama.cpp's uncertainty of the perplexity: ppl * sqrt(var(nll) / (count - 1)). */
double nm_nll_stats_ppl_err(const nm_nll_stats *s);

/* Result of scoring a text with a reference and, optionally, a candidate. */
typedef struct nm_accuracy {
    int32_t n_ctx; /* window length */
    int32_t n_windows;
    nm_nll_stats ref;  /* reference perplexity */
    nm_nll_stats cand; /* candidate perplexity (count 0 without one) */
    double kl_sum;     /* KL(ref || cand) summed over scored positions */
    double kl_max;
    uint64_t top1_same; /* scored positions whose argmax agrees */
} nm_accuracy;

/* Called once before the first window (done = 0), then after each window
 * with the totals so far. */
typedef void (*nm_progress_fn)(void *ctx, int32_t done, int32_t total, const nm_accuracy *acc);

/* Perplexity as llama.cpp's llama-perplexity computes it: the tokens are cut
 * into n / n_ctx non-overlapping windows (the rest is ignored); when bos >= 0
 * the first token of each window is replaced by it; each window is evaluated
 * from an empty cache, and only its second half is scored: the logits at
 * positions n_ctx/2 .. n_ctx-2 predict the next token. With a candidate
 * session (else NULL), the same windows also run through it, and KL and
 * top-1 agreement are measured at the scored positions. Both sessions are
 * reset. Needs at least 2 * n_ctx tokens (NM_ERR_INVALID_ARG). */
nm_status nm_score_text(nm_session *ref, nm_session *cand, const int32_t *ids, size_t n,
                        int32_t n_ctx, int32_t bos, nm_progress_fn progress, void *progress_ctx,
                        nm_accuracy *out, nm_error *err);

/* ---- quantize ------------------------------------------------------------------ */

/* One finished tensor, for progress reports. */
typedef struct nm_quantize_progress {
    uint64_t index, n_tensors; /* index is 0-based */
    const char *name;          /* the tensor's name, name_len bytes (not NUL-terminated) */
    size_t name_len;
    uint32_t n_dims;
    int64_t ne[4];           /* shape, ne[0] the row length */
    const char *type_in;     /* ggml type names: "f32", "q4_K", ... */
    const char *type_out;    /* the type written */
    const char *type_wanted; /* the kind's type before the row-length fallback */
    uint32_t wanted_block;   /* elements per block of type_wanted */
    bool eligible;           /* false: kept as it is (1-D, norm, router, ...) */
    bool fell_back;          /* eligible, but its rows are no multiple of
                                wanted_block: type_out is another type */
    uint64_t in_bytes, out_bytes;
} nm_quantize_progress;

typedef struct nm_quantize_params {
    /* "q8_0" (default), "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m",
     * "q4_k_s", "q5_k_s", "f32", "f16", "bf16" (any case): single types give
     * every quantisable tensor that type; the mixes follow llama-quantize */
    const char *type;
    int32_t n_threads;                                          /* 0 = one per online CPU */
    void (*progress)(void *ctx, const nm_quantize_progress *p); /* may be NULL */
    void *progress_ctx;
} nm_quantize_params;

nm_quantize_params nm_quantize_default_params(void);

typedef struct nm_quantize_summary {
    const char *type;   /* the kind's canonical name */
    uint32_t file_type; /* general.file_type written (llama.cpp's LLAMA_FTYPE) */
    int32_t n_threads;  /* threads used */
    uint64_t n_tensors, n_converted, n_fallback;
    uint64_t n_elements;                    /* of all tensors */
    uint64_t in_data_bytes, out_data_bytes; /* tensor data, without padding */
    uint64_t out_file_bytes;
} nm_quantize_summary;

/* Writes a quantised copy of the GGUF file in_path (F32/F16/BF16 tensors)
 * to out_path with every key, atomically (as nm_outfile). NM_ERR_INVALID_ARG
 * for an unknown type (the message lists them), out_path naming the input,
 * or a value that cannot be converted (named by tensor, row and column).
 * summary may be NULL. Thread-safe (each call its own files). */
nm_status nm_quantize(const char *in_path, const char *out_path, const nm_quantize_params *params,
                      nm_quantize_summary *summary, nm_error *err);

/* ---- kernels -------------------------------------------------------------------- */

/* Applies NPUMOE_KERNELS from the environment (ref, avx2, avx512,
 * avx512bf16, avx512vnni, amx, exact) before the first model is loaded:
 * NM_ERR_UNSUPPORTED when it names a variant this CPU cannot run. */
nm_status nm_kernels_check_environment(nm_error *err);
/* The kernel variant in use ("avx512vnni") and why it was chosen. */
const char *nm_kernels_variant(void);
const char *nm_kernels_variant_why(void);
/* The rows the variant in use computes at once (16 for amx, whose tiles
 * hold 16 rows; else 1): the cpu device's row granule. */
int32_t nm_kernels_variant_row_granule(void);

/* ---- output files ------------------------------------------------------------- */

/* A file written so that nothing but the target changes: a regular file or
 * a new name is replaced atomically (a temporary file beside it, flushed to
 * disk and renamed over it by commit); a symbolic link is followed to its
 * target (a link to nothing is refused); a character device or a FIFO
 * (/dev/null, /dev/stdout, a pipe) is written directly; anything else (a
 * directory, a block device, a socket) is refused. Messages name the path
 * as given. Every file the library saves is written this way. */
typedef struct nm_outfile {
    FILE *f;      /* write here (or with nm_outfile_write) between open and commit */
    char *path;   /* as given */
    char *target; /* where the bytes go: path, or where its symbolic link points */
    char *tmp;    /* the temporary file beside target; NULL when written directly */
} nm_outfile;

nm_status nm_outfile_open(const char *path, nm_outfile *o, nm_error *err);
nm_status nm_outfile_write(nm_outfile *o, const void *data, size_t n_bytes, nm_error *err);
/* Flushes, forces a regular file to disk and renames it over the target;
 * releases o in every case (on failure as nm_outfile_abort). */
nm_status nm_outfile_commit(nm_outfile *o, nm_error *err);
/* Closes, removes the temporary file (the target is untouched); o may be
 * zeroed or already released. */
void nm_outfile_abort(nm_outfile *o);
/* Whether nm_outfile_open(path) would succeed now, leaving nothing behind
 * (a device or FIFO is not opened: a FIFO would wait for a reader), so that
 * a bad output path fails before the work. */
nm_status nm_outfile_check(const char *path, nm_error *err);

#ifdef __cplusplus
}
#endif

#endif /* NPUMOE_H */

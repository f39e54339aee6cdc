/* Models: hyperparameters and weights of one architecture read from a GGUF
 * file (one adapter per architecture in arch/), and the forward pass built
 * from kernels over a KV cache. The public nm_model handle is this part's
 * struct nm_model. Not here: sessions, sampling, metrics (engine/). */
#ifndef NM_MODEL_H
#define NM_MODEL_H

#include "npumoe.h"

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "moe/moe.h"
#include "threads/threads.h"
#include "tokenizer/tokenizer.h"

/* How an architecture normalises: RMSNorm (optionally plus a bias, as
 * llama.cpp's phimoe graph does) or LayerNorm with bias (PhiMoE as trained). */
typedef enum nm_norm_kind { NM_NORM_RMS, NM_NORM_LAYER } nm_norm_kind;

/* RoPE pairing: NEOX rotates element i with i + n_rot/2; NORM (llama)
 * rotates adjacent pairs (2i, 2i+1). */
typedef enum nm_rope_kind { NM_ROPE_NEOX, NM_ROPE_NORM } nm_rope_kind;

/* Where q/k norms apply: none, per head over head_dim (qwen3moe), or over
 * the whole projection of n_head * head_dim before the head split (olmoe). */
typedef enum nm_qk_norm_kind { NM_QK_NORM_NONE, NM_QK_NORM_HEAD, NM_QK_NORM_WHOLE } nm_qk_norm_kind;

typedef struct nm_hparams {
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd; /* d_model */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim; /* key_length == value_length */
    int32_t n_rot;    /* rotated dims per head */
    int32_t n_expert;
    int32_t n_expert_used; /* k */
    int32_t n_ff_exp;      /* d_ff of one expert */
    float rope_freq_base;
    float rms_eps; /* eps of every norm, RMS or Layer */
    nm_norm_kind norm;
    nm_rope_kind rope;
    nm_qk_norm_kind qk_norm;
    float rope_attn_factor; /* cos and sin are scaled by it (1 = none)        */
    int32_t n_ctx_orig;     /* context up to which the short RoPE factors hold */
    float router_jitter;    /* sparsemixer's relative-gap threshold is 2x this */
} nm_hparams;

/* Optional vectors (biases, q/k norms) are NULL when the file has none. */
typedef struct nm_layer {
    const float *attn_norm;   /* [n_embd] */
    const float *attn_norm_b; /* [n_embd] */
    nm_mat wq;                /* [n_head * head_dim][n_embd] */
    nm_mat wk;                /* [n_head_kv * head_dim][n_embd] */
    nm_mat wv;                /* [n_head_kv * head_dim][n_embd] */
    nm_mat wo;                /* [n_embd][n_head * head_dim] */
    const float *bq;          /* [n_head * head_dim] */
    const float *bk;          /* [n_head_kv * head_dim] */
    const float *bv;          /* [n_head_kv * head_dim] */
    const float *bo;          /* [n_embd] */
    const float *q_norm;      /* [head_dim] (HEAD) or [n_head * head_dim] (WHOLE) */
    const float *k_norm;      /* [head_dim] or [n_head_kv * head_dim] */
    const float *ffn_norm;    /* [n_embd] */
    const float *ffn_norm_b;  /* [n_embd] */
    nm_mat router;            /* [n_expert][n_embd] */
    nm_expert_weights experts;
} nm_layer;

/* Routing of one token: logits [n_expert] -> ids, weights [k]; probs is
 * scratch [n_expert]. */
typedef void (*nm_route_fn)(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                            float *probs);

/* What an architecture adapter provides. Everything after the router is
 * shared. */
typedef struct nm_arch {
    const char *name; /* general.architecture */
    /* Reads hparams and weights into model (model->gguf and model->compat
     * are set) and sets model->route. */
    nm_status (*load)(nm_model *model, nm_error *err);
} nm_arch;

struct nm_model {
    nm_gguf *gguf;
    nm_tokenizer *tok;
    const nm_arch *arch;
    nm_hparams hp;
    bool vocab_only;            /* nm_model_params.vocab_only: tok, gguf, arch only */
    nm_layer *layers;           /* [n_layer] */
    nm_mat tok_embd;            /* [n_vocab][n_embd] */
    const float *output_norm;   /* [n_embd] */
    const float *output_norm_b; /* [n_embd] or NULL */
    nm_mat output;              /* [n_vocab][n_embd]; tok_embd when tied */
    const float *output_b;      /* [n_vocab] or NULL */
    bool tied_output;
    const float *rope_factors_short; /* [n_rot / 2] or NULL: frequency divisors */
    const float *rope_factors_long;  /* [n_rot / 2] or NULL, past n_ctx_orig  */
    nm_compat compat;
    nm_route_fn route; /* the architecture's routing under compat */
    /* copies of weights the kernels wanted in a layout of their own
     * (nm_kernels_prepare), which the nm_mat above then point into */
    nm_prepared prepared;
};

/* ---- helpers for adapters (model.c) ---- */

/* Reads "<arch>.<suffix>" as int32/float; required ones fail with a message
 * naming the key, optional ones keep *out when the key is absent. */
nm_status nm_model_hparam_i32(const nm_model *m, const char *suffix, bool required, int32_t *out,
                              nm_error *err);
nm_status nm_model_hparam_f32(const nm_model *m, const char *suffix, bool required, float *out,
                              nm_error *err);

/* Finds a weight matrix tensor with ne = {k, n} (ggml order), checks its type
 * is computable, and fills out. Missing tensors give NM_ERR_NOT_FOUND unless
 * optional (then out->data = NULL and NM_OK). */
nm_status nm_model_get_mat(const nm_model *m, const char *name, int64_t k, int64_t n, bool optional,
                           nm_mat *out, nm_error *err);
/* An F32 vector of n elements. */
nm_status nm_model_get_vec(const nm_model *m, const char *name, int64_t n, const float **out,
                           nm_error *err);
/* The same, or *out = NULL when the tensor is absent. */
nm_status nm_model_get_vec_opt(const nm_model *m, const char *name, int64_t n, const float **out,
                               nm_error *err);

/* Which optional weights an architecture has (common.c). */
typedef enum nm_presence { NM_ABSENT, NM_OPTIONAL, NM_REQUIRED } nm_presence;
typedef struct nm_weight_spec {
    nm_presence norm_bias;    /* attn_norm.bias, ffn_norm.bias, output_norm.bias */
    nm_presence attn_bias;    /* attn_{q,k,v,output}.bias */
    nm_presence output_bias;  /* output.bias */
    nm_presence rope_factors; /* rope_factors_{short,long}.weight */
} nm_weight_spec;

/* Reads the hyperparameters every MoE architecture shares ("<arch>.*":
 * blocks, heads, experts, expert d_ff from expert_feed_forward_length or
 * else feed_forward_length, eps, RoPE) and checks their ranges; fields the
 * adapter set before (norm, rope, qk_norm, ...) are kept. */
nm_status nm_model_load_hparams(nm_model *m, nm_error *err);
/* Reads the embedding, every layer (attention, norms, router, expert stacks,
 * with the optional weights of spec and q/k norms as hp.qk_norm says) and
 * the output; a missing output.weight ties the output to token_embd. */
nm_status nm_model_load_weights(nm_model *m, const nm_weight_spec *spec, nm_error *err);

/* ---- blocks the forward pass shares (blocks.c) ---- */

/* y = norm(x) * w + b over n values by hp->norm (b may be NULL). y may alias x. */
void nm_model_norm(const nm_hparams *hp, const float *x, const float *w, const float *b, float *y,
                   int64_t n);
/* RoPE of x: [n_head][head_dim] at pos, by hp->rope, with optional frequency
 * factors [n_rot / 2] and hp->rope_attn_factor, as ggml's rope_ext does. */
void nm_model_rope(const nm_hparams *hp, const float *freq_factors, float *x, int n_head,
                   int32_t pos);
/* Rounds n floats to F16 and back (llama.cpp converts activations to F16
 * before F16 matmuls; the llama.cpp compat path does it too). */
void nm_model_round_f16(float *x, int64_t n);

/* Routing functions the adapters choose from (blocks.c). */
void nm_route_softmax_topk_renorm(const nm_hparams *hp, const float *logits, int32_t *ids,
                                  float *weights, float *probs);
void nm_route_softmax_topk(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                           float *probs);
/* PhiMoE's "sparsemixer" at inference: k times, the best remaining expert,
 * weighted by its probability in a softmax over the remaining experts whose
 * logits are within a relative gap of 2 * router_jitter of it; no
 * renormalisation. */
void nm_route_sparsemixer(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                          float *probs);
/* A stack of n_expert matrices ne = {k, n, n_expert}: first matrix + stride. */
nm_status nm_model_get_stack(const nm_model *m, const char *name, int64_t k, int64_t n,
                             int64_t n_expert, nm_mat *first, size_t *stride, nm_error *err);

/* ---- forward pass (forward.c) ---- */

/* KV cache and work buffers of one session, sized once. */
typedef struct nm_model_state nm_model_state;

typedef struct nm_state_params {
    int32_t n_ctx;   /* positions */
    int32_t n_batch; /* tokens per forward call; the chunk T in static modes */
    int n_threads;
    nm_mode mode;
    const nm_moe_plan *plan; /* tiers, grouped, npumoe */
    nm_device *device;       /* every mode but dense */
    nm_kv_type kv_type;      /* KV cache elements: F32 (default) or F16 */
} nm_state_params;

nm_status nm_model_state_new(const nm_model *m, const nm_state_params *params, nm_model_state **out,
                             nm_error *err);
void nm_model_state_free(nm_model_state *st);
int32_t nm_model_state_n_ctx(const nm_model_state *st);
int32_t nm_model_state_n_batch(const nm_model_state *st);
/* Bytes the state allocated (KV cache and buffers). */
size_t nm_model_state_bytes(const nm_model_state *st);
/* The MoE executors: the static mode's (NULL in dense mode), used for prompt
 * batches of more than one token, and the dense one used otherwise. */
nm_moe_exec *nm_model_state_prefill_exec(nm_model_state *st);
nm_moe_exec *nm_model_state_dense_exec(nm_model_state *st);

/* Runs n (1..n_batch) tokens (padded to a whole chunk in static modes) at positions
 * n_past..n_past+n-1 through every layer, writing their K/V into the cache. logits: NULL,
 * [n][n_vocab] when all_logits, else [n_vocab] of the last token. */
nm_status nm_model_forward(const nm_model *m, nm_model_state *st, const int32_t *ids, int32_t n,
                           int32_t n_past, float *logits, bool all_logits, nm_error *err);

/* The host's MoE step of one layer over a chunk of `chunk` tokens, timed by
 * nm_moe_time_host_layer going round the model's layers (rounds of reps
 * runs): *ms, and the rows each expert received (loads [n_expert]), for
 * nm_profile_set_overhead. Run it before nm_device_profile: right after a
 * device profile the host measured slower for a while. */
nm_status nm_model_time_host_step(const nm_model *m, nm_pool *pool, int32_t chunk, int reps,
                                  double *ms, int32_t *loads, nm_error *err);

/* Every adapter, for lookup by name. */
extern const nm_arch nm_arch_qwen3moe;
extern const nm_arch nm_arch_olmoe;
extern const nm_arch nm_arch_llama;
extern const nm_arch nm_arch_phimoe;

#endif /* NM_MODEL_H */

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
    float rms_eps;
} nm_hparams;

typedef struct nm_layer {
    const float *attn_norm; /* [n_embd] */
    nm_mat wq;              /* [n_head * head_dim][n_embd] */
    nm_mat wk;              /* [n_head_kv * head_dim][n_embd] */
    nm_mat wv;              /* [n_head_kv * head_dim][n_embd] */
    nm_mat wo;              /* [n_embd][n_head * head_dim] */
    const float *q_norm;    /* [head_dim], NULL if the architecture has none */
    const float *k_norm;    /* [head_dim] */
    const float *ffn_norm;  /* [n_embd] */
    nm_mat router;          /* [n_expert][n_embd] */
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
    /* Reads hparams and weights into model (model->gguf is open). */
    nm_status (*load)(nm_model *model, nm_error *err);
    nm_route_fn route;
} nm_arch;

struct nm_model {
    nm_gguf *gguf;
    nm_tokenizer *tok;
    const nm_arch *arch;
    nm_hparams hp;
    nm_layer *layers;         /* [n_layer] */
    nm_mat tok_embd;          /* [n_vocab][n_embd] */
    const float *output_norm; /* [n_embd] */
    nm_mat output;            /* [n_vocab][n_embd]; tok_embd when tied */
    bool tied_output;
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

/* Every adapter, for lookup by name. */
extern const nm_arch nm_arch_qwen3moe;

#endif /* NM_MODEL_H */

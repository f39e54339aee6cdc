/* Models: what a model is. Hyperparameters and weights of one architecture
 * read from a GGUF file (one adapter per architecture in arch/), and the
 * computation of a layer written once from shared blocks (attention,
 * routing, the residual around the experts, the output head) over buffers
 * and a KV cache the caller owns. The public nm_model handle is this part's
 * struct nm_model. Not here: sessions, the KV cache, the MoE executors,
 * sampling, metrics (engine/, moe/). */
#ifndef NM_MODEL_H
#define NM_MODEL_H

#include "npumoe.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
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
    int32_t n_expert_used;   /* k */
    int32_t n_ff_exp;        /* d_ff of one expert */
    int32_t n_ff_shexp;      /* d_ff of the shared expert; 0: the layers have none */
    int32_t n_expert_shared; /* experts in it (deepseek2: expert_shared_count, one stack); 0 with
                                n_ff_shexp */
    float rope_freq_base;
    float rms_eps; /* eps of every norm, RMS or Layer */
    nm_norm_kind norm;
    nm_rope_kind rope;
    nm_qk_norm_kind qk_norm;
    float rope_attn_factor; /* cos and sin are scaled by it (1 = none)        */
    int32_t n_ctx_orig;     /* context up to which the short RoPE factors hold */
    float router_jitter;    /* sparsemixer's relative-gap threshold is 2x this */
    float attn_scale;       /* the q.k scale; 0: 1 / sqrt(head_dim) */
    /* Multi-head latent attention (deepseek2; n_lora_kv > 0): q from wq, or
     * through a rank-n_lora_q bottleneck (q_a, its norm, q_b) when
     * n_lora_q > 0; head_dim = n_nope + n_rot (key_length) for q and k,
     * n_v_head (value_length) for v; the cache holds, per position, the
     * normed latent [n_lora_kv] and the RoPE key shared by every head
     * [n_rot] (nm_model_kv_k_dim), nothing else */
    int32_t n_lora_q, n_lora_kv, n_nope, n_v_head;
    /* layers 0 .. n_layer_dense_lead - 1 are a plain SwiGLU FFN of width
     * n_ff (no router, no experts): deepseek2's leading dense layers */
    int32_t n_layer_dense_lead, n_ff;
    /* routed weights: renormalised to sum 1 when expert_weights_norm, then
     * multiplied by expert_weights_scale (1: none) */
    bool expert_weights_norm;
    float expert_weights_scale;
    /* group-limited routing (n_group > 1): the experts are n_group
     * consecutive groups; only the n_group_used groups of the highest
     * best probability are eligible for the top-k */
    int32_t n_group, n_group_used;
    bool shexp_ungated; /* the shared experts' output is added as it is */
    /* RoPE context scaling (rope.scaling.type linear or yarn with
     * rope.scaling.factor); NULL-like when rope_scaled is false */
    bool rope_scaled;
    nm_rope_yarn rope_yarn;
    /* keys a sliding-window layer (nm_layer.window) attends to, the query's
     * own included (attention.sliding_window); 0: no layer slides */
    int32_t n_swa;
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
    const float *router_b;    /* [n_expert] added to the router's logits */
    const float *sinks;       /* [n_head] attention sink logits (gpt-oss) */
    int32_t window;           /* keys attended (the query's own included); 0: all */
    nm_expert_weights experts;
    /* The shared expert (hp.n_ff_shexp > 0): a SwiGLU FFN every token
     * takes, whose output is scaled by sigmoid(shexp_gate_inp . xn). */
    nm_mat shexp_gate_inp; /* [1][n_embd] */
    nm_mat shexp_gate;     /* [n_ff_shexp][n_embd] */
    nm_mat shexp_up;       /* [n_ff_shexp][n_embd] */
    nm_mat shexp_down;     /* [n_embd][n_ff_shexp] */
    /* MLA (hp.n_lora_kv > 0), instead of wq (when n_lora_q > 0), wk, wv */
    nm_mat wq_a;            /* [n_lora_q][n_embd] */
    const float *q_a_norm;  /* [n_lora_q] */
    nm_mat wq_b;            /* [n_head * head_dim][n_lora_q] */
    nm_mat wkv_a;           /* [n_lora_kv + n_rot][n_embd] latent, then k_pe */
    const float *kv_a_norm; /* [n_lora_kv] */
    /* [n_head][n_nope + n_v_head][n_lora_kv]: per head the rows giving
     * k_nope, then those giving v; read by rows, never repacked */
    nm_mat wkv_b;
    /* [n_head * n_lora_kv][n_nope] F32: per head the transpose of wkv_b's
     * k_nope rows, made at load (nm_model_mla_prepare), which takes q_nope
     * into the latent space as a matmul */
    nm_mat wk_b_t;
    /* a dense layer (il < hp.n_layer_dense_lead): its FFN, no router */
    nm_mat ffn_gate; /* [n_ff][n_embd] */
    nm_mat ffn_up;   /* [n_ff][n_embd] */
    nm_mat ffn_down; /* [n_embd][n_ff] */
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
    float *mla_k_t; /* every layer's wk_b_t (MLA), or NULL */
};

/* ---- helpers for adapters (model.c) ---- */

/* <arch>.rope.scaling.type ("none", "linear": angles / factor, "yarn": as
 * ggml's rope_ext with beta_fast 32, beta_slow 1) and .factor into
 * hp.rope_scaled and hp.rope_yarn; *factor_out (may be NULL): the factor in
 * use, 1 without scaling. */
nm_status nm_model_rope_scaling(nm_model *m, float *factor_out, nm_error *err);

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
/* An F32 tensor of rows vectors of n (ggml ne = {n, rows}; rows 1 is
 * nm_model_get_vec). */
nm_status nm_model_get_rows(const nm_model *m, const char *name, int64_t n, int64_t rows,
                            const float **out, nm_error *err);
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
    /* attn_{q,k,v}.bias without attn_output.bias (qwen2moe): q, k and v
     * take the stronger of this and attn_bias */
    nm_presence qkv_bias;
    /* ffn_{gate_inp,gate,up,down}_shexp.weight, of width
     * expert_shared_feed_forward_length (qwen2moe); without
     * ffn_gate_inp_shexp when hp.shexp_ungated (deepseek2) */
    nm_presence shared_expert;
    nm_presence attn_sinks;  /* attn_sinks.weight [n_head] (gpt-oss) */
    nm_presence router_bias; /* ffn_gate_inp.bias */
    nm_presence expert_bias; /* ffn_{gate,up,down}_exps.bias */
    /* the FFN norm's tensor, "blk.N.<name>.weight"; NULL: "ffn_norm"
     * (gpt-oss names it "post_attention_norm") */
    const char *ffn_norm_name;
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

/* Whether layer il routes tokens to experts (false: a leading dense layer),
 * and its index among the layers that do (the executor's and the plan's
 * layer numbers), or -1. */
bool nm_model_layer_is_moe(const nm_hparams *hp, int32_t il);
int32_t nm_model_moe_index(const nm_hparams *hp, int32_t il);
/* Layers that route tokens to experts, and the expert stacks of the
 * moe_layer-th of them (what the MoE executors and plans number). */
int32_t nm_model_n_moe_layers(const nm_hparams *hp);
const nm_expert_weights *nm_model_moe_experts(const nm_model *m, int32_t moe_layer);
/* Floats per position one layer's cache holds, keys and values (MLA: the
 * latent and k_pe as keys, no values), and per row of nm_model_batch.q and
 * .att. */
int64_t nm_model_kv_k_dim(const nm_hparams *hp);
int64_t nm_model_kv_v_dim(const nm_hparams *hp);
int64_t nm_model_q_width(const nm_hparams *hp);

/* ---- blocks the forward pass shares (blocks.c) ---- */

/* y = norm(x) * w + b over n values by hp->norm (b may be NULL). y may alias x. */
void nm_model_norm(const nm_hparams *hp, const float *x, const float *w, const float *b, float *y,
                   int64_t n);
/* RoPE of x: [n_head][head_dim] at pos, by hp->rope, with optional frequency
 * factors [n_rot / 2], hp->rope_attn_factor and hp's scaling (YaRN), as
 * ggml's rope_ext does. */
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
/* DeepSeek's: softmax over all experts, group-limited when hp.n_group > 1,
 * top-k, renormalised when hp.expert_weights_norm, times
 * hp.expert_weights_scale. */
void nm_route_deepseek(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
                       float *probs);
/* gpt-oss: the k largest logits (ties to the lower id), weighted by a
 * softmax over those k logits alone. */
void nm_route_topk_softmax(const nm_hparams *hp, const float *logits, int32_t *ids, float *weights,
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

/* ---- the computation of a layer (layer.c) ---- */

/* The engine runs a batch through the model as:
 *     nm_model_embed
 *     for each layer il:
 *         nm_model_attention(il)  x += attention(norm(x))
 *         nm_model_route(il)      xn = norm(x), router logits, experts chosen
 *         (the engine's MoE executor: proj = experts(xn) by ids and weights)
 *         nm_model_ffn_residual(il)  x += proj (+ the shared expert)
 *     nm_model_output             final norm and head of the rows asked for
 * Each block reports its tensors to the batch's tap (npumoe.h, nm_tap_fn)
 * and returns false when the tap asked to stop (then x, xn and the batch's
 * cache rows are left half-computed). */

/* One layer's KV cache as the caller lays it out: the keys of position p at
 * k + p * nm_model_kv_k_dim elements of type, the values likewise in v
 * (nm_model_kv_v_dim; MLA has none: v may be NULL). */
typedef struct nm_kv_view {
    nm_kv_type type; /* NM_KV_F32, or NM_KV_F16 (IEEE half) */
    void *k;         /* [n_kv][kv_dim] */
    void *v;         /* [n_kv][kv_dim] */
    /* F16: [2][n_rows][kv_dim], the batch's new keys, then values, in F32
     * before they are rounded into the cache; NULL for F32, where they are
     * computed in their cache rows */
    float *stage;
} nm_kv_view;

/* A batch on its way through the layers: its rows and positions, and the
 * work buffers the blocks write, all owned by the caller. */
typedef struct nm_model_batch {
    nm_pool *pool;
    int32_t n_rows; /* rows computed through attention */
    /* of them, the real tokens: the rest pad a static chunk (they attend
     * only to earlier rows, are never routed, never reported to the tap) */
    int32_t n_real;
    int32_t n_past;            /* position of row 0 */
    const float *rope_factors; /* [n_rot / 2] the short or long ones, or NULL */
    float *x;                  /* [n_rows][n_embd] residual stream */
    float *xn;                 /* [n_rows][n_embd] a block's normed input */
    float *q;                  /* [n_rows][nm_model_q_width] */
    float *att;                /* [n_rows][nm_model_q_width] attention output */
    float *proj;           /* [n_rows][n_embd] a block's output; the experts' for the residual */
    float *scores;         /* [n_threads][scores_stride] attention scratch */
    int64_t scores_stride; /* >= n_past + n_rows */
    float *router;         /* [n_real][n_expert] router logits */
    int32_t *ids;          /* [n_real][n_expert_used] experts chosen */
    float *weights;        /* [n_real][n_expert_used] their weights */
    float *probs;          /* [n_rows][n_expert] routing scratch, a row a token */
    /* [n_rows][nm_model_shexp_scratch(hp)] the shared expert's or a dense
     * layer's FFN work; NULL when the model has neither */
    float *shexp;
    nm_tap_fn tap; /* NULL: none */
    void *tap_ctx;
    /* NULL: the rows are one sequence, row t at position n_past + t of the
     * kv given to nm_model_attention. Else the rows are of different
     * sequences (several sessions decoding at once): row t is at position
     * pos[t] of the cache kvs[t], and the kv given only lends its stage
     * ([2][n_rows][kv_dim] F32, whatever the caches' types) */
    const int32_t *pos;
    const nm_kv_view *kvs;
} nm_model_batch;

/* x of rows t < n from the embedding of ids[t]; rows n .. n_rows-1 (padding)
 * repeat ids[n - 1]. ids must be in [0, n_vocab). */
void nm_model_embed(const nm_model *m, const int32_t *ids, int32_t n, const nm_model_batch *b);
/* x += Wo attention(rope(qk_norm(Wq xn)), rope(qk_norm(Wk xn)), Wv xn)
 * (MLA: mla.c, nm_model_attention_mla),
 * xn = attn_norm(x), over the cache's positions 0 .. n_past + t for row t;
 * the rows' keys and values land in the cache at n_past. Taps attn_norm,
 * Qcur, Kcur, Vcur, kqv_out, ffn_inp. */
bool nm_model_attention(const nm_model *m, int32_t il, const nm_model_batch *b,
                        const nm_kv_view *kv);
/* xn = ffn_norm(x), the router's logits and the architecture's routing
 * (m->route) of each real row into ids and weights; xn is then what the
 * experts take. Taps ffn_norm, ffn_moe_logits. A dense layer
 * (nm_model_layer_is_moe false) has no router: xn alone, and the caller
 * runs no executor on it. */
bool nm_model_route(const nm_model *m, int32_t il, const nm_model_batch *b);
/* The second half of nm_model_route, for a caller that computed xn and the
 * router's logits elsewhere (a device's dense graph): routing of each real
 * row from b->router. Taps ffn_moe_logits. */
bool nm_model_route_logits(const nm_model *m, int32_t il, const nm_model_batch *b);
/* Multi-head latent attention (mla.c), called by nm_model_attention for an
 * MLA model: the same contract, over a cache of latents and k_pe. */
bool nm_model_attention_mla(const nm_model *m, int32_t il, const nm_model_batch *b,
                            const nm_kv_view *kv);
/* Makes every layer's wk_b_t from its wkv_b (m->mla_k_t), for the loader
 * of an MLA model once its weights are in place. */
nm_status nm_model_mla_prepare(nm_model *m, nm_error *err);
/* Floats per row the shared expert or a dense layer's FFN needs in
 * nm_model_batch.shexp (0: the model has neither). */
int64_t nm_model_shexp_scratch(const nm_hparams *hp);
/* x += proj over the real rows, plus, when the model has a shared expert,
 * its output on xn scaled by its sigmoid gate (or not, hp.shexp_ungated;
 * dense work on every real row, whatever executor ran the routed experts):
 * computed here, or taken as it is from shexp ([n_real][n_embd], a
 * device's dense graph computed it) when shexp is not NULL. A dense layer:
 * proj = its FFN on xn first (no executor ran). Taps ffn_moe_out,
 * ffn_shexp_out (with a shared expert) or ffn_out (a dense layer), l_out. */
bool nm_model_ffn_residual(const nm_model *m, int32_t il, const nm_model_batch *b,
                           const float *shexp);
/* logits [n_real - first][n_vocab] = output(output_norm(x)) of the real
 * rows from first on. Taps result_norm, result_output (layer -1). */
bool nm_model_output(const nm_model *m, const nm_model_batch *b, int32_t first, float *logits);

/* ---- fingerprint (fingerprint.c) ---- */

/* A hex digest of what makes two files the same model for planning: the
 * architecture, the MoE shape (layers, d_model, experts, k, d_ff), the
 * tensor table (names, types, shapes) and the weights: every byte of the
 * routers (a plan follows their rows) and 16 pieces of 64 bytes spread over
 * every other tensor (so it costs milliseconds, not a read of the file):
 * FNV-1a 64 over a length-prefixed little-endian serialisation. Another
 * training, a re-quantisation or permuted router rows change it; a change
 * to a non-router tensor between the samples does not. */
void nm_model_fingerprint(const nm_model *model, nm_fingerprint *out);

/* Every adapter, for lookup by name. */
extern const nm_arch nm_arch_qwen3moe;
extern const nm_arch nm_arch_olmoe;
extern const nm_arch nm_arch_llama;
extern const nm_arch nm_arch_phimoe;
extern const nm_arch nm_arch_qwen2moe;
extern const nm_arch nm_arch_deepseek2;
extern const nm_arch nm_arch_gptoss;

#endif /* NM_MODEL_H */

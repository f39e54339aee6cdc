/* Which type each tensor of a file is quantised to: the single types, and the
 * Q4_K_M / Q5_K_M / Q4_K_S / Q5_K_S mixes by the rules of llama.cpp's
 * src/llama-quant.cpp (the version the golden vectors were made with),
 * restricted to what those mixes use. Names are matched as llama.cpp matches
 * them, by substring. */
#include "quant.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    uint32_t type;      /* single type, or the mix's ordinary tensors */
    uint32_t file_type; /* llama.cpp's LLAMA_FTYPE */
    bool mix;
} kind_table[NM_QUANT_KIND_COUNT] = {
    [NM_QUANT_Q8_0] = {"q8_0", NM_DTYPE_Q8_0, 7, false},
    [NM_QUANT_Q4_0] = {"q4_0", NM_DTYPE_Q4_0, 2, false},
    [NM_QUANT_Q4_K] = {"q4_k", NM_DTYPE_Q4_K, 14, false},
    [NM_QUANT_Q5_K] = {"q5_k", NM_DTYPE_Q5_K, 16, false},
    [NM_QUANT_Q6_K] = {"q6_k", NM_DTYPE_Q6_K, 18, false},
    [NM_QUANT_Q4_K_M] = {"q4_k_m", NM_DTYPE_Q4_K, 15, true},
    [NM_QUANT_Q5_K_M] = {"q5_k_m", NM_DTYPE_Q5_K, 17, true},
    [NM_QUANT_Q4_K_S] = {"q4_k_s", NM_DTYPE_Q4_K, 14, true},
    [NM_QUANT_Q5_K_S] = {"q5_k_s", NM_DTYPE_Q5_K, 16, true},
    [NM_QUANT_F32] = {"f32", NM_DTYPE_F32, 0, false},
    [NM_QUANT_F16] = {"f16", NM_DTYPE_F16, 1, false},
    [NM_QUANT_BF16] = {"bf16", NM_DTYPE_BF16, 32, false},
};
_Static_assert(NM_QUANT_KIND_COUNT == 12, "kind_table covers every kind");

nm_status nm_quant_kind_parse(const char *name, nm_quant_kind *out, nm_error *err) {
    NM_ASSERT(name != NULL && out != NULL);
    char lower[16];
    size_t n = strlen(name);
    if (n < sizeof lower) {
        for (size_t i = 0; i <= n; i++)
            lower[i] = (char)tolower((unsigned char)name[i]);
        for (int k = 0; k < NM_QUANT_KIND_COUNT; k++) {
            if (strcmp(lower, kind_table[k].name) == 0) {
                *out = (nm_quant_kind)k;
                return NM_OK;
            }
        }
    }
    return nm_errorf(
        err, NM_ERR_INVALID_ARG,
        "unknown quantisation type '%s' (q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m, "
        "q4_k_s, q5_k_s, f32, f16, bf16)",
        name);
}

const char *nm_quant_kind_name(nm_quant_kind kind) {
    NM_ASSERT((unsigned)kind < NM_QUANT_KIND_COUNT);
    return kind_table[kind].name;
}

uint32_t nm_quant_file_type(nm_quant_kind kind) {
    NM_ASSERT((unsigned)kind < NM_QUANT_KIND_COUNT);
    return kind_table[kind].file_type;
}

uint32_t nm_quant_base_type(nm_quant_kind kind) {
    NM_ASSERT((unsigned)kind < NM_QUANT_KIND_COUNT);
    return kind_table[kind].type;
}

/* ---- names ------------------------------------------------------------------ */

static bool contains(nm_gguf_str s, const char *needle) {
    size_t n = strlen(needle);
    if (n > s.len) return false;
    for (uint64_t i = 0; i + n <= s.len; i++)
        if (memcmp(s.ptr + i, needle, n) == 0) return true;
    return false;
}

static bool ends_with(nm_gguf_str s, const char *suffix) {
    size_t n = strlen(suffix);
    return n <= s.len && memcmp(s.ptr + s.len - n, suffix, n) == 0;
}

/* The layer of "blk.N...." names, or -1 (llama.cpp reads it with
 * sscanf("blk.%d.")). */
static int layer_of(nm_gguf_str s) {
    if (s.len < 5 || memcmp(s.ptr, "blk.", 4) != 0 || !isdigit((unsigned char)s.ptr[4])) return -1;
    long v = 0;
    for (uint64_t i = 4; i < s.len && isdigit((unsigned char)s.ptr[i]); i++) {
        v = v * 10 + (s.ptr[i] - '0');
        if (v > 1000000) return -1;
    }
    return (int)v;
}

/* llama.cpp's tensor order while quantising (its loader's map): layer first
 * (tensors outside layers, -1, come first), then name. */
static bool comes_before(nm_gguf_str a, nm_gguf_str b) {
    int la = layer_of(a), lb = layer_of(b);
    if (la != lb) return la < lb;
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = memcmp(a.ptr, b.ptr, (size_t)n);
    return c < 0 || (c == 0 && a.len < b.len);
}

typedef enum {
    CAT_OUTPUT,
    CAT_TOKEN_EMBD,
    CAT_ATTN_V, /* attn_v, and the fused attn_qkv and attn_kv_b */
    CAT_ATTN_K,
    CAT_ATTN_Q,
    CAT_ATTN_OUTPUT,
    CAT_FFN_UP,
    CAT_FFN_GATE,
    CAT_FFN_DOWN,
    CAT_OTHER
} category;

static category category_of(nm_gguf_str s) {
    if (nm_gguf_str_eq(s, "output.weight")) return CAT_OUTPUT;
    if (nm_gguf_str_eq(s, "token_embd.weight") || nm_gguf_str_eq(s, "per_layer_token_embd.weight"))
        return CAT_TOKEN_EMBD;
    if (contains(s, "attn_qkv.weight") || contains(s, "attn_kv_b.weight") ||
        contains(s, "attn_v.weight"))
        return CAT_ATTN_V;
    if (contains(s, "attn_k.weight")) return CAT_ATTN_K;
    if (contains(s, "attn_q.weight")) return CAT_ATTN_Q;
    if (contains(s, "attn_output.weight")) return CAT_ATTN_OUTPUT;
    /* in this order: "ffn_gate" must not catch ffn_up; routers are excluded earlier */
    if (contains(s, "ffn_up")) return CAT_FFN_UP;
    if (contains(s, "ffn_gate")) return CAT_FFN_GATE;
    if (contains(s, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

/* Substrings of tensors llama.cpp never quantises beyond the rules in
 * eligible(): norms, MoE routers, small or positional tensors of other
 * architectures. */
static const char *const never_quantised[] = {
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
};

static bool eligible(const nm_gguf_tensor *t) {
    /* matrices and stacks of them: some dimension past the first above 1 */
    if (t->ne[1] <= 1 && t->ne[2] <= 1 && t->ne[3] <= 1) return false;
    if (!ends_with(t->name, "weight")) return false;
    if (nm_gguf_str_eq(t->name, "position_embd.weight") ||
        nm_gguf_str_eq(t->name, "token_types.weight"))
        return false;
    for (size_t i = 0; i < sizeof never_quantised / sizeof never_quantised[0]; i++)
        if (contains(t->name, never_quantised[i])) return false;
    return true;
}

/* llama.cpp's "use more bits" layers: the first and last eighth, and every
 * third layer between them. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* What the mix model needs from the file. */
typedef struct mix_info {
    bool falcon;
    bool tied; /* no output.weight: token_embd is also the output */
    int n_layer, n_expert;
    int n_attn_v; /* tensors of CAT_ATTN_V */
} mix_info;

static nm_status read_mix_info(const nm_gguf *g, mix_info *mi, nm_error *err) {
    memset(mi, 0, sizeof *mi);
    nm_gguf_str arch;
    nm_status st = nm_gguf_get_str(g, "general.architecture", &arch, err);
    if (st != NM_OK) {
        nm_error_prefix(err, "the q*_k_m and q*_k_s mixes need the architecture");
        return st;
    }
    if (arch.len > 64) return nm_errorf(err, NM_ERR_FORMAT, "general.architecture is too long");
    char key[128];
    snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
    uint32_t u;
    st = nm_gguf_get_u32(g, key, &u, err);
    if (st != NM_OK) {
        nm_error_prefix(err, "the q*_k_m and q*_k_s mixes need the layer count");
        return st;
    }
    if (u == 0 || u > 1000000)
        return nm_errorf(err, NM_ERR_FORMAT, "%s = %u is out of range", key, u);
    mi->n_layer = (int)u;
    snprintf(key, sizeof key, "%.*s.expert_count", (int)arch.len, arch.ptr);
    if (nm_gguf_find(g, key)) {
        st = nm_gguf_get_u32(g, key, &u, err);
        if (st != NM_OK) return st;
        if (u > 1000000) return nm_errorf(err, NM_ERR_FORMAT, "%s = %u is out of range", key, u);
        mi->n_expert = (int)u;
    }
    mi->falcon = nm_gguf_str_eq(arch, "falcon");
    mi->tied = nm_gguf_find_tensor(g, "output.weight") == NULL;
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++)
        mi->n_attn_v += category_of(nm_gguf_tensor_at(g, i)->name) == CAT_ATTN_V;
    return NM_OK;
}

/* Position of tensor t among the tensors of its category, in llama.cpp's
 * processing order (its per-category counters). */
static int rank_in_category(const nm_gguf *g, const nm_gguf_tensor *t, category cat) {
    int rank = 0;
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *u = nm_gguf_tensor_at(g, i);
        if (u != t && category_of(u->name) == cat && comes_before(u->name, t->name)) rank++;
    }
    return rank;
}

/* llama_tensor_get_type_impl for LLAMA_FTYPE_MOSTLY_Q4_K_M, Q5_K_M, Q4_K_S
 * and Q5_K_S. Left out, as npumoe cannot know it: the bump of attn_v for
 * LLM_TYPE_70B. */
static nm_status mix_type(const nm_gguf *g, const mix_info *mi, nm_quant_kind kind,
                          const nm_gguf_tensor *t, uint32_t *type, nm_error *err) {
    const bool q4 = kind == NM_QUANT_Q4_K_M, q4s = kind == NM_QUANT_Q4_K_S;
    const bool m = kind == NM_QUANT_Q4_K_M || kind == NM_QUANT_Q5_K_M;
    const category cat = category_of(t->name);
    *type = nm_quant_base_type(kind);
    if (cat == CAT_OUTPUT || (mi->tied && cat == CAT_TOKEN_EMBD)) {
        *type = mi->falcon || t->ne[0] % NM_QK_K != 0 ? NM_DTYPE_Q8_0 : NM_DTYPE_Q6_K;
    } else if (cat == CAT_ATTN_V) {
        const int rank = rank_in_category(g, t, CAT_ATTN_V);
        if (m && more_bits(rank, mi->n_attn_v))
            *type = NM_DTYPE_Q6_K;
        else if (q4s && rank < 4)
            *type = NM_DTYPE_Q5_K;
        if (mi->n_expert == 8) *type = NM_DTYPE_Q8_0; /* Mixtral-8x: cheap, so more bits */
    } else if (cat == CAT_ATTN_K) {
        if (mi->n_expert == 8) *type = NM_DTYPE_Q8_0;
    } else if (cat == CAT_FFN_DOWN) {
        /* MoE layers hold several ffn_down tensors (experts, shared expert):
         * their layer comes from the name, otherwise from the count */
        int layer = mi->n_expert > 1 ? layer_of(t->name) : rank_in_category(g, t, CAT_FFN_DOWN);
        if (layer < 0 || layer >= mi->n_layer) {
            return nm_errorf(err, NM_ERR_FORMAT,
                             "tensor %.*s: cannot tell its layer (blk.N. in [0, %d)), which the "
                             "%s mix needs",
                             (int)t->name.len, t->name.ptr, mi->n_layer, nm_quant_kind_name(kind));
        }
        const int n = mi->n_layer;
        if (q4 && mi->falcon) {
            *type = layer < n / 16        ? NM_DTYPE_Q6_K
                    : more_bits(layer, n) ? NM_DTYPE_Q5_K
                                          : NM_DTYPE_Q4_K;
        } else if (m && more_bits(layer, n)) {
            *type = NM_DTYPE_Q6_K;
        } else if (q4s && !mi->falcon && layer < n / 8) {
            *type = NM_DTYPE_Q5_K;
        }
    } else if (cat == CAT_ATTN_OUTPUT) {
        if ((q4 || q4s) && !mi->falcon && mi->n_expert == 8) *type = NM_DTYPE_Q5_K;
    }
    return NM_OK;
}

/* A type whose block divides the row length: llama.cpp's fallback, except
 * that q4_K and q5_K go to q8_0 rather than q5_0 / q5_1 (which npumoe does
 * not compute with), and q8_0 and q4_0 go to f16 where llama.cpp stops. */
static uint32_t fallback(uint32_t type, int64_t row) {
    const nm_dtype_traits *tr = nm_dtype_traits_of(type);
    if (row % tr->block_size == 0) return type;
    if (type != NM_DTYPE_Q8_0 && type != NM_DTYPE_Q4_0 && row % NM_Q8_0_BLOCK == 0)
        return NM_DTYPE_Q8_0;
    return NM_DTYPE_F16;
}

nm_status nm_quant_choose(const nm_gguf *g, nm_quant_kind kind, nm_quant_choice *choices,
                          nm_error *err) {
    NM_ASSERT(g != NULL && choices != NULL && (unsigned)kind < NM_QUANT_KIND_COUNT);
    mix_info mi;
    if (kind_table[kind].mix) {
        nm_status st = read_mix_info(g, &mi, err);
        if (st != NM_OK) return st;
    }
    for (uint64_t i = 0; i < nm_gguf_n_tensors(g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(g, i);
        nm_quant_choice *c = &choices[i];
        *c = (nm_quant_choice){.type = t->type, .wanted = t->type, .eligible = eligible(t)};
        if (c->eligible) {
            uint32_t want = nm_quant_base_type(kind);
            if (kind_table[kind].mix) {
                nm_status st = mix_type(g, &mi, kind, t, &want, err);
                if (st != NM_OK) return st;
            }
            c->wanted = want;
            c->type = fallback(want, t->ne[0]);
        }
        c->convert = c->type != t->type;
    }
    return NM_OK;
}

/* nm_gen_fixture: writes tiny random-weight qwen3moe (or qwen2moe, or
 * deepseek2, gpt-oss) GGUF models, laid out key for key and tensor for
 * tensor as llama.cpp's convert_hf_to_gguf.py writes Qwen3-MoE (Qwen2-MoE,
 * DeepSeek-V2, gpt-oss), so that CI can run the whole engine without
 * downloading a model.
 * The weights come from a seeded generator that gives the same bytes on
 * every machine, and the router is skewed the way trained routers are (a few
 * experts take most tokens, a different few in each layer). A second mode,
 * --extract-vocab, copies the tokenizer of a GGUF into a vocab-only file. */
#include "base/base.h"
#include "gguf/gguf.h"
#include "tensor/tensor.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The weights must not depend on the compiler fusing a*b+c into one
 * rounding: GCC in ISO C mode does not, clang is told here. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define PROG "nm_gen_fixture"
/* a fixture, not a model; the 4-layer Qwen3-30B-A3B shape is 3.1e9, the
 * 4-layer gpt-oss-20b shape with its 201088-token vocabulary 4.5e9 */
#define MAX_PARAMS 6000000000ll

/* ---- options ---------------------------------------------------------------- */

typedef struct config {
    int64_t seed, n_layer, d_model, n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff,
        n_ctx, n_vocab;
    int64_t n_ff_shexp; /* qwen2moe: the shared expert's width */
    /* deepseek2: MLA ranks and widths (head_dim is the key length, nope +
     * rope), leading dense layers, shared experts, YaRN, routing */
    int64_t q_lora, kv_lora, rope_dim, v_head_dim, dense_lead, dense_ffn, n_shared, yarn_factor,
        yarn_orig_ctx, expert_norm, n_group, n_group_used;
    int64_t window;             /* gpt-oss: attention.sliding_window */
    const char *arch;           /* qwen3moe | qwen2moe | deepseek2 | gpt-oss */
    const char *type_name;      /* f32 | f16 | bf16 */
    const char *embd_type_name; /* of token_embd and output; NULL: type_name */
    const char *exps_type_name; /* of the expert stacks; NULL: type_name */
    int64_t tied;               /* flag: 0 or 1 */
    const char *vocab_path, *extract_path, *out_path, *name, *pre;
    int64_t help;
} config;

typedef enum opt_kind { OPT_INT, OPT_STR, OPT_FLAG } opt_kind;

typedef struct option {
    const char *name;
    opt_kind kind;
    size_t field; /* offsetof(config, ...) */
    int64_t min, max;
    const char *arg; /* what the value is, for --help */
    const char *help;
} option;

#define FIELD(f) offsetof(config, f)

/* Each option is declared once; parsing and --help both read this table. */
static const option options[] = {
    {"-o", OPT_STR, FIELD(out_path), 0, 0, "OUT", "output GGUF file (required)"},
    {"--seed", OPT_INT, FIELD(seed), 0, INT64_MAX, "N", "random seed (default 42)"},
    {"--layers", OPT_INT, FIELD(n_layer), 1, 256, "N", "transformer blocks (default 4)"},
    {"--d-model", OPT_INT, FIELD(d_model), 1, 16384, "N", "embedding width (default 64)"},
    {"--heads", OPT_INT, FIELD(n_head), 1, 1024, "N", "query heads (default 4)"},
    {"--kv-heads", OPT_INT, FIELD(n_head_kv), 1, 1024, "N",
     "key/value heads, dividing --heads (default 2)"},
    {"--head-dim", OPT_INT, FIELD(head_dim), 2, 1024, "N", "width of one head, even (default 16)"},
    {"--experts", OPT_INT, FIELD(n_expert), 1, 1024, "N", "experts per layer (default 16)"},
    {"--experts-used", OPT_INT, FIELD(n_expert_used), 1, 1024, "N",
     "experts per token, at most --experts (default 4)"},
    {"--ffn", OPT_INT, FIELD(n_ff), 1, 65536, "N", "expert hidden width (default 32)"},
    {"--arch", OPT_STR, FIELD(arch), 0, 0, "qwen3moe|qwen2moe|deepseek2|gpt-oss",
     "architecture (default qwen3moe); qwen2moe has q/k/v biases and a shared expert; "
     "deepseek2 latent attention, leading dense layers and shared experts; gpt-oss attention "
     "biases and sinks, a sliding window on even layers, YaRN RoPE, router and expert biases"},
    {"--shared-ffn", OPT_INT, FIELD(n_ff_shexp), 1, 65536, "N",
     "qwen2moe: the shared expert's hidden width (default 64)"},
    {"--q-lora", OPT_INT, FIELD(q_lora), 0, 65536, "N",
     "deepseek2: q_lora_rank, 0 for wq as V2-Lite (default 0)"},
    {"--kv-lora", OPT_INT, FIELD(kv_lora), 1, 65536, "N", "deepseek2: kv_lora_rank (default 16)"},
    {"--rope-dim", OPT_INT, FIELD(rope_dim), 2, 1024, "N",
     "deepseek2: rotated dims of a head, even, below --head-dim (default 8)"},
    {"--v-head-dim", OPT_INT, FIELD(v_head_dim), 1, 1024, "N",
     "deepseek2: value width of a head (default 16)"},
    {"--dense-lead", OPT_INT, FIELD(dense_lead), 0, 256, "N",
     "deepseek2: leading dense layers, below --layers (default 1)"},
    {"--dense-ffn", OPT_INT, FIELD(dense_ffn), 1, 65536, "N",
     "deepseek2: their FFN width (default 64)"},
    {"--shared-experts", OPT_INT, FIELD(n_shared), 0, 64, "N",
     "deepseek2: shared experts of --ffn width each (default 2)"},
    {"--yarn-factor", OPT_INT, FIELD(yarn_factor), 0, 1024, "N",
     "deepseek2: YaRN scaling factor, 0 for none (default 40)"},
    {"--yarn-orig-ctx", OPT_INT, FIELD(yarn_orig_ctx), 1, 1 << 24, "N",
     "deepseek2: YaRN's original context (default 64)"},
    {"--expert-norm", OPT_FLAG, FIELD(expert_norm), 0, 0, NULL,
     "deepseek2: expert_weights_norm true (renormalised top-k)"},
    {"--groups", OPT_INT, FIELD(n_group), 1, 256, "N",
     "deepseek2: expert_group_count, group-limited routing when > 1 (default: no key)"},
    {"--groups-used", OPT_INT, FIELD(n_group_used), 1, 256, "N",
     "deepseek2: expert_group_used_count (needs --groups)"},
    {"--window", OPT_INT, FIELD(window), 1, 1 << 24, "N",
     "gpt-oss: keys a sliding-window layer attends to (default 128)"},
    {"--ctx", OPT_INT, FIELD(n_ctx), 1, 1 << 24, "N", "trained context length (default 4096)"},
    {"--n-vocab", OPT_INT, FIELD(n_vocab), 1, 1 << 24, "N",
     "vocabulary size (default 256, no tokenizer keys); with --vocab, pad its tokens to N"},
    {"--type", OPT_STR, FIELD(type_name), 0, 0, "f32|f16|bf16",
     "type of the matrices; norms and the router stay f32 (default f32)"},
    {"--experts-type", OPT_STR, FIELD(exps_type_name), 0, 0, "f32|f16|bf16|mxfp4",
     "type of the expert matrices (default: --type); mxfp4 as ggml's reference quantiser "
     "rounds"},
    {"--embd-type", OPT_STR, FIELD(embd_type_name), 0, 0, "f32|f16|bf16",
     "type of token_embd and output.weight (default: --type)"},
    {"--tied", OPT_FLAG, FIELD(tied), 0, 0, NULL, "no output.weight (output tied to token_embd)"},
    {"--vocab", OPT_STR, FIELD(vocab_path), 0, 0, "FILE",
     "copy every tokenizer.* key (and n_vocab) from this GGUF"},
    {"--name", OPT_STR, FIELD(name), 0, 0, "TEXT", "general.name"},
    {"--pre", OPT_STR, FIELD(pre), 0, 0, "NAME",
     "write this tokenizer.ggml.pre instead of the copied one (with --vocab or --extract-vocab)"},
    {"--extract-vocab", OPT_STR, FIELD(extract_path), 0, 0, "IN",
     "instead of a model, write a vocab-only GGUF of IN's tokenizer (uses -o and --name)"},
    {"--help", OPT_FLAG, FIELD(help), 0, 0, NULL, "print this help"},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

static void print_help(FILE *f) {
    fprintf(f, "usage: " PROG " [options] -o OUT\n"
               "Writes a tiny random-weight qwen3moe, qwen2moe, deepseek2 or gpt-oss GGUF laid "
               "out as convert_hf_to_gguf.py writes Qwen3-MoE, Qwen2-MoE, DeepSeek-V2 or "
               "gpt-oss.\n\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", options[i].name, options[i].arg ? " " : "",
                 options[i].arg ? options[i].arg : "");
        fprintf(f, "  %-26s %s\n", left, options[i].help);
    }
}

/* Returns 0, or 1 after printing one line about the first bad argument. */
static int parse_args(int argc, char **argv, config *c, bool seen[N_OPTIONS]) {
    for (int i = 1; i < argc; i++) {
        size_t k = 0;
        while (k < N_OPTIONS && strcmp(argv[i], options[k].name) != 0)
            k++;
        if (k == N_OPTIONS) {
            fprintf(stderr, PROG ": unknown option '%s' (see --help)\n", argv[i]);
            return 1;
        }
        const option *o = &options[k];
        if (seen[k]) {
            fprintf(stderr, PROG ": %s given twice\n", o->name);
            return 1;
        }
        seen[k] = true;
        void *field = (char *)c + o->field;
        if (o->kind == OPT_FLAG) {
            *(int64_t *)field = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, PROG ": %s needs a value (%s)\n", o->name, o->arg);
            return 1;
        }
        const char *value = argv[++i];
        if (o->kind == OPT_STR) {
            if (value[0] == '\0') {
                fprintf(stderr, PROG ": %s needs a non-empty value\n", o->name);
                return 1;
            }
            *(const char **)field = value;
            continue;
        }
        char *end;
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end != '\0' || v < o->min || v > o->max) {
            fprintf(stderr, PROG ": %s '%s' is not an integer in %lld..%lld\n", o->name, value,
                    (long long)o->min, (long long)o->max);
            return 1;
        }
        *(int64_t *)field = v;
    }
    return 0;
}

static bool was_seen(const bool seen[N_OPTIONS], const char *name) {
    for (size_t k = 0; k < N_OPTIONS; k++) {
        if (strcmp(options[k].name, name) == 0) return seen[k];
    }
    NM_ASSERT(!"option not in the table");
    return false;
}

static int parse_type(const char *name, const char *flag, uint32_t *type) {
    if (strcmp(flag, "--experts-type") == 0 && strcmp(name, "mxfp4") == 0)
        *type = NM_DTYPE_MXFP4;
    else if (strcmp(name, "f32") == 0)
        *type = NM_DTYPE_F32;
    else if (strcmp(name, "f16") == 0)
        *type = NM_DTYPE_F16;
    else if (strcmp(name, "bf16") == 0)
        *type = NM_DTYPE_BF16;
    else {
        fprintf(stderr, PROG ": %s '%s' is not one of f32, f16, bf16\n", flag, name);
        return 1;
    }
    return 0;
}

/* Cross-option rules; returns 0 or 1 after printing one line. */
static int check_config(const config *c, const bool seen[N_OPTIONS], uint32_t *type,
                        uint32_t *embd_type, uint32_t *exps_type) {
    if (!c->out_path) {
        fprintf(stderr, PROG ": no output file (-o OUT)\n");
        return 1;
    }
    if (c->extract_path) {
        for (size_t k = 0; k < N_OPTIONS; k++) {
            const char *n = options[k].name;
            if (seen[k] && strcmp(n, "-o") && strcmp(n, "--name") && strcmp(n, "--extract-vocab") &&
                strcmp(n, "--pre")) {
                fprintf(stderr, PROG ": %s has no effect with --extract-vocab\n", n);
                return 1;
            }
        }
        return 0;
    }
    const bool ds2 = strcmp(c->arch, "deepseek2") == 0;
    if (strcmp(c->arch, "qwen3moe") != 0 && strcmp(c->arch, "qwen2moe") != 0 && !ds2 &&
        strcmp(c->arch, "gpt-oss") != 0) {
        fprintf(stderr, PROG ": --arch '%s' is not one of qwen3moe, qwen2moe, deepseek2, gpt-oss\n",
                c->arch);
        return 1;
    }
    static const char *const ds2_only[] = {"--q-lora",         "--kv-lora",     "--rope-dim",
                                           "--v-head-dim",     "--dense-lead",  "--dense-ffn",
                                           "--shared-experts", "--yarn-factor", "--yarn-orig-ctx",
                                           "--expert-norm",    "--groups",      "--groups-used"};
    for (size_t i = 0; !ds2 && i < sizeof ds2_only / sizeof ds2_only[0]; i++)
        if (was_seen(seen, ds2_only[i])) {
            fprintf(stderr, PROG ": %s needs --arch deepseek2\n", ds2_only[i]);
            return 1;
        }
    if (ds2 && (c->rope_dim % 2 != 0 || c->rope_dim >= c->head_dim)) {
        fprintf(stderr, PROG ": --rope-dim %lld must be even and below --head-dim %lld\n",
                (long long)c->rope_dim, (long long)c->head_dim);
        return 1;
    }
    if (ds2 && c->dense_lead >= c->n_layer) {
        fprintf(stderr, PROG ": --dense-lead %lld leaves no MoE layer of --layers %lld\n",
                (long long)c->dense_lead, (long long)c->n_layer);
        return 1;
    }
    if (ds2 && was_seen(seen, "--groups-used") && !was_seen(seen, "--groups")) {
        fprintf(stderr, PROG ": --groups-used needs --groups\n");
        return 1;
    }
    if (ds2 && (c->n_expert % c->n_group != 0 || c->n_group_used > c->n_group ||
                c->n_group_used * (c->n_expert / c->n_group) < c->n_expert_used)) {
        fprintf(stderr,
                PROG ": --groups %lld must divide --experts %lld, and --groups-used %lld "
                     "groups must hold --experts-used experts\n",
                (long long)c->n_group, (long long)c->n_expert, (long long)c->n_group_used);
        return 1;
    }
    if (strcmp(c->arch, "qwen2moe") != 0 && was_seen(seen, "--shared-ffn")) {
        fprintf(stderr, PROG ": --shared-ffn needs --arch qwen2moe\n");
        return 1;
    }
    if (strcmp(c->arch, "gpt-oss") != 0 && was_seen(seen, "--window")) {
        fprintf(stderr, PROG ": --window needs --arch gpt-oss\n");
        return 1;
    }
    if (strcmp(c->arch, "gpt-oss") == 0 && c->tied) {
        fprintf(stderr, PROG ": gpt-oss files always hold output.weight (no --tied)\n");
        return 1;
    }
    if (parse_type(c->type_name, "--type", type) != 0) return 1;
    if (parse_type(c->embd_type_name ? c->embd_type_name : c->type_name, "--embd-type",
                   embd_type) != 0 ||
        parse_type(c->exps_type_name ? c->exps_type_name : c->type_name, "--experts-type",
                   exps_type) != 0)
        return 1;
    if (*exps_type == NM_DTYPE_MXFP4 && (c->d_model % 32 != 0 || c->n_ff % 32 != 0)) {
        fprintf(stderr, PROG ": --experts-type mxfp4 needs --d-model and --ffn multiples of 32\n");
        return 1;
    }
    if (c->n_head % c->n_head_kv != 0) {
        fprintf(stderr, PROG ": --heads %lld is not a multiple of --kv-heads %lld\n",
                (long long)c->n_head, (long long)c->n_head_kv);
        return 1;
    }
    if (c->head_dim % 2 != 0) {
        fprintf(stderr, PROG ": --head-dim %lld is odd; RoPE rotates pairs\n",
                (long long)c->head_dim);
        return 1;
    }
    if (c->n_expert_used > c->n_expert) {
        fprintf(stderr, PROG ": --experts-used %lld exceeds --experts %lld\n",
                (long long)c->n_expert_used, (long long)c->n_expert);
        return 1;
    }
    if (!c->vocab_path && c->pre) {
        fprintf(stderr, PROG ": --pre needs a tokenizer to copy (--vocab)\n");
        return 1;
    }
    return 0;
}

/* ---- deterministic random numbers ------------------------------------------- */

/* xoshiro256** seeded through splitmix64; normals by Box-Muller in
 * Marsaglia's polar form, with a logarithm built from + - * / only, because
 * libm's log may differ in the last bit between machines and the fixture
 * must be the same everywhere. */
typedef nm_rng rng;

static double rng_uniform(rng *r) { return nm_rng_unit(r); }

/* ln(x) for x > 0: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(t), t = (m-1)/(m+1), |t| < 0.172, whose series reaches
 * double precision within 14 terms. */
static double det_log(double x) {
    int e = 0;
    while (x >= 1.4142135623730951) {
        x *= 0.5;
        e++;
    }
    while (x < 0.7071067811865476) {
        x *= 2.0;
        e--;
    }
    double t = (x - 1.0) / (x + 1.0), t2 = t * t, term = t, sum = 0.0;
    for (int k = 0; k < 14; k++) {
        sum += term / (double)(2 * k + 1);
        term *= t2;
    }
    return 2.0 * sum + (double)e * 0.6931471805599453;
}

static double rng_normal(rng *r) {
    for (;;) {
        double u = 2.0 * rng_uniform(r) - 1.0, v = 2.0 * rng_uniform(r) - 1.0;
        double s = u * u + v * v;
        if (s > 0.0 && s < 1.0) return u * sqrt(-2.0 * det_log(s) / s);
    }
}

/* Each tensor draws from its own stream, seeded by the seed and its name,
 * so its values do not depend on what else the model holds. */
static void rng_for(rng *r, uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    nm_rng_seed(r, seed ^ h);
}

/* ---- the model -------------------------------------------------------------- */

typedef enum init_kind {
    INIT_MATRIX,    /* N(0, (0.8/sqrt(fan_in))^2), fan_in = ne[0] */
    INIT_NORM,      /* 1 + 0.1 N(0, 1) */
    INIT_OUTPUT,    /* N(0, (2/sqrt(d))^2): logits of std about 2 */
    INIT_EMBEDDING, /* N(0, 1) + c u on every row, c = EMBD_SHARED sqrt(d) */
    INIT_ROUTER,    /* N(0, 1/d) + b_e u on row e */
    INIT_BIAS,      /* 0.05 N(0, 1) */
    INIT_UNIT,      /* N(0, 1): attention sinks, the router's bias */
    /* 3 N(0, 1): gpt-oss's gate and up biases, wide enough that some
     * inputs of the clamped SwiGLU pass its limit of 7 */
    INIT_BIAS_WIDE,
} init_kind;

/* Token embeddings are a lookup (one input), so N(0, 1) per element, norm
 * about sqrt(d); large next to the attention and expert outputs, so the
 * residual stream stays mostly token-specific, as in trained models. Each
 * also carries c u, c = EMBD_SHARED sqrt(d); after RMSNorm the hidden state's
 * projection on u is about x0 = sqrt(d) c / sqrt(c^2 + d). A router row with
 * b_e u thus adds b_e x0 to expert e's logit, next to a per-token N(0, 1)
 * part from its random row. (These settings reproduce the statistics of the
 * tiny-qwen3moe golden model in shared/vectors.) */
#define EMBD_SHARED 0.5
/* Expert e of popularity rank r gets the logit bias -ZIPF_S ln(1 + r), less
 * its mean over the experts: a log-Zipf profile, so the first few ranks win
 * most top-k contests and the last ones few. */
#define ZIPF_S 1.0

typedef struct gen {
    const config *c;
    uint32_t type;      /* of the matrices */
    uint32_t embd_type; /* of token_embd and output.weight */
    uint32_t exps_type; /* of the expert stacks */
    int64_t n_vocab;
    double *u; /* [d_model], unit length: the direction all embeddings share */
    nm_gguf_writer *w;
} gen;

static nm_status fill(const gen *g, const char *name, init_kind kind, int layer, const int64_t *ne,
                      float *x /* [ne[3]][ne[2]][ne[1]][ne[0]] */) {
    rng r;
    rng_for(&r, (uint64_t)g->c->seed, name);
    int64_t d = g->c->d_model, n = ne[0] * ne[1] * ne[2] * ne[3];
    double std = kind == INIT_OUTPUT      ? 2.0 / sqrt((double)d)
                 : kind == INIT_ROUTER    ? 1.0 / sqrt((double)d)
                 : kind == INIT_EMBEDDING ? 1.0
                 : kind == INIT_UNIT      ? 1.0
                 : kind == INIT_BIAS_WIDE ? 3.0
                                          : 0.8 / sqrt((double)ne[0]);
    for (int64_t i = 0; i < n; i++) {
        double z = rng_normal(&r);
        x[i] = (float)(kind == INIT_NORM ? 1.0 + 0.1 * z : kind == INIT_BIAS ? 0.05 * z : std * z);
    }
    if (kind == INIT_EMBEDDING) {
        double c = EMBD_SHARED * sqrt((double)d);
        for (int64_t row = 0; row < ne[1]; row++) {
            for (int64_t j = 0; j < d; j++)
                x[row * d + j] += (float)(c * g->u[j]);
        }
    }
    if (kind == INIT_ROUTER) {
        /* A popularity order of the experts of this layer, from a stream of
         * its own so every layer ranks them differently. */
        char perm_name[64];
        snprintf(perm_name, sizeof perm_name, "blk.%d.router_rank", layer);
        rng_for(&r, (uint64_t)g->c->seed, perm_name);
        int64_t n_expert = ne[1];
        int64_t *rank = nm_malloc((size_t)n_expert * sizeof *rank); /* [n_expert] */
        if (!rank) return NM_ERR_NOMEM;
        for (int64_t e = 0; e < n_expert; e++)
            rank[e] = e;
        for (int64_t e = n_expert - 1; e > 0; e--) {
            int64_t k = (int64_t)(nm_rng_u64(&r) % (uint64_t)(e + 1));
            int64_t t = rank[e];
            rank[e] = rank[k];
            rank[k] = t;
        }
        double c = EMBD_SHARED * sqrt((double)d),
               x0 = sqrt((double)d) * c / sqrt(c * c + (double)d);
        double mean_bias = 0.0;
        for (int64_t k = 0; k < n_expert; k++)
            mean_bias += -ZIPF_S * det_log(1.0 + (double)k);
        mean_bias /= (double)n_expert;
        for (int64_t e = 0; e < n_expert; e++) {
            double b = (-ZIPF_S * det_log(1.0 + (double)rank[e]) - mean_bias) / x0;
            for (int64_t j = 0; j < d; j++)
                x[e * d + j] += (float)(b * g->u[j]);
        }
        nm_free(rank);
    }
    return NM_OK;
}

/* One tensor: ne ggml-style (ne[0] contiguous), unused dims 1. */
static nm_status add_weight(gen *g, const char *name, uint32_t type, init_kind kind, int layer,
                            uint32_t n_dims, int64_t ne0, int64_t ne1, int64_t ne2) {
    const int64_t ne[4] = {ne0, ne1, ne2, 1};
    size_t n = (size_t)(ne0 * ne1 * ne2), row_bytes;
    NM_ASSERT(nm_dtype_row_bytes(type, ne0, &row_bytes));
    size_t n_bytes = row_bytes * (n / (size_t)ne0);
    float *x = nm_malloc(n * sizeof *x); /* [ne2][ne1][ne0] */
    uint8_t *bytes = nm_malloc(n_bytes); /* the same in `type` */
    nm_status st = x && bytes ? fill(g, name, kind, layer, ne, x) : NM_ERR_NOMEM;
    if (st == NM_OK) {
        if (type == NM_DTYPE_F32) {
            memcpy(bytes, x, n_bytes);
        } else if (type == NM_DTYPE_MXFP4) { /* ggml's reference rounding */
            nm_error err = {0};
            for (size_t row = 0; row < n / (size_t)ne0 && st == NM_OK; row++)
                st = nm_quantize_row(NM_DTYPE_MXFP4, x + row * (size_t)ne0, bytes + row * row_bytes,
                                     ne0, &err);
        } else {
            uint16_t *h = (uint16_t *)bytes;
            for (size_t i = 0; i < n; i++) {
                h[i] = type == NM_DTYPE_F16 ? nm_f32_to_f16(x[i]) : nm_f32_to_bf16(x[i]);
            }
        }
        st = nm_gguf_writer_add_tensor(g->w, name, type, n_dims, ne, bytes, n_bytes);
    }
    nm_free(x);
    nm_free(bytes);
    return st;
}

typedef struct part {
    const char *suffix; /* name without "blk.N." */
    uint32_t type;
    init_kind kind;
    uint32_t n_dims;
    int64_t ne0, ne1, ne2;
    bool on; /* written at all */
} part;

static nm_status add_parts(gen *g, int l, const part *parts, size_t n_parts) {
    nm_status st = NM_OK;
    for (size_t i = 0; i < n_parts && st == NM_OK; i++) {
        if (!parts[i].on) continue;
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", l, parts[i].suffix);
        st = add_weight(g, name, parts[i].type, parts[i].kind, l, parts[i].n_dims, parts[i].ne0,
                        parts[i].ne1, parts[i].ne2);
    }
    return st;
}

/* DeepSeek-V2's blocks after token_embd, then the output: latent attention
 * (wq, or q_a / q_a_norm / q_b with --q-lora), kv_a_mqa giving the latent
 * and k_pe, its norm, kv_b, the output; a dense layer's FFN or the router,
 * the routed experts and the shared ones (one stack --shared-experts x
 * --ffn wide, no gate). */
static nm_status add_deepseek2_layers(gen *g, nm_status st) {
    const config *c = g->c;
    const int64_t d = c->d_model, H = c->n_head, qk = c->head_dim, nope = c->head_dim - c->rope_dim;
    const int64_t E = c->n_expert, ff = c->n_ff, sff = c->n_shared * c->n_ff;
    const uint32_t t = g->type, f32 = NM_DTYPE_F32;
    for (int l = 0; l < c->n_layer && st == NM_OK; l++) {
        const bool dense = l<c->dense_lead, ql = c->q_lora> 0;
        const part parts[] = {
            {"attn_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"attn_q.weight", t, INIT_MATRIX, 2, d, H * qk, 1, !ql},
            {"attn_q_a.weight", t, INIT_MATRIX, 2, d, c->q_lora, 1, ql},
            {"attn_q_a_norm.weight", f32, INIT_NORM, 1, c->q_lora, 1, 1, ql},
            {"attn_q_b.weight", t, INIT_MATRIX, 2, c->q_lora, H * qk, 1, ql},
            {"attn_kv_a_mqa.weight", t, INIT_MATRIX, 2, d, c->kv_lora + c->rope_dim, 1, true},
            {"attn_kv_a_norm.weight", f32, INIT_NORM, 1, c->kv_lora, 1, 1, true},
            {"attn_kv_b.weight", t, INIT_MATRIX, 2, c->kv_lora, H * (nope + c->v_head_dim), 1,
             true},
            {"attn_output.weight", t, INIT_MATRIX, 2, H * c->v_head_dim, d, 1, true},
            {"ffn_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"ffn_gate.weight", t, INIT_MATRIX, 2, d, c->dense_ffn, 1, dense},
            {"ffn_up.weight", t, INIT_MATRIX, 2, d, c->dense_ffn, 1, dense},
            {"ffn_down.weight", t, INIT_MATRIX, 2, c->dense_ffn, d, 1, dense},
            {"ffn_gate_inp.weight", f32, INIT_ROUTER, 2, d, E, 1, !dense},
            {"ffn_gate_exps.weight", t, INIT_MATRIX, 3, d, ff, E, !dense},
            {"ffn_down_exps.weight", t, INIT_MATRIX, 3, ff, d, E, !dense},
            {"ffn_up_exps.weight", t, INIT_MATRIX, 3, d, ff, E, !dense},
            {"ffn_gate_shexp.weight", t, INIT_MATRIX, 2, d, sff, 1, !dense && sff > 0},
            {"ffn_up_shexp.weight", t, INIT_MATRIX, 2, d, sff, 1, !dense && sff > 0},
            {"ffn_down_shexp.weight", t, INIT_MATRIX, 2, sff, d, 1, !dense && sff > 0},
        };
        st = add_parts(g, l, parts, sizeof parts / sizeof parts[0]);
    }
    if (st == NM_OK) st = add_weight(g, "output_norm.weight", f32, INIT_NORM, 0, 1, d, 1, 1);
    if (st == NM_OK && !c->tied)
        st = add_weight(g, "output.weight", g->embd_type, INIT_OUTPUT, 0, 2, d, g->n_vocab, 1);
    return st;
}

static nm_status add_tensors(gen *g) {
    const config *c = g->c;
    int64_t d = c->d_model, q = c->n_head * c->head_dim, kv = c->n_head_kv * c->head_dim;
    int64_t E = c->n_expert, ff = c->n_ff, sff = c->n_ff_shexp;
    uint32_t t = g->type, te = g->exps_type, f32 = NM_DTYPE_F32;
    const bool qwen2 = strcmp(c->arch, "qwen2moe") == 0, ds2 = strcmp(c->arch, "deepseek2") == 0,
               gptoss = strcmp(c->arch, "gpt-oss") == 0;
    nm_status st =
        add_weight(g, "token_embd.weight", g->embd_type, INIT_EMBEDDING, 0, 2, d, g->n_vocab, 1);
    if (ds2) return add_deepseek2_layers(g, st);
    /* The converter's order within a block. */
    for (int l = 0; l < c->n_layer && st == NM_OK; l++) {
        const part qwen3_parts[] = {
            {"attn_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"attn_q.weight", t, INIT_MATRIX, 2, d, q, 1, true},
            {"attn_k.weight", t, INIT_MATRIX, 2, d, kv, 1, true},
            {"attn_v.weight", t, INIT_MATRIX, 2, d, kv, 1, true},
            {"attn_output.weight", t, INIT_MATRIX, 2, q, d, 1, true},
            {"attn_q_norm.weight", f32, INIT_NORM, 1, c->head_dim, 1, 1, true},
            {"attn_k_norm.weight", f32, INIT_NORM, 1, c->head_dim, 1, 1, true},
            {"ffn_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"ffn_gate_inp.weight", f32, INIT_ROUTER, 2, d, E, 1, true},
            {"ffn_gate_exps.weight", te, INIT_MATRIX, 3, d, ff, E, true},
            {"ffn_down_exps.weight", te, INIT_MATRIX, 3, ff, d, E, true},
            {"ffn_up_exps.weight", te, INIT_MATRIX, 3, d, ff, E, true},
        };
        /* Qwen2-MoE: q/k/v biases, no q/k norms, the shared expert and its
         * one-row gate (HF's shared_expert_gate, [1][d], F32 as the converter
         * keeps it) */
        const part qwen2_parts[] = {
            {"attn_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"attn_q.bias", f32, INIT_BIAS, 1, q, 1, 1, true},
            {"attn_q.weight", t, INIT_MATRIX, 2, d, q, 1, true},
            {"attn_k.bias", f32, INIT_BIAS, 1, kv, 1, 1, true},
            {"attn_k.weight", t, INIT_MATRIX, 2, d, kv, 1, true},
            {"attn_v.bias", f32, INIT_BIAS, 1, kv, 1, 1, true},
            {"attn_v.weight", t, INIT_MATRIX, 2, d, kv, 1, true},
            {"attn_output.weight", t, INIT_MATRIX, 2, q, d, 1, true},
            {"ffn_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"ffn_gate_inp.weight", f32, INIT_ROUTER, 2, d, E, 1, true},
            {"ffn_gate_exps.weight", te, INIT_MATRIX, 3, d, ff, E, true},
            {"ffn_down_exps.weight", te, INIT_MATRIX, 3, ff, d, E, true},
            {"ffn_up_exps.weight", te, INIT_MATRIX, 3, d, ff, E, true},
            {"ffn_gate_inp_shexp.weight", f32, INIT_MATRIX, 2, d, 1, 1, true},
            {"ffn_gate_shexp.weight", t, INIT_MATRIX, 2, d, sff, 1, true},
            {"ffn_up_shexp.weight", t, INIT_MATRIX, 2, d, sff, 1, true},
            {"ffn_down_shexp.weight", t, INIT_MATRIX, 2, sff, d, 1, true},
        };
        /* gpt-oss: biases on q/k/v/o, a sink logit per head, the FFN norm
         * named post_attention_norm, the router's bias, the experts' biases
         * ([E][ff] and [E][d]) */
        const part gptoss_parts[] = {
            {"attn_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"attn_q.bias", f32, INIT_BIAS, 1, q, 1, 1, true},
            {"attn_q.weight", t, INIT_MATRIX, 2, d, q, 1, true},
            {"attn_k.bias", f32, INIT_BIAS, 1, kv, 1, 1, true},
            {"attn_k.weight", t, INIT_MATRIX, 2, d, kv, 1, true},
            {"attn_v.bias", f32, INIT_BIAS, 1, kv, 1, 1, true},
            {"attn_v.weight", t, INIT_MATRIX, 2, d, kv, 1, true},
            {"attn_output.bias", f32, INIT_BIAS, 1, d, 1, 1, true},
            {"attn_output.weight", t, INIT_MATRIX, 2, q, d, 1, true},
            {"attn_sinks.weight", f32, INIT_UNIT, 1, c->n_head, 1, 1, true},
            {"post_attention_norm.weight", f32, INIT_NORM, 1, d, 1, 1, true},
            {"ffn_gate_inp.bias", f32, INIT_UNIT, 1, E, 1, 1, true},
            {"ffn_gate_inp.weight", f32, INIT_ROUTER, 2, d, E, 1, true},
            {"ffn_gate_exps.bias", f32, INIT_BIAS_WIDE, 2, ff, E, 1, true},
            {"ffn_gate_exps.weight", te, INIT_MATRIX, 3, d, ff, E, true},
            {"ffn_down_exps.bias", f32, INIT_BIAS, 2, d, E, 1, true},
            {"ffn_down_exps.weight", te, INIT_MATRIX, 3, ff, d, E, true},
            {"ffn_up_exps.bias", f32, INIT_BIAS_WIDE, 2, ff, E, 1, true},
            {"ffn_up_exps.weight", te, INIT_MATRIX, 3, d, ff, E, true},
        };
        const part *parts = qwen2 ? qwen2_parts : gptoss ? gptoss_parts : qwen3_parts;
        const size_t n_parts = qwen2    ? sizeof qwen2_parts / sizeof qwen2_parts[0]
                               : gptoss ? sizeof gptoss_parts / sizeof gptoss_parts[0]
                                        : sizeof qwen3_parts / sizeof qwen3_parts[0];
        st = add_parts(g, l, parts, n_parts);
    }
    if (st == NM_OK) st = add_weight(g, "output_norm.weight", f32, INIT_NORM, 0, 1, d, 1, 1);
    if (st == NM_OK && !c->tied) {
        st = add_weight(g, "output.weight", g->embd_type, INIT_OUTPUT, 0, 2, d, g->n_vocab, 1);
    }
    return st;
}

/* A per-token array of the tokenizer (tokens, token_type, scores) padded
 * from its n0 entries to n: the new tokens are "[PAD<id>]", UNUSED (type 5),
 * score 0, as convert_hf_to_gguf.py pads a vocabulary to the embedding's
 * rows. */
static nm_status set_padded(nm_gguf_writer *w, const char *key, const nm_gguf_value *v, uint64_t n,
                            nm_error *err) {
    const uint64_t n0 = v->v.arr.n;
    const bool tokens = v->v.arr.type == NM_GGUF_STRING,
               types = strcmp(key, "tokenizer.ggml.token_type") == 0;
    if (!tokens && v->v.arr.type != NM_GGUF_INT32 && v->v.arr.type != NM_GGUF_FLOAT32)
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "cannot pad '%s' (element type %d)", key,
                         (int)v->v.arr.type);
    const size_t name_bytes = 24; /* "[PAD16777215]" and then some */
    void *data = nm_malloc((size_t)n * (tokens ? sizeof(nm_gguf_str) : 4));
    char *names = tokens ? nm_malloc((size_t)(n - n0) * name_bytes) : NULL;
    if (!data || (tokens && !names)) {
        nm_free(data);
        nm_free(names);
        return nm_errorf(err, NM_ERR_NOMEM, "out of memory padding '%s'", key);
    }
    for (uint64_t i = 0; i < n; i++) {
        if (tokens) {
            nm_gguf_str *t = (nm_gguf_str *)data + i;
            if (i < n0) {
                *t = nm_gguf_arr_str(v, i);
            } else {
                char *name = names + (i - n0) * name_bytes;
                t->ptr = name;
                t->len = (uint64_t)snprintf(name, name_bytes, "[PAD%llu]", (unsigned long long)i);
            }
        } else if (v->v.arr.type == NM_GGUF_INT32) {
            ((int32_t *)data)[i] = i < n0 ? (int32_t)nm_gguf_arr_i64(v, i) : types ? 5 : 0;
        } else {
            ((float *)data)[i] = i < n0 ? (float)nm_gguf_arr_f64(v, i) : 0.0f;
        }
    }
    const nm_gguf_value padded = {.type = NM_GGUF_ARRAY,
                                  .v.arr = {.type = v->v.arr.type, .n = n, .data = data}};
    nm_status st = nm_gguf_writer_set_value(w, key, &padded);
    nm_free(data);
    nm_free(names);
    return st == NM_OK ? NM_OK : nm_errorf(err, st, "cannot write '%s'", key);
}

/* Copies every tokenizer.* kv of src, in its order; pre, when not NULL,
 * replaces (or adds) tokenizer.ggml.pre; n_vocab > the file's token count
 * pads the per-token arrays to n_vocab. */
static nm_status copy_tokenizer(nm_gguf_writer *w, const nm_gguf *src, const char *pre,
                                uint64_t n_vocab, nm_error *err) {
    static const char prefix[] = "tokenizer.", pre_key[] = "tokenizer.ggml.pre";
    const nm_gguf_value *tokens = nm_gguf_find(src, "tokenizer.ggml.tokens");
    const uint64_t n0 = tokens && tokens->type == NM_GGUF_ARRAY ? tokens->v.arr.n : 0;
    for (uint64_t i = 0; i < nm_gguf_n_kv(src); i++) {
        const nm_gguf_kv *kv = nm_gguf_kv_at(src, i);
        char key[256];
        if (kv->key.len < sizeof prefix - 1 || memcmp(kv->key.ptr, prefix, sizeof prefix - 1))
            continue;
        if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, (size_t)kv->key.len)) {
            return nm_errorf(err, NM_ERR_FORMAT, "tokenizer key %llu is too long or holds a NUL",
                             (unsigned long long)i);
        }
        memcpy(key, kv->key.ptr, (size_t)kv->key.len);
        key[kv->key.len] = '\0';
        if (pre && strcmp(key, pre_key) == 0) continue;
        nm_status st;
        if (n_vocab > n0 && kv->value.type == NM_GGUF_ARRAY && kv->value.v.arr.n == n0) {
            if ((st = set_padded(w, key, &kv->value, n_vocab, err)) != NM_OK) return st;
            continue;
        }
        st = nm_gguf_writer_set_value(w, key, &kv->value);
        if (st != NM_OK) return nm_errorf(err, st, "cannot copy '%s'", key);
    }
    nm_status st = pre ? nm_gguf_writer_set_str(w, pre_key, pre) : NM_OK;
    return st == NM_OK ? NM_OK : nm_errorf(err, st, "cannot write '%s'", pre_key);
}

static nm_gguf_value u32_value(int64_t v) {
    return (nm_gguf_value){.type = NM_GGUF_UINT32, .v.u64 = (uint64_t)v};
}
static nm_gguf_value f32_value(float v) {
    return (nm_gguf_value){.type = NM_GGUF_FLOAT32, .v.f64 = v};
}
static nm_gguf_value str_value(const char *v) {
    return (nm_gguf_value){.type = NM_GGUF_STRING, .v.str = {v, strlen(v)}};
}

static nm_gguf_value bool_value(bool v) { return (nm_gguf_value){.type = NM_GGUF_BOOL, .v.b = v}; }

/* DeepSeek-V2's keys in the order convert_hf_to_gguf.py (Feb 2025) writes
 * them; head_count_kv = head_count as its config has it; the group keys,
 * which that converter does not write, carry the name later llama.cpp
 * gives them. feed_forward_length is the dense layers' width. */
static nm_status set_deepseek2_hparams(gen *g, const char *name) {
    const config *c = g->c;
    int64_t file_type = g->type == NM_DTYPE_F32 ? 0 : g->type == NM_DTYPE_F16 ? 1 : 32;
    const struct {
        const char *key;
        nm_gguf_value value;
        bool on;
    } kvs[] = {
        {"general.architecture", str_value("deepseek2"), true},
        {"general.type", str_value("model"), true},
        {"general.name", str_value(name), true},
        {"deepseek2.block_count", u32_value(c->n_layer), true},
        {"deepseek2.context_length", u32_value(c->n_ctx), true},
        {"deepseek2.embedding_length", u32_value(c->d_model), true},
        {"deepseek2.feed_forward_length", u32_value(c->dense_ffn), true},
        {"deepseek2.attention.head_count", u32_value(c->n_head), true},
        {"deepseek2.attention.head_count_kv", u32_value(c->n_head), true},
        {"deepseek2.rope.freq_base", f32_value(10000.0f), true},
        {"deepseek2.attention.layer_norm_rms_epsilon", f32_value(1e-6f), true},
        {"general.file_type", u32_value(file_type), true},
        {"deepseek2.leading_dense_block_count", u32_value(c->dense_lead), true},
        {"deepseek2.vocab_size", u32_value(g->n_vocab), true},
        {"deepseek2.attention.q_lora_rank", u32_value(c->q_lora), c->q_lora > 0},
        {"deepseek2.attention.kv_lora_rank", u32_value(c->kv_lora), true},
        {"deepseek2.attention.key_length", u32_value(c->head_dim), true},
        {"deepseek2.attention.value_length", u32_value(c->v_head_dim), true},
        {"deepseek2.expert_feed_forward_length", u32_value(c->n_ff), true},
        {"deepseek2.expert_count", u32_value(c->n_expert), true},
        {"deepseek2.expert_shared_count", u32_value(c->n_shared), true},
        {"deepseek2.expert_weights_scale", f32_value(1.5f), true},
        {"deepseek2.expert_weights_norm", bool_value(c->expert_norm != 0), true},
        {"deepseek2.expert_gating_func", u32_value(1), true},
        {"deepseek2.expert_used_count", u32_value(c->n_expert_used), true},
        {"deepseek2.expert_group_count", u32_value(c->n_group), c->n_group > 1},
        {"deepseek2.expert_group_used_count", u32_value(c->n_group_used), c->n_group > 1},
        {"deepseek2.rope.dimension_count", u32_value(c->rope_dim), true},
        {"deepseek2.rope.scaling.type", str_value("yarn"), c->yarn_factor > 0},
        {"deepseek2.rope.scaling.factor", f32_value((float)c->yarn_factor), c->yarn_factor > 0},
        {"deepseek2.rope.scaling.original_context_length", u32_value(c->yarn_orig_ctx),
         c->yarn_factor > 0},
        {"deepseek2.rope.scaling.yarn_log_multiplier", f32_value(0.0707f), c->yarn_factor > 0},
        {"general.quantization_version", u32_value(2), true},
    };
    nm_status st = NM_OK;
    for (size_t i = 0; i < sizeof kvs / sizeof kvs[0] && st == NM_OK; i++)
        if (kvs[i].on) st = nm_gguf_writer_set_value(g->w, kvs[i].key, &kvs[i].value);
    return st;
}

static nm_status set_hparams(gen *g, const char *name) {
    const config *c = g->c;
    const char *arch = c->arch;
    if (strcmp(arch, "deepseek2") == 0) return set_deepseek2_hparams(g, name);
    const bool qwen2 = strcmp(arch, "qwen2moe") == 0, gptoss = strcmp(arch, "gpt-oss") == 0;
    int64_t file_type = g->type == NM_DTYPE_F32 ? 0 : g->type == NM_DTYPE_F16 ? 1 : 32;
    char keys[20][96];
#define KEY(i, suffix) (snprintf(keys[i], sizeof keys[i], "%s." suffix, arch), keys[i])
    /* Keys in the order convert_hf_to_gguf.py writes them for Qwen3-MoE
     * (Qwen2-MoE: no key/value_length, the shared expert's width last).
     * feed_forward_length is the dense FFN width HF configs carry
     * (intermediate_size); MoE layers do not use it: 3 x the expert width.
     * gpt-oss: its window and YaRN (gpt-oss-20b's rope values: base 150000,
     * factor 32 over 4096 positions), eps 1e-5. */
    const struct {
        const char *key;
        nm_gguf_value value;
        bool qwen3_only, qwen2_only, gptoss_only;
    } kvs[] = {
        {"general.architecture", str_value(arch), false, false, false},
        {"general.type", str_value("model"), false, false, false},
        {"general.name", str_value(name), false, false, false},
        {KEY(0, "block_count"), u32_value(c->n_layer), false, false, false},
        {KEY(1, "context_length"), u32_value(c->n_ctx), false, false, false},
        {KEY(2, "embedding_length"), u32_value(c->d_model), false, false, false},
        {KEY(3, "feed_forward_length"), u32_value(3 * c->n_ff), false, false, false},
        {KEY(4, "attention.head_count"), u32_value(c->n_head), false, false, false},
        {KEY(5, "attention.head_count_kv"), u32_value(c->n_head_kv), false, false, false},
        {KEY(6, "rope.freq_base"), f32_value(gptoss ? 150000.0f : 1e6f), false, false, false},
        {KEY(7, "attention.layer_norm_rms_epsilon"), f32_value(gptoss ? 1e-5f : 1e-6f), false,
         false, false},
        {KEY(8, "expert_count"), u32_value(c->n_expert), false, false, false},
        {KEY(9, "expert_used_count"), u32_value(c->n_expert_used), false, false, false},
        {KEY(10, "attention.key_length"), u32_value(c->head_dim), true, false, false},
        {KEY(11, "attention.value_length"), u32_value(c->head_dim), true, false, false},
        {KEY(14, "attention.sliding_window"), u32_value(c->window), false, false, true},
        {KEY(15, "rope.scaling.type"), str_value("yarn"), false, false, true},
        {KEY(16, "rope.scaling.factor"), f32_value(32.0f), false, false, true},
        {KEY(17, "rope.scaling.original_context_length"), u32_value(4096), false, false, true},
        {"general.file_type", u32_value(file_type), false, false, false},
        {KEY(12, "expert_feed_forward_length"), u32_value(c->n_ff), false, false, false},
        {KEY(13, "expert_shared_feed_forward_length"), u32_value(c->n_ff_shexp), false, true,
         false},
        {"general.quantization_version", u32_value(2), false, false, false},
    };
#undef KEY
    nm_status st = NM_OK;
    for (size_t i = 0; i < sizeof kvs / sizeof kvs[0] && st == NM_OK; i++) {
        if ((kvs[i].qwen3_only && qwen2) || (kvs[i].qwen2_only && !qwen2) ||
            (kvs[i].gptoss_only && !gptoss))
            continue;
        st = nm_gguf_writer_set_value(g->w, kvs[i].key, &kvs[i].value);
    }
    return st;
}

static int64_t param_count(const config *c, int64_t n_vocab) {
    int64_t d = c->d_model, q = c->n_head * c->head_dim, kv = c->n_head_kv * c->head_dim;
    if (strcmp(c->arch, "deepseek2") == 0) {
        const int64_t nope = c->head_dim - c->rope_dim;
        const int64_t attn =
            2 * d + (c->q_lora > 0 ? d * c->q_lora + c->q_lora + c->q_lora * q : d * q) +
            d * (c->kv_lora + c->rope_dim) + c->kv_lora +
            c->kv_lora * c->n_head * (nope + c->v_head_dim) + c->n_head * c->v_head_dim * d;
        const int64_t moe = d * c->n_expert + 3 * d * c->n_ff * (c->n_expert + c->n_shared);
        return n_vocab * d * (c->tied ? 1 : 2) + d + c->n_layer * attn +
               c->dense_lead * 3 * d * c->dense_ffn + (c->n_layer - c->dense_lead) * moe;
    }
    int64_t per_layer = 2 * d + d * q + 2 * d * kv + q * d + 2 * c->head_dim + d * c->n_expert +
                        3 * d * c->n_ff * c->n_expert;
    if (strcmp(c->arch, "qwen2moe") == 0) /* biases, shared expert and its gate */
        per_layer += q + 2 * kv + 3 * d * c->n_ff_shexp + d;
    if (strcmp(c->arch, "gpt-oss") == 0) /* biases, sinks, router and expert biases */
        per_layer += q + 2 * kv + d + c->n_head + c->n_expert * (1 + 2 * c->n_ff + d);
    return n_vocab * d * (c->tied ? 1 : 2) + d + c->n_layer * per_layer;
}

/* pad_vocab: --n-vocab was given with --vocab. */
static int make_model(const config *c, uint32_t type, uint32_t embd_type, uint32_t exps_type,
                      bool pad_vocab) {
    nm_error err = {0};
    nm_gguf *vocab = NULL;
    gen g = {.c = c,
             .type = type,
             .embd_type = embd_type,
             .exps_type = exps_type,
             .n_vocab = c->n_vocab};
    if (c->vocab_path) {
        const nm_gguf_value *tokens;
        if (nm_gguf_open(c->vocab_path, &vocab, &err) != NM_OK) {
            fprintf(stderr, PROG ": --vocab: %s\n", err.msg);
            return 1;
        }
        if (nm_gguf_get_arr(vocab, "tokenizer.ggml.tokens", NM_GGUF_STRING, &tokens, &err) !=
            NM_OK) {
            fprintf(stderr, PROG ": --vocab %s: %s\n", c->vocab_path, err.msg);
            nm_gguf_close(vocab);
            return 1;
        }
        if (pad_vocab && c->n_vocab < (int64_t)tokens->v.arr.n) {
            fprintf(stderr, PROG ": --n-vocab %lld is below the %llu tokens of --vocab %s\n",
                    (long long)c->n_vocab, (unsigned long long)tokens->v.arr.n, c->vocab_path);
            nm_gguf_close(vocab);
            return 1;
        }
        g.n_vocab = pad_vocab ? c->n_vocab : (int64_t)tokens->v.arr.n;
    }
    /* The parameter count bounds every product of shapes below. */
    if (param_count(c, g.n_vocab) > MAX_PARAMS) {
        fprintf(stderr, PROG ": %lld parameters is too large for a fixture (at most %lld)\n",
                (long long)param_count(c, g.n_vocab), MAX_PARAMS);
        nm_gguf_close(vocab);
        return 1;
    }
    char name[128];
    snprintf(name, sizeof name, "tiny-%s (random weights, seed %lld)", c->arch, (long long)c->seed);
    g.w = nm_gguf_writer_new();
    g.u = nm_malloc((size_t)c->d_model * sizeof *g.u);
    nm_status st = g.w && g.u ? set_hparams(&g, c->name ? c->name : name) : NM_ERR_NOMEM;
    if (st == NM_OK && vocab) st = copy_tokenizer(g.w, vocab, c->pre, (uint64_t)g.n_vocab, &err);
    if (st == NM_OK) {
        rng r;
        rng_for(&r, (uint64_t)c->seed, "shared_direction");
        double norm2 = 0.0;
        for (int64_t j = 0; j < c->d_model; j++) {
            g.u[j] = rng_normal(&r);
            norm2 += g.u[j] * g.u[j];
        }
        for (int64_t j = 0; j < c->d_model; j++)
            g.u[j] /= sqrt(norm2);
        st = add_tensors(&g);
    }
    if (st == NM_OK) st = nm_gguf_writer_write_file(g.w, c->out_path, &err);
    if (st != NM_OK) {
        fprintf(stderr, PROG ": %s\n", err.msg[0] ? err.msg : nm_status_str(st));
    } else {
        printf(PROG ": wrote %s: %lld layers, d %lld, %lld experts top %lld, n_vocab %lld, %s, "
                    "seed %lld\n",
               c->out_path, (long long)c->n_layer, (long long)c->d_model, (long long)c->n_expert,
               (long long)c->n_expert_used, (long long)g.n_vocab, c->type_name, (long long)c->seed);
    }
    nm_free(g.u);
    nm_gguf_writer_free(g.w);
    nm_gguf_close(vocab);
    return st == NM_OK ? 0 : 1;
}

/* A vocab-only GGUF (no tensors): the source's architecture, a name, and
 * every tokenizer.* key. */
static int extract_vocab(const config *c) {
    nm_error err = {0};
    nm_gguf *src = NULL;
    nm_gguf_str arch;
    if (nm_gguf_open(c->extract_path, &src, &err) != NM_OK) {
        fprintf(stderr, PROG ": --extract-vocab: %s\n", err.msg);
        return 1;
    }
    if (nm_gguf_get_str(src, "general.architecture", &arch, &err) != NM_OK) {
        fprintf(stderr, PROG ": --extract-vocab %s: %s\n", c->extract_path, err.msg);
        nm_gguf_close(src);
        return 1;
    }
    nm_gguf_writer *w = nm_gguf_writer_new();
    nm_gguf_value arch_value = {.type = NM_GGUF_STRING, .v.str = arch};
    char name[160];
    snprintf(name, sizeof name, "%.*s vocab", (int)(arch.len < 64 ? arch.len : 64), arch.ptr);
    nm_status st =
        w ? nm_gguf_writer_set_value(w, "general.architecture", &arch_value) : NM_ERR_NOMEM;
    if (st == NM_OK) st = nm_gguf_writer_set_str(w, "general.name", c->name ? c->name : name);
    if (st == NM_OK) st = copy_tokenizer(w, src, c->pre, 0, &err);
    if (st == NM_OK) st = nm_gguf_writer_write_file(w, c->out_path, &err);
    if (st != NM_OK)
        fprintf(stderr, PROG ": %s\n", err.msg[0] ? err.msg : nm_status_str(st));
    else
        printf(PROG ": wrote %s: the tokenizer of %s\n", c->out_path, c->extract_path);
    nm_gguf_writer_free(w);
    nm_gguf_close(src);
    return st == NM_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    config c = {
        .seed = 42,
        .n_layer = 4,
        .d_model = 64,
        .n_head = 4,
        .n_head_kv = 2,
        .head_dim = 16,
        .n_expert = 16,
        .n_expert_used = 4,
        .n_ff = 32,
        .n_ff_shexp = 64,
        .q_lora = 0,
        .kv_lora = 16,
        .rope_dim = 8,
        .v_head_dim = 16,
        .dense_lead = 1,
        .dense_ffn = 64,
        .n_shared = 2,
        .yarn_factor = 40,
        .yarn_orig_ctx = 64,
        .n_group = 1,
        .n_group_used = 1,
        .window = 128,
        .arch = "qwen3moe",
        .n_ctx = 4096,
        .n_vocab = 256,
        .type_name = "f32",
    };
    bool seen[N_OPTIONS] = {false};
    if (parse_args(argc, argv, &c, seen) != 0) return 1;
    if (c.help) {
        print_help(stdout);
        return 0;
    }
    uint32_t type = NM_DTYPE_F32, embd_type = NM_DTYPE_F32, exps_type = NM_DTYPE_F32;
    if (check_config(&c, seen, &type, &embd_type, &exps_type) != 0) return 1;
    return c.extract_path ? extract_vocab(&c)
                          : make_model(&c, type, embd_type, exps_type, was_seen(seen, "--n-vocab"));
}

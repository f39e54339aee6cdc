/* Option table of the npumoe command. Each option is declared once: its
 * names, value kind, allowed range, the commands that take it and its help
 * text; parsing and --help both read this table. Values out of range are
 * rejected with a message, never clamped. */
#include "options.h"

#include "npumoe.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KIND_STR, KIND_I32, KIND_F32, KIND_U64, KIND_FLAG } value_kind;

typedef struct option_def {
    const char *name; /* long name without dashes */
    char short_name;  /* 0 = none */
    value_kind kind;
    size_t offset;   /* field in cli_options */
    double lo, hi;   /* allowed range of numbers */
    int commands;    /* CMD_* bits */
    const char *arg; /* placeholder in --help */
    const char *help;
} option_def;

#define SCORE (CMD_PERPLEXITY | CMD_COMPARE)
#define OFFLINE (CMD_CALIBRATE | CMD_PROFILE | CMD_PLAN)
#define ALL_MODEL                                                                                  \
    (CMD_INFO | CMD_TOKENIZE | CMD_RUN | CMD_LOGITS | SCORE | OFFLINE | CMD_BENCH | CMD_SERVE)
#define TEXT_IN (CMD_TOKENIZE | CMD_RUN | CMD_LOGITS | SCORE | CMD_CALIBRATE | CMD_BENCH)
#define EVAL (CMD_RUN | CMD_LOGITS | SCORE | CMD_CALIBRATE | CMD_BENCH)
#define STATIC (CMD_RUN | CMD_LOGITS | SCORE | CMD_BENCH)
#define F(field) offsetof(cli_options, field)

static const option_def option_table[] = {
    {"model", 'm', KIND_STR, F(model), 0, 0, ALL_MODEL & ~(CMD_TOKENIZE | CMD_INFO), "FILE",
     "GGUF model file (required)"},
    {"model", 'm', KIND_STR, F(model), 0, 0, CMD_TOKENIZE | CMD_INFO, "FILE",
     "GGUF model file, or a vocabulary-only one (required)"},
    {"model", 'm', KIND_STR, F(model), 0, 0, CMD_QUANTIZE, "FILE",
     "the F32/F16/BF16 GGUF model to convert (required)"},
    {"prompt", 'p', KIND_STR, F(prompt), 0, 0, TEXT_IN & ~CMD_BENCH, "TEXT", "prompt text (UTF-8)"},
    {"n-prompt", 'p', KIND_I32, F(n_prompt), 0, 1 << 20, CMD_BENCH, "N",
     "throughput test: prompt processing of N random tokens (pp N), as llama-bench -p; 0: none"},
    {"n-gen", 'n', KIND_I32, F(n_gen), 0, 1 << 20, CMD_BENCH, "N",
     "throughput test: generation of N tokens one by one (tg N), as llama-bench -n; 0: none"},
    {"file", 'f', KIND_STR, F(file), 0, 0, TEXT_IN, "FILE", "read the prompt from a file"},
    {"tokens", 0, KIND_STR, F(tokens), 0, 0, EVAL, "\"ID ID ...\"",
     "prompt as token ids, space separated"},
    {"n-predict", 'n', KIND_I32, F(n_predict), 0, INT32_MAX, CMD_RUN, "N",
     "tokens to generate (default 128); stops early at end of generation"},
    {"temp", 0, KIND_F32, F(temperature), 0, 100, CMD_RUN, "T",
     "sampling temperature; 0 = greedy (default 0.8)"},
    {"top-k", 0, KIND_I32, F(top_k), 0, INT32_MAX, CMD_RUN, "K",
     "keep the K most likely tokens; 0 = off (default 40)"},
    {"top-p", 0, KIND_F32, F(top_p), 1e-9, 1, CMD_RUN, "P",
     "keep the smallest set with probability >= P; 1 = off (default 0.95)"},
    {"min-p", 0, KIND_F32, F(min_p), 0, 1, CMD_RUN, "P",
     "drop tokens less likely than P times the best; 0 = off (default 0.05)"},
    {"repeat-penalty", 0, KIND_F32, F(repeat_penalty), 1e-6, 100, CMD_RUN, "R",
     "penalise recently seen tokens; 1 = off (default 1)"},
    {"repeat-last-n", 0, KIND_I32, F(repeat_last_n), 0, 1 << 20, CMD_RUN, "N",
     "window of the repeat penalty (default 64)"},
    {"seed", 0, KIND_U64, F(seed), 0, 0, CMD_RUN, "S",
     "sampling seed (default: a random one, printed on stderr)"},
    {"no-display-prompt", 0, KIND_FLAG, F(no_display_prompt), 0, 0, CMD_RUN, NULL,
     "print only the generated text, not the prompt before it"},
    {"threads", 't', KIND_I32, F(threads), 1, 1024, EVAL | CMD_PROFILE | CMD_QUANTIZE | CMD_SERVE,
     "N", "compute threads (default: online CPUs)"},
    {"ctx", 'c', KIND_I32, F(ctx), 1, 1 << 24, (EVAL & ~SCORE & ~CMD_CALIBRATE) | CMD_SERVE, "N",
     "context size in tokens (default: the trained context, at most 4096)"},
    {"ctx", 'c', KIND_I32, F(ctx), 1, 1 << 24, SCORE, "N",
     "window length in tokens (default: the trained context, at most 512)"},
    {"ctx", 'c', KIND_I32, F(ctx), 1, 1 << 24, CMD_CALIBRATE, "N",
     "window length in tokens, whole chunks (default: the trained context, at most 2048)"},
    {"kv-type", 0, KIND_STR, F(kv_type), 0, 0, EVAL | CMD_SERVE, "f32|f16",
     "KV cache element type (default f32; f16 halves its memory)"},
    {"batch", 'b', KIND_I32, F(batch), 1, 1 << 20, EVAL | CMD_SERVE, "N",
     "tokens per prefill step (default 512)"},
    {"output", 'o', KIND_STR, F(output), 0, 0, CMD_LOGITS, "FILE",
     "where the logits go, float32 little-endian (required)"},
    {"dump", 0, KIND_STR, F(dump), 0, 0, CMD_RUN | CMD_LOGITS, "FILE",
     "write every intermediate tensor of every evaluation (each layer's attn_norm ... l_out, "
     "llama.cpp's names) to FILE, a line each: shape, sum, first values"},
    {"output", 'o', KIND_STR, F(output), 0, 0, CMD_CALIBRATE, "FILE",
     "where the calibration JSON goes (required)"},
    {"output", 'o', KIND_STR, F(output), 0, 0, CMD_PROFILE, "FILE",
     "where the device profile JSON goes (required)"},
    {"output", 'o', KIND_STR, F(output), 0, 0, CMD_PLAN, "FILE",
     "where the plan JSON goes (required)"},
    {"output", 'o', KIND_STR, F(output), 0, 0, CMD_BENCH, "PREFIX",
     "also write the report to PREFIX.md, PREFIX.json and PREFIX.svg"},
    {"output", 'o', KIND_STR, F(output), 0, 0, CMD_QUANTIZE, "FILE",
     "where the converted GGUF goes (required)"},
    {"type", 0, KIND_STR, F(quant_type), 0, 0, CMD_QUANTIZE, "TYPE",
     "quantisation: q8_0, q4_0, q4_k, q5_k, q6_k, f16, bf16, f32 (every quantisable tensor), "
     "or the mixes q4_k_m, q5_k_m, q4_k_s, q5_k_s (llama.cpp's); docs/USAGE.md"},
    {"mode", 0, KIND_STR, F(mode), 0, 0, STATIC | CMD_SERVE, "MODE",
     "MoE prefill mode: dense, naive, tiers, grouped, npumoe (default dense; npumoe with --plan)"},
    {"plan", 0, KIND_STR, F(plan), 0, 0, STATIC | CMD_SERVE, "FILE",
     "static plan made by npumoe plan"},
    {"device", 0, KIND_STR, F(device), 0, 0, STATIC | CMD_PROFILE | CMD_SERVE, "NAME",
     "static-graph device: cpu (default), vulkan (the first), vulkan:N (npumoe devices)"},
    {"device-threads", 0, KIND_I32, F(device_threads), 1, 1024, STATIC | CMD_PROFILE | CMD_SERVE,
     "N", "worker threads of the cpu device (default 1)"},
    {"device-budget", 0, KIND_U64, F(device_budget), 0, 0, STATIC | CMD_PROFILE | CMD_SERVE,
     "BYTES", "vulkan: most device memory its graphs may hold (default: its largest heap)"},
    {"chunk", 0, KIND_I32, F(chunk), 1, 1 << 16, STATIC | CMD_SERVE, "T",
     "prefill chunk: tokens per static step (default: the plan's, else 256)"},
    {"chunk", 0, KIND_I32, F(chunk), 1, 1 << 16, CMD_CALIBRATE | CMD_PROFILE, "T",
     "prefill chunk: tokens per static step (default 256)"},
    {"calib", 0, KIND_STR, F(calib), 0, 0, CMD_PLAN, "FILE",
     "calibration made by npumoe calibrate"},
    {"profile", 0, KIND_STR, F(profile), 0, 0, CMD_PLAN, "FILE",
     "device profile made by npumoe profile"},
    {"objective", 0, KIND_STR, F(objective), 0, 0, CMD_PLAN, "budget|quantile",
     "capacities: least expected overflow within a row budget (default), or per-expert quantiles"},
    {"rows", 0, KIND_I32, F(rows), 1, 1 << 30, CMD_PLAN, "N",
     "budget: rows per layer and chunk (default: what the quantile rule would reserve)"},
    {"budget-ms", 0, KIND_F32, F(budget_ms), 1e-6, 1e9, CMD_PLAN, "MS",
     "budget: device time per layer and chunk, at the profile's per-row cost"},
    {"granule", 0, KIND_I32, F(granule), 1, 1 << 16, CMD_PLAN, "N",
     "budget: capacities are multiples of N, a divisor of the chunk (default: the profile's "
     "row granule when above 1, else chunk/16)"},
    {"tiers", 0, KIND_STR, F(tiers), 0, 0, CMD_PLAN, "LIST",
     "quantile: candidate capacities, ascending, comma separated (default: from the chunk)"},
    {"quantile", 0, KIND_F32, F(quantile), 1e-6, 1, CMD_PLAN, "Q",
     "each expert's tier covers this quantile of its per-chunk load (default 0.95)"},
    {"overflow", 0, KIND_STR, F(overflow), 0, 0, CMD_PLAN, "drop|spill",
     "what happens past an expert's capacity (default spill: exact)"},
    {"salience", 0, KIND_STR, F(salience), 0, 0, CMD_PLAN, "POLICY",
     "who keeps a slot on overflow: router, residual-norm, input-norm (default router)"},
    {"dense", 0, KIND_STR, F(dense), 0, 0, CMD_PLAN, "profile|host|device",
     "where npumoe mode runs each layer's attention and router (default profile: the cheaper "
     "side as measured)"},
    {"device-memory", 0, KIND_U64, F(device_memory), 0, 0, CMD_PLAN, "BYTES",
     "device memory budget for resident experts (default unlimited; 0 = none)"},
    {"reps", 'r', KIND_I32, F(reps), 1, 1000, CMD_PROFILE | CMD_BENCH, "N",
     "repetitions per measurement (default 5)"},
    {"lengths", 0, KIND_STR, F(lengths), 0, 0, CMD_BENCH, "LIST",
     "prompt lengths, comma separated (default 512,1024,2048)"},
    {"modes", 0, KIND_STR, F(modes), 0, 0, CMD_BENCH, "LIST",
     "modes to compare (default dense,naive,tiers,grouped,npumoe)"},
    {"grid-experts", 0, KIND_STR, F(grid_experts), 0, 0, CMD_PROFILE, "LIST",
     "experts per graph to measure (default 1,2,4,8,16)"},
    {"grid-capacity", 0, KIND_STR, F(grid_capacity), 0, 0, CMD_PROFILE, "LIST",
     "rows per expert to measure (default 4,8,16,...,chunk)"},
    {"all", 0, KIND_FLAG, F(all), 0, 0, CMD_LOGITS, NULL,
     "logits of every position ([n_positions][n_vocab]), not only the last"},
    {"candidate-model", 0, KIND_STR, F(cand_model), 0, 0, CMD_COMPARE, "FILE",
     "candidate model (same vocabulary, e.g. another weight type; default: -m)"},
    {"candidate-threads", 0, KIND_I32, F(cand_threads), 1, 1024, CMD_COMPARE, "N",
     "candidate's threads (default: -t)"},
    {"candidate-batch", 0, KIND_I32, F(cand_batch), 1, 1 << 20, CMD_COMPARE, "N",
     "candidate's tokens per prefill step (default: -b)"},
    {"json", 0, KIND_FLAG, F(json), 0, 0, CMD_RUN | SCORE | CMD_BENCH, NULL,
     "print one JSON object on stdout instead of text and statistics"},
    {"no-special", 0, KIND_FLAG, F(no_special), 0, 0, TEXT_IN, NULL,
     "treat special-token text such as <|im_start|> as plain text"},
    {"compat", 0, KIND_STR, F(compat), 0, 0, ALL_MODEL & ~CMD_TOKENIZE, "none|llama.cpp",
     "semantics: none = the model as trained (default); llama.cpp = llama.cpp's graph and "
     "numerics (phimoe: RMSNorm+bias and softmax top-k routing; F16 activations)"},
    {"no-repack", 0, KIND_FLAG, F(no_repack), 0, 0, ALL_MODEL & ~CMD_TOKENIZE, NULL,
     "compute from the file's pages as they are, without the load-time copy of the weights "
     "into the kernels' faster layout (Q8_0, Q4_0, K-quants) or, under avx2, of float ones "
     "into huge pages (a faster start, slower prefill and decoding)"},
    {"candidate-compat", 0, KIND_STR, F(cand_compat), 0, 0, CMD_COMPARE, "none|llama.cpp",
     "candidate's semantics (default: --compat); e.g. phimoe as trained vs llama.cpp's"},
    {"chat", 0, KIND_FLAG, F(chat), 0, 0, CMD_RUN, NULL,
     "format the prompt as a user message with the model's chat template (Qwen3, Phi-3.5, "
     "Mixtral, DeepSeek-V2, gpt-oss)"},
    {"chat-template", 0, KIND_STR, F(chat_template), 0, 0, CMD_RUN,
     "chatml|phi3|mistral|deepseek2|harmony",
     "with --chat: use this format instead of recognising the file's template"},
    {"system", 0, KIND_STR, F(system), 0, 0, CMD_RUN, "TEXT", "with --chat: a system message"},
    {"chat-template", 0, KIND_STR, F(chat_template), 0, 0, CMD_SERVE,
     "chatml|phi3|mistral|deepseek2|harmony",
     "the format of /v1/chat/completions' messages (default: the file's template)"},
    {"host", 0, KIND_STR, F(host), 0, 0, CMD_SERVE, "ADDR",
     "address to listen on (default 127.0.0.1); any other than loopback needs --api-key or "
     "--insecure"},
    {"port", 0, KIND_I32, F(port), 0, 65535, CMD_SERVE, "N",
     "TCP port (default 8080; 0 = a free one, printed on stderr)"},
    {"api-key", 0, KIND_STR, F(api_key), 0, 0, CMD_SERVE, "KEY",
     "every route but /health requires the header 'Authorization: Bearer KEY'"},
    {"insecure", 0, KIND_FLAG, F(insecure), 0, 0, CMD_SERVE, NULL,
     "serve a non-loopback --host without --api-key (anyone who reaches it may use it)"},
    {"parallel", 0, KIND_I32, F(parallel), 1, 256, CMD_SERVE, "N",
     "slots: requests generated at once, each with its own KV cache, their decode steps "
     "batched (default 1)"},
    {"queue", 0, KIND_I32, F(queue), 0, 1 << 16, CMD_SERVE, "M",
     "requests that may wait for a slot; more get 503 (default 32)"},
    {"timeout", 0, KIND_I32, F(timeout_s), 1, 86400, CMD_SERVE, "S",
     "seconds a connection may stay silent (a client sending its request slowly is cut off "
     "after it; default 30)"},
    {"max-connections", 0, KIND_I32, F(max_connections), 1, 1 << 16, CMD_SERVE, "N",
     "connections open at once; more wait unanswered until one closes (default 64)"},
    {"help", 'h', KIND_FLAG, F(help), 0, 0, ALL_MODEL | CMD_QUANTIZE | CMD_DEVICES, NULL,
     "show this help"},
};

static const struct {
    const char *name;
    int bit;
    const char *usage;
    const char *summary;
} command_table[] = {
    {"info", CMD_INFO, "info -m MODEL", "architecture, hyperparameters, tensor types and sizes"},
    {"tokenize", CMD_TOKENIZE, "tokenize -m MODEL (-p TEXT | -f FILE)",
     "print the token ids of a text, space separated"},
    {"run", CMD_RUN, "run -m MODEL (-p TEXT | -f FILE | --tokens IDS) [options]",
     "generate text; statistics go to stderr"},
    {"logits", CMD_LOGITS, "logits -m MODEL (-p TEXT | -f FILE | --tokens IDS) -o FILE [--all]",
     "write the logits of a prompt"},
    {"perplexity", CMD_PERPLEXITY, "perplexity -m MODEL -f TEXT [--ctx N] [--batch N] [--json]",
     "perplexity of a text over non-overlapping windows, scoring the second half of each "
     "window (as llama.cpp's llama-perplexity does)"},
    {"compare", CMD_COMPARE,
     "compare -m MODEL -f TEXT [--ctx N] [--candidate-model FILE] [--candidate-threads N] "
     "[--candidate-batch N] [--json]",
     "score a text with a reference and a candidate configuration: perplexity of both, "
     "KL divergence and top-1 agreement of the candidate against the reference"},
    {"calibrate", CMD_CALIBRATE, "calibrate -m MODEL -f TEXT -o CALIB.json [--chunk T] [--ctx N]",
     "record every layer's per-expert load in every prefill chunk of a text"},
    {"profile", CMD_PROFILE, "profile -m MODEL [--device NAME] -o PROFILE.json [--reps N]",
     "measure the device's dispatch+sync latency, grouped-graph times and a layer's dense "
     "part, and the host's cost of the same, with the model's shapes"},
    {"plan", CMD_PLAN,
     "plan -m MODEL --calib CALIB --profile PROFILE [--rows N | --budget-ms MS] [--granule N] "
     "[--objective quantile --tiers LIST --quantile Q] [--overflow drop|spill] [--salience P] "
     "[--dense profile|host|device] [--device-memory BYTES] -o PLAN.json",
     "static capacity tiers, grouped graphs and residency from a calibration and a profile"},
    {"bench", CMD_BENCH,
     "bench -m MODEL --plan PLAN [-f TEXT] [--modes LIST] [--lengths LIST] [-r N] [-o PREFIX]\n"
     "       npumoe bench -m MODEL [-p N] [-n N] [-r N] [-t N] [--json]",
     "TTFT and host CPU time of the prefill modes over prompt lengths (Markdown, JSON, SVG); "
     "with -p/-n, llama-bench-like throughput tests pp N and tg N (median tokens/s)"},
    {"serve", CMD_SERVE,
     "serve -m MODEL [--host ADDR] [--port N] [-c N] [--parallel N] [--queue M] "
     "[--timeout S] [--max-connections N] "
     "[--plan PLAN --device DEV] [--api-key KEY] [--chat-template NAME] [-t N]",
     "an OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions "
     "(streamed with \"stream\": true), GET /v1/models, /health and /metrics (Prometheus); "
     "N slots whose decode steps run as one batch, prefills through the static path with "
     "--plan"},
    {"devices", CMD_DEVICES, "devices",
     "list the static-graph devices this machine can open (cpu, each Vulkan device) with "
     "their memory and float16/int8 support, and why Vulkan cannot be used if it cannot"},
    {"quantize", CMD_QUANTIZE, "quantize -m IN.gguf -o OUT.gguf --type TYPE [-t N]",
     "write a quantised (q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m, q4_k_s, q5_k_s) or "
     "converted (f16, bf16, f32) copy of an F32/F16/BF16 GGUF model, bytes as llama-quantize "
     "makes them"},
};

int cli_command_from_name(const char *name) {
    for (size_t i = 0; i < sizeof command_table / sizeof command_table[0]; i++)
        if (strcmp(name, command_table[i].name) == 0) return command_table[i].bit;
    return 0;
}

static void set_defaults(cli_options *o) {
    memset(o, 0, sizeof *o);
    nm_sampler_params sp = nm_sampler_default_params();
    o->n_predict = 128;
    o->n_prompt = -1; /* bench: -p/-n not given */
    o->n_gen = -1;
    o->temperature = sp.temperature;
    o->top_k = sp.top_k;
    o->top_p = sp.top_p;
    o->min_p = sp.min_p;
    o->repeat_penalty = sp.repeat_penalty;
    o->repeat_last_n = sp.repeat_last_n;
    o->seed = sp.seed;
    o->device_memory = UINT64_MAX; /* unlimited unless given; 0 keeps every expert on the host */
    o->port = 8080;
    o->parallel = 1;
    o->queue = 32;
    o->timeout_s = 30;
    o->max_connections = 64;
}

static bool option_matches(const option_def *d, const char *arg) {
    if (arg[0] == '-' && arg[1] == '-' && strcmp(arg + 2, d->name) == 0) return true;
    return arg[0] == '-' && d->short_name && arg[1] == d->short_name && arg[2] == 0;
}

/* A short name may mean different options in different commands (-p is the
 * prompt text of run, the pp length of bench): the one cmd takes wins. */
static const option_def *find_option(const char *arg, int cmd) {
    const option_def *any = NULL;
    for (size_t i = 0; i < sizeof option_table / sizeof option_table[0]; i++) {
        const option_def *d = &option_table[i];
        if (!option_matches(d, arg)) continue;
        if (d->commands & cmd) return d;
        if (!any) any = d;
    }
    return any;
}

static bool parse_value(const option_def *d, const char *text, cli_options *o, char *msg,
                        size_t cap) {
    char *field = (char *)o + d->offset;
    char *end = NULL;
    errno = 0;
    switch (d->kind) {
    case KIND_STR:
        *(const char **)field = text;
        return true;
    case KIND_I32: {
        long long v = strtoll(text, &end, 10);
        if (errno || end == text || *end || v < (long long)d->lo || v > (long long)d->hi) {
            snprintf(msg, cap, "--%s: '%s' is not an integer in [%.0f, %.0f]", d->name, text, d->lo,
                     d->hi);
            return false;
        }
        *(int32_t *)field = (int32_t)v;
        return true;
    }
    case KIND_F32: {
        double v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v) || v < d->lo || v > d->hi) {
            snprintf(msg, cap, "--%s: '%s' is not a number in [%g, %g]", d->name, text, d->lo,
                     d->hi);
            return false;
        }
        *(float *)field = (float)v;
        return true;
    }
    case KIND_U64: {
        if (text[0] == '-')
            end = (char *)text; /* strtoull would accept and negate */
        else {
            unsigned long long v = strtoull(text, &end, 10);
            /* at most 2^63 - 1: JSON readers (jansson) hold an int64 */
            if (!errno && end != text && !*end && v <= INT64_MAX) {
                *(uint64_t *)field = (uint64_t)v;
                return true;
            }
        }
        snprintf(msg, cap, "--%s: '%s' is not an integer in [0, 2^63 - 1]", d->name, text);
        return false;
    }
    case KIND_FLAG:
        break;
    }
    return false;
}

bool cli_parse(int cmd, int argc, char **argv, int first, cli_options *o, char *msg,
               size_t msg_cap) {
    set_defaults(o);
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        const option_def *d = find_option(arg, cmd);
        if (!d) {
            snprintf(msg, msg_cap, "unknown option '%s' (see --help)", arg);
            return false;
        }
        if (!(d->commands & cmd)) {
            snprintf(msg, msg_cap, "option '%s' does not apply to this command (see --help)", arg);
            return false;
        }
        if (d->kind == KIND_FLAG) {
            *(bool *)((char *)o + d->offset) = true;
            continue;
        }
        if (i + 1 >= argc) {
            snprintf(msg, msg_cap, "option '%s' needs a value (%s)", arg, d->arg);
            return false;
        }
        if (!parse_value(d, argv[++i], o, msg, msg_cap)) return false;
        if (d->offset == F(seed)) o->seed_given = true;
    }
    return true;
}

/* Writes text from column `at` on, wrapped at spaces so that no line passes
 * 80 columns; continuation lines start at column indent. */
static void print_wrapped(FILE *f, const char *text, int at, int indent) {
    enum { WIDTH = 80 };
    int col = at;
    bool line_start = true;
    for (const char *p = text; *p;) {
        if (*p == ' ') {
            p++;
            continue;
        }
        if (*p == '\n') { /* a line break of the text itself */
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            line_start = true;
            p++;
            continue;
        }
        const int word = (int)strcspn(p, " \n");
        if (!line_start && col + 1 + word > WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            line_start = true;
        }
        if (!line_start) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", word, p);
        col += word;
        p += word;
        line_start = false;
    }
    fputc('\n', f);
}

void cli_print_help(FILE *f, int cmd) {
    if (cmd == 0) {
        fprintf(f, "npumoe %s: Mixture-of-Experts inference on GGUF models\n\n", "0.1.0");
        fprintf(f, "usage: npumoe COMMAND [options]   (npumoe COMMAND --help for its options)\n\n");
        for (size_t i = 0; i < sizeof command_table / sizeof command_table[0]; i++) {
            fprintf(f, "  %-10s ", command_table[i].name);
            print_wrapped(f, command_table[i].summary, 13, 13);
        }
        return;
    }
    for (size_t i = 0; i < sizeof command_table / sizeof command_table[0]; i++)
        if (command_table[i].bit == cmd) {
            fprintf(f, "usage: npumoe ");
            print_wrapped(f, command_table[i].usage, 14, 7);
            print_wrapped(f, command_table[i].summary, 0, 0);
            fprintf(f, "\noptions:\n");
        }
    for (size_t i = 0; i < sizeof option_table / sizeof option_table[0]; i++) {
        const option_def *d = &option_table[i];
        if (!(d->commands & cmd)) continue;
        char names[64];
        if (d->short_name)
            snprintf(names, sizeof names, "-%c, --%s %s", d->short_name, d->name,
                     d->arg ? d->arg : "");
        else
            snprintf(names, sizeof names, "    --%s %s", d->name, d->arg ? d->arg : "");
        /* a long name takes its own line; the text starts at column 33 */
        const int len = fprintf(f, "  %s", names);
        if (len > 31)
            fprintf(f, "\n%*s", 32, "");
        else
            fprintf(f, "%*s", 32 - len, "");
        print_wrapped(f, d->help, 32, 32);
    }
}

/* The npumoe command's options: declared once in a table (options.c) from
 * which parsing, validation and --help are all generated. */
#ifndef NM_CLI_OPTIONS_H
#define NM_CLI_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Subcommands, as bits so an option can list those that accept it. */
enum {
    CMD_INFO = 1 << 0,
    CMD_TOKENIZE = 1 << 1,
    CMD_RUN = 1 << 2,
    CMD_LOGITS = 1 << 3,
    CMD_PERPLEXITY = 1 << 4,
    CMD_COMPARE = 1 << 5,
    CMD_CALIBRATE = 1 << 6,
    CMD_PROFILE = 1 << 7,
    CMD_PLAN = 1 << 8,
    CMD_BENCH = 1 << 9,
    CMD_QUANTIZE = 1 << 10,
    CMD_DEVICES = 1 << 11,
    CMD_SERVE = 1 << 12,
};

typedef struct cli_options {
    const char *model;
    const char *prompt;
    const char *file;
    const char *tokens;
    const char *output;
    int32_t n_predict;
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    int32_t repeat_last_n;
    uint64_t seed;
    int32_t threads;
    int32_t ctx;
    int32_t batch;
    const char *cand_model;
    int32_t cand_threads;
    int32_t cand_batch;
    const char *mode;
    const char *plan;
    const char *device;
    int32_t device_threads;
    uint64_t device_budget; /* vulkan: bytes its graphs may hold, 0 = its largest heap */
    int32_t chunk;
    const char *calib;
    const char *profile;
    const char *tiers;
    float quantile;
    const char *objective; /* plan: budget or quantile */
    const char *dense;     /* plan: profile, host or device */
    int32_t rows;          /* plan: rows per layer and chunk */
    float budget_ms;       /* plan: device ms per layer and chunk */
    int32_t granule;       /* plan: capacities are multiples of it */
    const char *overflow;
    const char *salience;
    uint64_t device_memory;
    int32_t reps;
    int32_t n_prompt;    /* bench throughput: pp length, 0 = none, -1 = not given */
    int32_t n_gen;       /* bench throughput: tg length, 0 = none, -1 = not given */
    const char *kv_type; /* --kv-type: "f32", "f16" or NULL (f32) */
    const char *lengths;
    const char *modes;
    const char *grid_experts;
    const char *grid_capacity;
    const char *compat;        /* none | llama.cpp */
    const char *cand_compat;   /* compare: the candidate's semantics (default: --compat) */
    const char *chat_template; /* run --chat: chatml | phi3 | mistral, overriding the file's */
    const char *system;        /* run --chat: the system message */
    const char *quant_type;    /* quantize --type: q8_0, ..., q4_k_m */
    const char *dump;          /* run, logits: --dump FILE, the tap's tensors */
    const char *host;          /* serve: the address to listen on (default 127.0.0.1) */
    int32_t port;              /* serve: the TCP port (default 8080; 0 = any free one) */
    const char *api_key;       /* serve: the key every route but /health requires */
    bool insecure;             /* serve: a non-loopback --host without --api-key */
    int32_t parallel;          /* serve: slots (sessions decoding together) */
    int32_t queue;             /* serve: requests that may wait for a slot */
    int32_t timeout_s;         /* serve: seconds a connection may stay silent */
    int32_t max_connections;   /* serve: connections open at once */
    bool chat;
    bool json;
    bool all;
    bool no_special;
    bool no_repack;
    bool no_display_prompt; /* run: do not echo the prompt */
    bool seed_given;        /* --seed was given (else run draws one and prints it) */
    bool help;
} cli_options;

/* Fills defaults, then parses argv[first..argc) for command cmd. On a bad
 * option or value, writes a one-line message to msg and returns false. */
bool cli_parse(int cmd, int argc, char **argv, int first, cli_options *o, char *msg,
               size_t msg_cap);

/* Usage of one command (cmd != 0) or of the whole program (cmd == 0). */
void cli_print_help(FILE *f, int cmd);

/* Command name <-> bit. */
int cli_command_from_name(const char *name);

#endif /* NM_CLI_OPTIONS_H */

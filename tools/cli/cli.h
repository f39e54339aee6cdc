/* What the subcommands of the npumoe command share. The command is built on
 * the public header alone, as a library user would write it. */
#ifndef NM_CLI_H
#define NM_CLI_H

#include "options.h"

#include "npumoe.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

/* Prints "npumoe: " + the formatted line to stderr; returns 1 (exit status). */
int fail(const char *fmt, const char *a, const char *b);
int fail_err(const nm_error *err);
double now_s(void);
/* User+sys CPU time of the whole process (getrusage: the host pool, the
 * device's threads and a CPU Vulkan driver's included), seconds. */
double cpu_s(void);

/* What a stretch of the command cost: wall time, the process's CPU time,
 * and the CPU packages' energy where RAPL can be read (joules < 0: not
 * available, energy_why says why; never an estimate). */
typedef struct cli_cost {
    double wall_s, cpu_s, joules;
    nm_energy_sample energy0;
    char energy_why[256];
} cli_cost;
void cost_start(cli_cost *u);
void cost_stop(cli_cost *u);
/* "<what> CPU: X ms (getrusage) in Y ms wall" and "energy: X J ..." or
 * "energy: not available (why)". */
void print_cost_text(FILE *f, const char *what, const cli_cost *u);
/* {"wall_ms", "cpu_ms", "energy_j" (null when not available), "energy_note"} */
json_t *cost_json(const cli_cost *u);
/* The MoE metrics of a run: mode, dispatches, graphs, waste, drops, spills,
 * device busy time; JSON adds the per-layer breakdown (NULL when memory ran
 * out). */
void print_metrics_text(FILE *f, const nm_session_metrics *m);
json_t *metrics_json(const nm_session_metrics *m);

/* The command's JSON reports are built and printed by jansson, as the
 * library's files are. json_fixed: v rounded to that many decimals (a
 * measurement's meaningful digits; null when v is not finite); json_text:
 * bytes as a string, those that are not UTF-8 becoming U+FFFD; json_ids:
 * an array of token ids. Each returns NULL when memory runs out, which
 * json_pack's "o" turns into a NULL document. */
json_t *json_fixed(double v, int decimals);
json_t *json_text(const char *s, size_t n);
json_t *json_ids(const int32_t *ids, size_t n);
/* Prints doc and a newline to f (flags: JSON_COMPACT or JSON_INDENT(n)),
 * doubles with 15 significant digits; frees doc. Returns 0, or prints
 * "npumoe: out of memory ..." and returns 1 when doc is NULL or printing
 * failed. */
int print_json(FILE *f, json_t *doc, size_t flags);
char *read_text_file(const char *path, size_t *n_bytes, nm_error *err);
int32_t *parse_token_list(const char *text, int32_t n_vocab, size_t *n_out, nm_error *err);
/* The prompt of -p, -f or --tokens as ids (caller frees). */
int32_t *prompt_ids(const nm_model *model, const cli_options *o, size_t *n_out, nm_error *err);
/* A session with what it uses: a loaded plan and a device it owns. */
typedef struct cli_session {
    nm_session *session;
    nm_plan *plan;
    nm_device *device;
} cli_session;

/* A session with the options' context, batch (or --chunk), threads; with
 * static_path, also --mode, --plan and --device (a plan without --mode
 * means mode npumoe). */
nm_status open_session(nm_model *model, const cli_options *o, bool static_path, cli_session *cs,
                       nm_error *err);
void close_session(cli_session *cs);
/* --dump FILE (dump.c): the session's tap writes each tensor it reports as
 * one line of FILE; dump_start does nothing without a path. dump_finish
 * removes the tap and commits the file when st is NM_OK (else drops it);
 * it returns st, or the commit's failure. */
typedef struct cli_dump {
    nm_outfile out;
    const char *path;
    bool open;
    uint64_t n_tensors;
} cli_dump;
nm_status dump_start(nm_session *session, const char *path, cli_dump *d, nm_error *err);
nm_status dump_finish(nm_session *session, cli_dump *d, nm_status st, nm_error *err);
/* The device of --device (cpu by default) with --device-threads. */
nm_status open_device(const cli_options *o, nm_device **out, nm_error *err);
/* Progress on stderr: on a terminal one line rewritten in place (\r) and
 * the final line kept; else (a file, a pipe, a test) a line every
 * PROGRESS_PERIOD_S seconds at most, and the final one. */
enum { PROGRESS_PERIOD_S = 5 };
typedef struct cli_progress {
    double start_s; /* when progress_start was called */
    double last_s;
    bool tty;
} cli_progress;
void progress_start(cli_progress *p);
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void progress_update(cli_progress *p, bool final, const char *fmt, ...);

/* Says on stderr (once per value) that n_ctx exceeds the model's trained
 * context, as llama.cpp does; open_session calls it for an explicit -c. */
void warn_context(const nm_model *model, int32_t n_ctx);
/* For NM_ERR_CAPACITY (a prompt longer than the context), adds to the
 * message which option gives more room; returns st. */
nm_status name_ctx_option(nm_status st, nm_error *err);
/* --kv-type into *out (NM_KV_F32 when absent). */
nm_status parse_kv_type(const cli_options *o, nm_kv_type *out, nm_error *err);

/* "1,2,4" into out (at most cap values in [lo, hi]); -1 with err->msg set. */
int parse_int_list(const char *text, const char *what, int32_t lo, int32_t hi, int32_t *out,
                   int cap, nm_error *err);

/* Whether models are loaded without the host's repacking: --no-repack, or
 * a --device other than cpu (which reads the file's layout). */
bool cli_no_repack(const cli_options *o);

int cmd_score(nm_model *model, const cli_options *o, bool compare);
/* The plan's predicted overflow (dropped or spilled share of the
 * assignments; with drop, of the routing weight) beside t's measured. */
void print_overflow_prediction(FILE *f, const nm_plan *plan, const nm_moe_layer_metrics *t);
int cmd_calibrate(nm_model *model, const cli_options *o);
int cmd_profile(nm_model *model, const cli_options *o);
int cmd_plan(nm_model *model, const cli_options *o);
int cmd_bench(nm_model *model, const cli_options *o);
/* bench with -p/-n: llama-bench-like pp/tg throughput (throughput.c). */
int cmd_bench_throughput(nm_model *model, const cli_options *o);
/* quantize.c: needs no loaded model (any GGUF file with F32/F16/BF16 tensors). */
int cmd_quantize(const cli_options *o);
/* devices.c */
int cmd_devices(const cli_options *o);
/* serve.c (built when libmicrohttpd and jansson are found: NM_HAVE_SERVE) */
int cmd_serve(nm_model *model, const cli_options *o);

#endif /* NM_CLI_H */

/* Fixtures shared by the plan part's test programs (test_calib,
 * test_plan, test_plan_files): the tiny model and variants of its file,
 * skewed synthetic routing loads and their calibration, synthetic
 * profiles, and plans checked against what every plan must satisfy. */
#ifndef NM_TEST_PLAN_FIXTURES_H
#define NM_TEST_PLAN_FIXTURES_H

#include "harness.h"

#include "model/model.h"
#include "plan/plan.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define TINY NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf"

/* the calibrations' chunk, the tiny model's layers, experts and experts
 * per token; the synthetic calibration's chunks */
enum { T = 16, N_LAYER = 3, N_EXPERT = 8, K = 2, N_CHUNKS = 57 };

/* Whether s contains part. */
bool contains(const char *s, const char *part);

/* A check that err's message contains part. */
#define CHECK_MSG(err, part)                                                                       \
    do {                                                                                           \
        nm_test_checks++;                                                                          \
        if (!contains((err).msg, part)) {                                                          \
            nm_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (err).msg, \
                    part);                                                                         \
        }                                                                                          \
    } while (0)

/* The planner's view of m (nm_model_moe_shape), or none for NULL; each
 * call fills the next of a few slots, so a pointer stays valid for the
 * statement that asked. */
const nm_moe_shape *shape(const nm_model *m);

/* A xorshift draw, from one state for the whole program. */
uint32_t rng(void);

/* The model at path, checked to load. */
nm_model *load_model(const char *path);

/* A copy of the tiny model's file with one change: the first weight of
 * blk.0.ffn_up_exps scaled (data only), or that tensor stored as F16 (a
 * type, as re-quantising changes), or (swap_router) the first two rows of
 * blk.0's router exchanged (the same weights routing to other experts). */
bool write_variant(const char *path, bool to_f16, bool swap_router);

/* Raw per-chunk loads, kept for the brute-force statistics. */
typedef struct raw_loads {
    int32_t loads[N_CHUNKS][N_LAYER][N_EXPERT];
    float w[N_CHUNKS][N_LAYER][N_EXPERT][T]; /* each assignment's weight, in token order */
    int64_t n_tokens;
} raw_loads;

/* Skewed routing: token t of a chunk picks K distinct experts, expert e
 * with weight 2^-(e/2) rotated by layer; chunks hold 1..T tokens, mostly T. */
void make_loads(raw_loads *raw);

/* The calibration of m that records raw's chunks. */
nm_calib *calib_from(const nm_model *m, const raw_loads *raw);

/* graph_ms = dispatch + per_row * n * c over counts {1, 2, 4, 8} x
 * capacities {1, 2, 4, 8, 16}. */
extern nm_profile_point grid_points[20];

/* A profile of the device "synthetic" over grid_points. */
nm_profile make_profile(double dispatch, double per_row);

/* The defaults with the quantile objective. */
nm_plan_params qparams(void);

/* nm_plan_make for m, checked to succeed and to satisfy what every plan
 * must, whatever the inputs. */
nm_plan *make_plan(const nm_model *m, const nm_calib *c, const nm_profile *prof,
                   const nm_plan_params *pp);

#endif

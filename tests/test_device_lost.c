/* A device that fails under the dense part's graphs (graph kind 2) gives
 * one clear error through the public API, never a crash and never results
 * computed from what it left: a device lost at a dense launch in the middle
 * of a prompt (the prompt fails, and so does everything after it that
 * needs the device: the next prompt, a decode step that needs the prompt's
 * K/V, nm_batch_decode); a device that fails copying the prompt's K/V to
 * the host for the first decode step. The failures are injected by a
 * device of this test wrapped around the cpu device; on vulkan (when a
 * driver is here), a memory budget that holds the session's graphs but not
 * the buffer the K/V copy needs fails that copy for real. */
#include "harness.h"

#include "base/base.h"
#include "device/device.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#define TINY NM_VECTORS_DIR "/tiny-qwen3moe/model.gguf"

enum { T = 16, N_PROMPT = 40 };

/* ---- a device that fails when told to ---- */

typedef struct faulty {
    nm_device *inner;
    int launches;    /* dense launches so far */
    int fail_launch; /* the dense launch at which the device is lost; 0: none */
    bool fail_kv_read;
    bool lost;
} faulty;

static faulty F;

static nm_device *inner(const nm_device *dev) { return ((faulty *)dev->ctx)->inner; }

static bool f_supports(const nm_device *dev, uint32_t type, nm_graph_op op) {
    return nm_device_supports(inner(dev), type, op);
}
static nm_status f_compile(nm_device *dev, const nm_ffn_spec *spec, nm_graph **out, nm_error *err) {
    return inner(dev)->ops->compile(inner(dev), spec, out, err);
}
static nm_status f_compile_dense(nm_device *dev, const nm_dense_spec *spec, nm_graph **out,
                                 nm_error *err) {
    return inner(dev)->ops->compile_dense(inner(dev), spec, out, err);
}
static void f_stats(const nm_device *dev, nm_device_stats *out) {
    inner(dev)->ops->stats(inner(dev), out);
}
static void f_free(nm_device *dev) { (void)dev; /* the test closes the inner device */ }
static nm_status f_check(nm_device *dev, nm_error *err) {
    if (F.lost)
        return nm_errorf(err, NM_ERR_IO,
                         "faulty: the device was lost (injected, after %d dense "
                         "launches)",
                         F.launches);
    return nm_device_check(inner(dev), err);
}
/* after the failure, submits return at once (the interface's contract) */
static void f_submit(nm_graph *g) {
    if (!F.lost) F.inner->ops->submit(g);
}
static void f_submit_dense(nm_graph *g, int32_t pos) {
    if (++F.launches == F.fail_launch) F.lost = true;
    if (!F.lost) F.inner->ops->submit_dense(g, pos);
}
static void f_kv_read(nm_graph *g, int32_t pos0, int32_t n, void *k, void *v) {
    if (F.fail_kv_read) F.lost = true;
    if (!F.lost) F.inner->ops->kv_read(g, pos0, n, k, v);
}

static nm_device_ops faulty_ops;
static nm_device faulty_dev = {&faulty_ops, &F};

/* The wrapper around inner, failing at dense launch fail_launch (0: never)
 * or at the first K/V read. */
static nm_device *faulty_new(nm_device *in, int fail_launch, bool fail_kv_read) {
    F = (faulty){.inner = in, .fail_launch = fail_launch, .fail_kv_read = fail_kv_read};
    faulty_ops = *in->ops;
    faulty_ops.name = in->ops->name;
    faulty_ops.supports = f_supports;
    faulty_ops.compile = f_compile;
    faulty_ops.compile_dense = f_compile_dense;
    faulty_ops.stats = f_stats;
    faulty_ops.free = f_free;
    faulty_ops.check = f_check;
    faulty_ops.submit = f_submit;
    faulty_ops.submit_dense = f_submit_dense;
    faulty_ops.kv_read = f_kv_read;
    return &faulty_dev;
}

/* ---- sessions ---- */

static int32_t ids[N_PROMPT];

/* A naive session (every layer's dense part and experts on dev). */
static nm_session *session_on(nm_model *m, nm_device *dev) {
    nm_session *s = nm_test_mode_session(m, T, NM_MODE_NAIVE, NULL, dev);
    CHECK(s != NULL);
    return s;
}

/* st with a message containing part, printed */
static void expect(nm_status got, nm_status want, const nm_error *err, const char *part,
                   const char *what) {
    printf("%s: %s: %s\n", what, nm_status_str(got), err->msg);
    CHECK_INT_EQ(got, want);
    CHECK(strstr(err->msg, part) != NULL);
}

static void test_lost_at_launch(nm_model *m, nm_device *cpu) {
    const int n_layer = m->hp.n_layer;
    /* control: no failure, the prompt and a decode step run */
    nm_device *dev = faulty_new(cpu, 0, false);
    nm_session *s = session_on(m, dev);
    nm_error err = {0};
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (s) {
        CHECK_INT_EQ(nm_session_eval(s, ids, N_PROMPT, logits, false, &err), NM_OK);
        CHECK_INT_EQ(F.launches, 3 * n_layer);
        CHECK_INT_EQ(nm_session_eval(s, ids, 1, logits, false, &err), NM_OK);
    }
    nm_session_free(s);

    /* lost at the second layer's dense launch of the second chunk */
    dev = faulty_new(cpu, n_layer + 2, false);
    s = session_on(m, dev);
    if (s) {
        expect(nm_session_eval(s, ids, N_PROMPT, logits, false, &err), NM_ERR_IO, &err,
               "the device was lost", "lost at a dense launch");
        /* a decode step needs the prompt's K/V, which the device held */
        expect(nm_session_eval(s, ids, 1, logits, false, &err), NM_ERR_IO, &err,
               "the device was lost", "then a decode step");
        nm_batch *batch = NULL;
        CHECK_INT_EQ(nm_batch_new(m, 1, 512, 2, &batch, &err), NM_OK);
        if (batch)
            expect(nm_batch_decode(batch, &s, ids, 1, logits, &err), NM_ERR_IO, &err,
                   "session 0: faulty: the device was lost", "then nm_batch_decode");
        nm_batch_free(batch);
        /* a new prompt on the same device */
        nm_session_reset(s);
        expect(nm_session_eval(s, ids, N_PROMPT, logits, false, &err), NM_ERR_IO, &err,
               "the device was lost", "then a new prompt");
    }
    nm_session_free(s);

    /* the K/V copy to the host fails at the first decode step */
    dev = faulty_new(cpu, 0, true);
    s = session_on(m, dev);
    if (s) {
        CHECK_INT_EQ(nm_session_eval(s, ids, N_PROMPT, logits, false, &err), NM_OK);
        expect(nm_session_eval(s, ids, 1, logits, false, &err), NM_ERR_IO, &err,
               "the device was lost", "lost copying K/V for a decode step");
    }
    nm_session_free(s);
    dev = faulty_new(cpu, 0, true);
    s = session_on(m, dev);
    nm_batch *batch = NULL;
    CHECK_INT_EQ(nm_batch_new(m, 1, 512, 2, &batch, &err), NM_OK);
    if (s && batch) {
        CHECK_INT_EQ(nm_session_eval(s, ids, N_PROMPT, logits, false, &err), NM_OK);
        expect(nm_batch_decode(batch, &s, ids, 1, logits, &err), NM_ERR_IO, &err,
               "session 0: faulty: the device was lost", "lost copying K/V for nm_batch_decode");
    }
    nm_batch_free(batch);
    nm_session_free(s);
    free(logits);
}

/* vulkan with a budget of exactly what the session's graphs hold: the
 * buffer the K/V copy to the host needs does not fit. */
static void test_vulkan_budget(nm_model *m) {
    nm_error err = {0};
    nm_device *dev = NULL;
    nm_device_params dp = {.name = "vulkan", .n_threads = 1};
    if (nm_device_open(&dp, &dev, &err) != NM_OK) {
        printf("vulkan: skipped: %s\n", err.msg);
        CHECK(!getenv("NM_REQUIRE_VULKAN"));
        return;
    }
    nm_session *s = session_on(m, dev);
    nm_device_stats st;
    dev->ops->stats(dev, &st);
    const uint64_t need = st.device_bytes;
    nm_session_free(s);
    nm_device_close(dev);
    CHECK(need > 0);
    dp.memory_budget_bytes = need;
    dev = NULL;
    CHECK_INT_EQ(nm_device_open(&dp, &dev, &err), NM_OK);
    if (!dev) return;
    s = session_on(m, dev);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (s) {
        CHECK_INT_EQ(nm_session_eval(s, ids, N_PROMPT, logits, false, &err), NM_OK);
        const nm_status got = nm_session_eval(s, ids, 1, logits, false, &err);
        printf("vulkan, budget %llu bytes: decode step: %s: %s\n", (unsigned long long)need,
               nm_status_str(got), err.msg);
        CHECK(got == NM_ERR_NOMEM || got == NM_ERR_CAPACITY);
        CHECK(strstr(err.msg, "K/V") && strstr(err.msg, "budget"));
        /* and from then on */
        nm_session_reset(s);
        CHECK(nm_session_eval(s, ids, N_PROMPT, logits, false, &err) == got);
    }
    free(logits);
    nm_session_free(s);
    nm_device_close(dev);
}

int main(void) {
    nm_model *m = NULL;
    nm_error err = {0};
    nm_model_params mp = nm_model_default_params();
    mp.no_repack = true;
    CHECK_INT_EQ(nm_model_load(TINY, &mp, &m, &err), NM_OK);
    if (!m) return nm_test_finish("test_device_lost");
    for (int i = 0; i < N_PROMPT; i++)
        ids[i] = (i * 37 + 11) % m->hp.n_vocab;
    nm_device *cpu = NULL;
    CHECK_INT_EQ(nm_device_open(&(nm_device_params){.name = "cpu", .n_threads = 1}, &cpu, &err),
                 NM_OK);
    if (cpu) test_lost_at_launch(m, cpu);
    nm_device_close(cpu);
    test_vulkan_budget(m);
    nm_model_free(m);
    return nm_test_finish("test_device_lost");
}

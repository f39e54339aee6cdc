/* Sessions over a model (the public nm_session: KV cache, batched prefill,
 * decode), the sampler (nm_sampler) and run metrics. The public API of
 * include/npumoe.h is implemented here and in model/; this header adds what
 * the command needs beyond it. */
#ifndef NM_ENGINE_H
#define NM_ENGINE_H

#include "npumoe.h"

#include <stdint.h>

/* Peak resident memory of the process, in bytes (0 if unknown). */
uint64_t nm_peak_rss_bytes(void);

/* Bytes a session allocated (KV cache and work buffers). */
size_t nm_session_bytes(const nm_session *session);

#endif /* NM_ENGINE_H */

/* The public metadata getter (npumoe.h): any key of the model's file as
 * text, for facts nm_model_info does not carry. */
#include "engine.h"

#include "gguf/gguf.h"
#include "model/model.h"

#include <inttypes.h>
#include <stdio.h>

int32_t nm_model_meta_str(const nm_model *model, const char *key, char *buf, size_t cap) {
    const nm_gguf_value *v = key ? nm_gguf_find(model->gguf, key) : NULL;
    if (!v) return -1;
    char tmp[1];
    if (!buf || cap == 0) { /* only the length is asked for */
        buf = tmp;
        cap = sizeof tmp;
    }
    int n = -1;
    switch (v->type) {
    case NM_GGUF_UINT8:
    case NM_GGUF_UINT16:
    case NM_GGUF_UINT32:
    case NM_GGUF_UINT64:
        n = snprintf(buf, cap, "%" PRIu64, v->v.u64);
        break;
    case NM_GGUF_INT8:
    case NM_GGUF_INT16:
    case NM_GGUF_INT32:
    case NM_GGUF_INT64:
        n = snprintf(buf, cap, "%" PRId64, v->v.i64);
        break;
    case NM_GGUF_FLOAT32:
    case NM_GGUF_FLOAT64:
        n = snprintf(buf, cap, "%.9g", v->v.f64);
        break;
    case NM_GGUF_BOOL:
        n = snprintf(buf, cap, "%s", v->v.b ? "true" : "false");
        break;
    case NM_GGUF_STRING:
        n = v->v.str.len > INT32_MAX ? -1
                                     : snprintf(buf, cap, "%.*s", (int)v->v.str.len, v->v.str.ptr);
        break;
    case NM_GGUF_ARRAY:
        n = snprintf(buf, cap, "[%" PRIu64 " x %s]", v->v.arr.n, nm_gguf_type_name(v->v.arr.type));
        break;
    default:
        break;
    }
    return n < 0 ? -1 : (int32_t)n;
}

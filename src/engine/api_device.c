/* The public kernel functions (npumoe.h): thin wrappers over kernels/, so
 * that a caller does not need its header (devices open in device/device.c). */
#include "engine.h"

#include "base/base.h"
#include "kernels/kernels.h"

nm_status nm_kernels_check_environment(nm_error *err) {
    const char *bad = NULL;
    if (nm_kernels_check_env(&bad)) return NM_OK;
    return nm_errorf(err, NM_ERR_UNSUPPORTED,
                     "NPUMOE_KERNELS='%s' is not a kernel variant this CPU runs (ref, avx2, "
                     "avx512, avx512bf16, avx512vnni, amx, or exact)",
                     bad);
}

const char *nm_kernels_variant(void) { return nm_kernels_isa_name(nm_kernels_active()); }

const char *nm_kernels_variant_why(void) { return nm_kernels_why(); }

int32_t nm_kernels_variant_row_granule(void) { return nm_kernels_row_granule(); }

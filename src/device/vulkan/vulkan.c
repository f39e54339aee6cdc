/* The `vulkan` device: instance, physical device choice, a compute queue,
 * device memory counted against a budget, the shaders' pipelines, and the
 * device list of `npumoe devices`. The graphs themselves are in ffn.c. The
 * loader is opened at run time (dlopen), so every failure (no loader, no
 * driver, no such device) is an error with a message, never a crash and
 * never another device in its place. */
#include "vk-impl.h"

#include "base/base.h"
#include "tensor/tensor.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Staging buffer for uploads: big enough that a layer's weights go in a few
 * copies, small enough to stay out of the budget's way. */
enum { STAGING_BYTES = 16 << 20 };
/* Local workgroup width of the FFN shaders (specialization constant 1). */
enum { WORKGROUP = 64 };

const char *nm_vk_result_name(VkResult r) {
    switch (r) {
    case VK_SUCCESS:
        return "VK_SUCCESS";
    case VK_NOT_READY:
        return "VK_NOT_READY";
    case VK_TIMEOUT:
        return "VK_TIMEOUT";
    case VK_INCOMPLETE:
        return "VK_INCOMPLETE";
    case VK_ERROR_OUT_OF_HOST_MEMORY:
        return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
        return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED:
        return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST:
        return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED:
        return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT:
        return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT:
        return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT:
        return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER:
        return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS:
        return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED:
        return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_FRAGMENTED_POOL:
        return "VK_ERROR_FRAGMENTED_POOL";
    case VK_ERROR_OUT_OF_POOL_MEMORY:
        return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default:
        return "VkResult (other)";
    }
}

nm_status nm_vk_fail(vk_device *d, VkResult r, const char *what, nm_error *err) {
    nm_status st = NM_ERR_UNSUPPORTED;
    const char *hint = "";
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
        st = NM_ERR_NOMEM;
        hint = ": the device is out of memory (a smaller plan or chunk needs less)";
    } else if (r == VK_ERROR_DEVICE_LOST) {
        st = NM_ERR_IO;
        hint = ": the device was lost (driver reset or hang)";
    }
    return nm_errorf(err, st, "%s: %s failed with %s (%d)%s", d->label, what, nm_vk_result_name(r),
                     (int)r, hint);
}

int nm_vk_type_slot(uint32_t type) {
    switch (type) {
    case NM_DTYPE_F32:
        return 0;
    case NM_DTYPE_F16:
        return 1;
    case NM_DTYPE_BF16:
        return 2;
    case NM_DTYPE_Q8_0:
        return 3;
    case NM_DTYPE_Q4_K:
        return 4;
    case NM_DTYPE_MXFP4:
        return 5;
    default:
        return -1;
    }
}

static const uint32_t slot_types[VK_N_TYPES] = {NM_DTYPE_F32,  NM_DTYPE_F16,  NM_DTYPE_BF16,
                                                NM_DTYPE_Q8_0, NM_DTYPE_Q4_K, NM_DTYPE_MXFP4};

/* ---- loader and instance ---- */

/* Opens the loader and an instance into d (label set by the caller). */
static nm_status open_instance(vk_device *d, nm_error *err) {
    d->lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d->lib)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s: the Vulkan loader libvulkan.so.1 cannot be loaded (%s); install it "
                         "and a driver (Debian: libvulkan1 mesa-vulkan-drivers)",
                         d->label, dlerror());
    vk_fns *f = &d->fn;
    /* dlsym returns void *; POSIX guarantees the conversion to a function
     * pointer works, C11 does not spell it, hence the memcpy */
    void *sym = dlsym(d->lib, "vkGetInstanceProcAddr");
    if (!sym)
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "%s: libvulkan.so.1 has no vkGetInstanceProcAddr",
                         d->label);
    memcpy(&f->vkGetInstanceProcAddr, &sym, sizeof sym);
    f->vkCreateInstance = (PFN_vkCreateInstance)f->vkGetInstanceProcAddr(NULL, "vkCreateInstance");
    PFN_vkEnumerateInstanceVersion version_fn =
        (PFN_vkEnumerateInstanceVersion)f->vkGetInstanceProcAddr(NULL,
                                                                 "vkEnumerateInstanceVersion");
    uint32_t version = VK_API_VERSION_1_0;
    if (version_fn) version_fn(&version);
    if (!f->vkCreateInstance || version < VK_API_VERSION_1_1)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s: the Vulkan loader supports Vulkan %u.%u; npumoe needs 1.1", d->label,
                         VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
    const VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "npumoe",
        .pEngineName = "npumoe",
        .apiVersion = VK_API_VERSION_1_2,
    };
    const VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                     .pApplicationInfo = &app};
    VkResult r = f->vkCreateInstance(&ci, NULL, &d->instance);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
        return nm_errorf(err, NM_ERR_UNSUPPORTED,
                         "%s: no Vulkan driver is installed (the loader found no ICD; Debian: "
                         "mesa-vulkan-drivers)",
                         d->label);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreateInstance", err);
#define NM_VK_LOAD(name)                                                                           \
    f->name = (PFN_##name)f->vkGetInstanceProcAddr(d->instance, #name);                            \
    if (!f->name)                                                                                  \
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "%s: the Vulkan loader has no %s", d->label,     \
                         #name);
    NM_VK_INSTANCE_FNS(NM_VK_LOAD)
#undef NM_VK_LOAD
    return NM_OK;
}

static void close_instance(vk_device *d) {
    if (d->instance) d->fn.vkDestroyInstance(d->instance, NULL);
    d->instance = VK_NULL_HANDLE;
    if (d->lib) dlclose(d->lib);
    d->lib = NULL;
}

/* The physical devices, into *out (nm_free it). */
static nm_status physical_devices(vk_device *d, VkPhysicalDevice **out, uint32_t *n,
                                  nm_error *err) {
    *out = NULL;
    *n = 0;
    VkResult r = d->fn.vkEnumeratePhysicalDevices(d->instance, n, NULL);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkEnumeratePhysicalDevices", err);
    if (*n == 0)
        return nm_errorf(err, NM_ERR_NOT_FOUND,
                         "%s: the Vulkan driver reports no device (npumoe devices lists them)",
                         d->label);
    *out = nm_calloc(*n, sizeof **out);
    if (!*out) return nm_errorf(err, NM_ERR_NOMEM, "%s: out of memory", d->label);
    r = d->fn.vkEnumeratePhysicalDevices(d->instance, n, *out);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        nm_free(*out);
        *out = NULL;
        return nm_vk_fail(d, r, "vkEnumeratePhysicalDevices", err);
    }
    return NM_OK;
}

/* Largest device-local heap of p (all heaps if none says device-local). */
static uint64_t local_memory(const VkPhysicalDeviceMemoryProperties *p) {
    uint64_t best = 0, any = 0;
    for (uint32_t i = 0; i < p->memoryHeapCount; i++) {
        const uint64_t size = p->memoryHeaps[i].size;
        if (size > any) any = size;
        if ((p->memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && size > best) best = size;
    }
    return best ? best : any;
}

static void describe(vk_device *d, VkPhysicalDevice p, int index, nm_device_info *info) {
    memset(info, 0, sizeof *info);
    VkPhysicalDeviceDriverProperties drv = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 props = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                         .pNext = &drv};
    d->fn.vkGetPhysicalDeviceProperties2(p, &props);
    VkPhysicalDeviceShaderFloat16Int8Features f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
    VkPhysicalDeviceFeatures2 feats = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                       .pNext = &f16};
    d->fn.vkGetPhysicalDeviceFeatures2(p, &feats);
    VkPhysicalDeviceMemoryProperties mem;
    d->fn.vkGetPhysicalDeviceMemoryProperties(p, &mem);
    snprintf(info->name, sizeof info->name, "vulkan:%d", index);
    snprintf(info->description, sizeof info->description, "%s", props.properties.deviceName);
    const uint32_t v = props.properties.apiVersion;
    /* driver names are short; a long driverInfo is cut (precision 160) */
    snprintf(info->driver, sizeof info->driver, "%.60s %.160s, Vulkan %u.%u.%u", drv.driverName,
             drv.driverInfo, VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v),
             VK_API_VERSION_PATCH(v));
    info->memory_bytes = local_memory(&mem);
    info->float16 = f16.shaderFloat16;
    info->int8 = f16.shaderInt8;
}

int nm_vulkan_list(nm_device_info *out, int cap, char *why, size_t why_bytes) {
    vk_device d;
    memset(&d, 0, sizeof d);
    snprintf(d.label, sizeof d.label, "vulkan");
    nm_error e = {0};
    VkPhysicalDevice *phys = NULL;
    uint32_t n = 0;
    nm_status st = open_instance(&d, &e);
    if (st == NM_OK) st = physical_devices(&d, &phys, &n, &e);
    int written = 0;
    if (st == NM_OK)
        for (uint32_t i = 0; i < n && written < cap; i++)
            describe(&d, phys[i], (int)i, &out[written++]);
    if (why) snprintf(why, why_bytes, "%s", st == NM_OK ? "" : e.msg);
    nm_free(phys);
    close_instance(&d);
    return written;
}

/* ---- memory ---- */

/* A memory type of bits with all of `want`, else one with `fallback`. */
static int memory_type(const vk_device *d, uint32_t bits, VkMemoryPropertyFlags want,
                       VkMemoryPropertyFlags fallback) {
    const VkMemoryPropertyFlags tries[2] = {want, fallback};
    for (int t = 0; t < 2; t++)
        for (uint32_t i = 0; i < d->mem_props.memoryTypeCount; i++)
            if ((bits & (1u << i)) &&
                (d->mem_props.memoryTypes[i].propertyFlags & tries[t]) == tries[t])
                return (int)i;
    return -1;
}

nm_status nm_vk_buffer_new(vk_device *d, VkDeviceSize bytes, VkBufferUsageFlags usage,
                           bool host_visible, const char *what, vk_buffer *out, nm_error *err) {
    memset(out, 0, sizeof *out);
    if (bytes == 0) bytes = 4;
    const VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                   .size = bytes,
                                   .usage = usage,
                                   .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = d->fn.vkCreateBuffer(d->dev, &bi, NULL, &out->buf);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, what, err);
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->dev, out->buf, &req);
    const VkMemoryPropertyFlags want =
        host_visible ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                     : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const VkMemoryPropertyFlags fallback = host_visible ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT : 0;
    const int type = memory_type(d, req.memoryTypeBits, want, fallback);
    nm_status st = NM_OK;
    pthread_mutex_lock(&d->mutex);
    if (type < 0) {
        st = nm_errorf(err, NM_ERR_UNSUPPORTED, "%s: %s: no suitable memory type", d->label, what);
    } else if (req.size > d->budget_bytes - d->used_bytes) {
        st = nm_errorf(err, NM_ERR_CAPACITY,
                       "%s: %s needs %llu bytes of device memory; the budget of %llu bytes has "
                       "%llu left",
                       d->label, what, (unsigned long long)req.size,
                       (unsigned long long)d->budget_bytes,
                       (unsigned long long)(d->budget_bytes - d->used_bytes));
    } else {
        d->used_bytes += req.size; /* reserved before the call: other threads see it */
    }
    pthread_mutex_unlock(&d->mutex);
    if (st) {
        d->fn.vkDestroyBuffer(d->dev, out->buf, NULL);
        out->buf = VK_NULL_HANDLE;
        return st;
    }
    out->bytes = req.size;
    const VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                     .allocationSize = req.size,
                                     .memoryTypeIndex = (uint32_t)type};
    r = d->fn.vkAllocateMemory(d->dev, &ai, NULL, &out->mem);
    if (r == VK_SUCCESS) r = d->fn.vkBindBufferMemory(d->dev, out->buf, out->mem, 0);
    if (r == VK_SUCCESS && host_visible)
        r = d->fn.vkMapMemory(d->dev, out->mem, 0, VK_WHOLE_SIZE, 0, &out->map);
    out->coherent =
        (d->mem_props.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
    if (r != VK_SUCCESS) {
        nm_vk_buffer_free(d, out);
        return nm_vk_fail(d, r, what, err);
    }
    return NM_OK;
}

void nm_vk_buffer_free(vk_device *d, vk_buffer *b) {
    if (b->map) d->fn.vkUnmapMemory(d->dev, b->mem);
    if (b->buf) d->fn.vkDestroyBuffer(d->dev, b->buf, NULL);
    if (b->mem) d->fn.vkFreeMemory(d->dev, b->mem, NULL);
    if (b->bytes) {
        pthread_mutex_lock(&d->mutex);
        d->used_bytes -= b->bytes;
        pthread_mutex_unlock(&d->mutex);
    }
    memset(b, 0, sizeof *b);
}

VkResult nm_vk_command_buffer(vk_device *d, VkCommandBuffer *cb, VkFence *fence) {
    const VkCommandBufferAllocateInfo cai = {.sType =
                                                 VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                             .commandPool = d->cmd_pool,
                                             .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                             .commandBufferCount = 1};
    const VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    pthread_mutex_lock(&d->mutex); /* the command pool is not thread safe */
    VkResult r = d->fn.vkAllocateCommandBuffers(d->dev, &cai, cb);
    pthread_mutex_unlock(&d->mutex);
    if (r == VK_SUCCESS) r = d->fn.vkCreateFence(d->dev, &fi, NULL, fence);
    return r;
}

VkResult nm_vk_timed_command_buffer(vk_device *d, VkCommandBuffer *cb, VkFence *fence,
                                    VkQueryPool *queries) {
    VkResult r = nm_vk_command_buffer(d, cb, fence);
    if (r == VK_SUCCESS && d->timestamps) {
        const VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                          .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                          .queryCount = 2};
        r = d->fn.vkCreateQueryPool(d->dev, &qi, NULL, queries);
    }
    return r;
}

void nm_vk_command_buffer_free(vk_device *d, VkCommandBuffer cb, VkFence fence,
                               VkQueryPool queries) {
    if (queries) d->fn.vkDestroyQueryPool(d->dev, queries, NULL);
    if (fence) d->fn.vkDestroyFence(d->dev, fence, NULL);
    if (cb) {
        pthread_mutex_lock(&d->mutex);
        d->fn.vkFreeCommandBuffers(d->dev, d->cmd_pool, 1, &cb);
        pthread_mutex_unlock(&d->mutex);
    }
}

VkResult nm_vk_timed_begin(vk_device *d, VkCommandBuffer cb, VkQueryPool queries) {
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    const VkResult r = d->fn.vkBeginCommandBuffer(cb, &bi);
    if (r == VK_SUCCESS && queries) {
        d->fn.vkCmdResetQueryPool(cb, queries, 0, 2);
        d->fn.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries, 0);
    }
    return r;
}

VkResult nm_vk_timed_end(vk_device *d, VkCommandBuffer cb, VkQueryPool queries) {
    nm_vk_barrier(d, cb, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    if (queries) d->fn.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, 1);
    return d->fn.vkEndCommandBuffer(cb);
}

void nm_vk_barrier(vk_device *d, VkCommandBuffer cb, VkPipelineStageFlags dst_stage,
                   VkAccessFlags dst_access) {
    const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = dst_access};
    d->fn.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, dst_stage, 0, 1, &mb, 0,
                               NULL, 0, NULL);
}

void nm_vk_sync_mapped(vk_device *d, const vk_buffer *b, bool to_device) {
    if (b->coherent) return;
    const VkMappedMemoryRange range = {
        .sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = b->mem, .size = VK_WHOLE_SIZE};
    if (to_device)
        d->fn.vkFlushMappedMemoryRanges(d->dev, 1, &range);
    else
        d->fn.vkInvalidateMappedMemoryRanges(d->dev, 1, &range);
}

nm_status nm_vk_uploader_begin(vk_device *d, vk_buffer *dst, vk_uploader *u, nm_error *err) {
    memset(u, 0, sizeof *u);
    u->dst = dst;
    /* no bigger than the destination: a small budget is not spent on it */
    u->cap = dst->bytes < STAGING_BYTES ? dst->bytes : STAGING_BYTES;
    nm_status st = nm_vk_buffer_new(d, u->cap, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, true,
                                    "the upload's staging buffer", &u->staging, err);
    if (st) return st;
    const VkResult r = nm_vk_command_buffer(d, &u->cb, &u->fence);
    if (r != VK_SUCCESS) {
        nm_vk_uploader_end(d, u, false, err);
        return nm_vk_fail(d, r, "preparing an upload", err);
    }
    return NM_OK;
}

/* Copies what the staging buffer holds to the destination; blocks. */
static VkResult upload_flush(vk_device *d, vk_uploader *u) {
    if (u->n_regions == 0) return VK_SUCCESS;
    if (!u->staging.coherent) {
        const VkMappedMemoryRange range = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE,
                                           .memory = u->staging.mem,
                                           .size = VK_WHOLE_SIZE};
        d->fn.vkFlushMappedMemoryRanges(d->dev, 1, &range);
    }
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                         .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VkResult r = d->fn.vkBeginCommandBuffer(u->cb, &bi);
    if (r != VK_SUCCESS) return r;
    d->fn.vkCmdCopyBuffer(u->cb, u->staging.buf, u->dst->buf, (uint32_t)u->n_regions, u->regions);
    r = d->fn.vkEndCommandBuffer(u->cb);
    if (r == VK_SUCCESS) r = d->fn.vkResetFences(d->dev, 1, &u->fence);
    if (r == VK_SUCCESS) {
        const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                 .commandBufferCount = 1,
                                 .pCommandBuffers = &u->cb};
        pthread_mutex_lock(&d->mutex);
        r = d->fn.vkQueueSubmit(d->queue, 1, &si, u->fence);
        if (r == VK_SUCCESS) d->stats.syncs++;
        pthread_mutex_unlock(&d->mutex);
    }
    if (r == VK_SUCCESS) r = d->fn.vkWaitForFences(d->dev, 1, &u->fence, VK_TRUE, UINT64_MAX);
    u->n_regions = 0;
    u->used = 0;
    return r;
}

nm_status nm_vk_upload(vk_device *d, vk_uploader *u, VkDeviceSize dst_offset, const void *src,
                       VkDeviceSize bytes, nm_error *err) {
    const uint8_t *p = src;
    while (bytes > 0) {
        if (u->used == u->cap || u->n_regions == VK_UPLOAD_REGIONS) {
            const VkResult r = upload_flush(d, u);
            if (r != VK_SUCCESS) return nm_vk_fail(d, r, "uploading weights", err);
        }
        const VkDeviceSize space = u->cap - u->used;
        const VkDeviceSize n = bytes < space ? bytes : space;
        memcpy((uint8_t *)u->staging.map + u->used, p, (size_t)n);
        u->regions[u->n_regions++] =
            (VkBufferCopy){.srcOffset = u->used, .dstOffset = dst_offset, .size = n};
        u->used += n;
        u->uploaded += n;
        dst_offset += n;
        p += n;
        bytes -= n;
    }
    return NM_OK;
}

nm_status nm_vk_uploader_end(vk_device *d, vk_uploader *u, bool flush, nm_error *err) {
    const VkResult r = flush ? upload_flush(d, u) : VK_SUCCESS;
    if (u->fence) d->fn.vkDestroyFence(d->dev, u->fence, NULL);
    if (u->cb) {
        pthread_mutex_lock(&d->mutex);
        d->fn.vkFreeCommandBuffers(d->dev, d->cmd_pool, 1, &u->cb);
        pthread_mutex_unlock(&d->mutex);
    }
    nm_vk_buffer_free(d, &u->staging);
    const VkDeviceSize uploaded = u->uploaded;
    memset(u, 0, sizeof *u);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "uploading weights", err);
    if (flush) {
        pthread_mutex_lock(&d->mutex);
        d->stats.upload_bytes += uploaded;
        pthread_mutex_unlock(&d->mutex);
    }
    return NM_OK;
}

/* ---- pipelines ---- */

/* *slot, created from module for weights of type slot t when still NULL. */
static nm_status pipeline_of(vk_device *d, VkShaderModule module, int t, VkPipeline *slot,
                             VkPipeline *out, nm_error *err) {
    pthread_mutex_lock(&d->mutex);
    VkResult r = VK_SUCCESS;
    if (!*slot) {
        const uint32_t spec_values[2] = {slot_types[t], WORKGROUP};
        const VkSpecializationMapEntry entries[2] = {
            {.constantID = 0, .offset = 0, .size = 4},
            {.constantID = 1, .offset = 4, .size = 4},
        };
        const VkSpecializationInfo spec = {.mapEntryCount = 2,
                                           .pMapEntries = entries,
                                           .dataSize = sizeof spec_values,
                                           .pData = spec_values};
        const VkComputePipelineCreateInfo ci = {
            .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                      .module = module,
                      .pName = "main",
                      .pSpecializationInfo = &spec},
            .layout = d->pipe_layout,
        };
        r = d->fn.vkCreateComputePipelines(d->dev, VK_NULL_HANDLE, 1, &ci, NULL, slot);
    }
    *out = *slot;
    pthread_mutex_unlock(&d->mutex);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "creating a compute pipeline", err);
    return NM_OK;
}

nm_status nm_vk_pipeline(vk_device *d, int t, int phase, VkPipeline *out, nm_error *err) {
    return pipeline_of(d, phase == 0 ? d->gate_up_module : d->down_module, t,
                       &d->pipelines[t][phase], out, err);
}

nm_status nm_vk_dense_pipeline(vk_device *d, int which, int t, VkPipeline *out, nm_error *err) {
    NM_ASSERT(which >= 0 && which < VK_DENSE_SHADERS);
    if (which == VK_DENSE_MATMUL)
        return pipeline_of(d, d->dense_modules[which], t, &d->dense_matmul[t], out, err);
    return pipeline_of(d, d->dense_modules[which], 0, &d->dense_pipes[which], out, err);
}

/* ---- the device ---- */

static void vk_stats(const nm_device *dev, nm_device_stats *out) {
    vk_device *d = dev->ctx;
    pthread_mutex_lock(&d->mutex);
    *out = d->stats;
    out->device_bytes = d->used_bytes;
    pthread_mutex_unlock(&d->mutex);
}

static nm_status vk_check(nm_device *dev, nm_error *err) {
    vk_device *d = dev->ctx;
    pthread_mutex_lock(&d->mutex);
    const nm_status st = d->lost;
    if (st) nm_errorf(err, st, "%s", d->lost_msg);
    pthread_mutex_unlock(&d->mutex);
    return st;
}

static void vk_free(nm_device *dev) {
    if (!dev) return;
    vk_device *d = dev->ctx;
    NM_ASSERT(d->n_graphs == 0); /* graphs point at their device: free them first */
    if (d->dev) {
        for (int t = 0; t < VK_N_TYPES; t++)
            for (int p = 0; p < 2; p++)
                if (d->pipelines[t][p]) d->fn.vkDestroyPipeline(d->dev, d->pipelines[t][p], NULL);
        for (int t = 0; t < VK_N_TYPES; t++)
            if (d->dense_matmul[t]) d->fn.vkDestroyPipeline(d->dev, d->dense_matmul[t], NULL);
        for (int i = 0; i < VK_DENSE_SHADERS - 1; i++)
            if (d->dense_pipes[i]) d->fn.vkDestroyPipeline(d->dev, d->dense_pipes[i], NULL);
        for (int i = 0; i < VK_DENSE_SHADERS; i++)
            if (d->dense_modules[i]) d->fn.vkDestroyShaderModule(d->dev, d->dense_modules[i], NULL);
        if (d->pipe_layout) d->fn.vkDestroyPipelineLayout(d->dev, d->pipe_layout, NULL);
        if (d->set_layout) d->fn.vkDestroyDescriptorSetLayout(d->dev, d->set_layout, NULL);
        if (d->gate_up_module) d->fn.vkDestroyShaderModule(d->dev, d->gate_up_module, NULL);
        if (d->down_module) d->fn.vkDestroyShaderModule(d->dev, d->down_module, NULL);
        if (d->cmd_pool) d->fn.vkDestroyCommandPool(d->dev, d->cmd_pool, NULL);
        d->fn.vkDestroyDevice(d->dev, NULL);
    }
    close_instance(d);
    pthread_mutex_destroy(&d->mutex);
    nm_free(d);
}

/* The shaders read the types of slot_types as they are; ffn.c and dense.c
 * convert every other type the host computes with to F32 at upload. */
static bool vk_supports(const nm_device *dev, uint32_t weight_type, nm_graph_op op) {
    (void)dev;
    return (op == NM_GRAPH_FFN || op == NM_GRAPH_DENSE) && nm_dtype_is_supported(weight_type);
}

static const nm_device_ops vk_ops = {
    .name = "vulkan",
    .supports = vk_supports,
    /* the experts' biases and gpt-oss's clamped SwiGLU (ffn_gate_up.comp, ffn_down.comp) */
    .ffn_features = NM_FFN_F_BIAS | NM_FFN_F_SWIGLU_OAI,
    .compile = nm_vk_ffn_compile,
    .input = nm_vk_ffn_input,
    .output = nm_vk_ffn_output,
    .submit = nm_vk_ffn_submit,
    .wait = nm_vk_ffn_wait,
    .graph_free = nm_vk_ffn_free,
    .stats = vk_stats,
    .free = vk_free,
    .check = vk_check,
    /* every form but llama.cpp's F16 rounding (dense.c) */
    .dense_features = ((1u << NM_DENSE_F_COUNT) - 1) & ~(uint32_t)NM_DENSE_F_ROUND_F16,
    .compile_dense = nm_vk_dense_compile,
    .submit_dense = nm_vk_dense_submit,
    .dense_outputs = nm_vk_dense_outputs,
    .kv_read = nm_vk_kv_read,
    .kv_write = nm_vk_kv_write,
};

/* The queue, the shaders and the pipeline layout of d->phys. */
static nm_status open_device(vk_device *d, nm_error *err) {
    vk_fns *f = &d->fn;
    VkPhysicalDeviceProperties props;
    f->vkGetPhysicalDeviceProperties(d->phys, &props);
    d->limits = props.limits;
    f->vkGetPhysicalDeviceMemoryProperties(d->phys, &d->mem_props);
    uint32_t n_fam = 0;
    f->vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &n_fam, NULL);
    VkQueueFamilyProperties fams[32];
    if (n_fam > 32) n_fam = 32;
    f->vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &n_fam, fams);
    int fam = -1;
    for (uint32_t i = 0; i < n_fam && fam < 0; i++)
        if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) fam = (int)i;
    if (fam < 0) return nm_errorf(err, NM_ERR_UNSUPPORTED, "%s: no compute queue", d->label);
    d->queue_family = (uint32_t)fam;
    d->timestamps = fams[fam].timestampValidBits > 0 && props.limits.timestampPeriod > 0;
    d->timestamp_period = props.limits.timestampPeriod;

    const float priority = 1.0f;
    const VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                        .queueFamilyIndex = d->queue_family,
                                        .queueCount = 1,
                                        .pQueuePriorities = &priority};
    const VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                   .queueCreateInfoCount = 1,
                                   .pQueueCreateInfos = &qi};
    VkResult r = f->vkCreateDevice(d->phys, &di, NULL, &d->dev);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreateDevice", err);
#define NM_VK_LOAD(name)                                                                           \
    f->name = (PFN_##name)f->vkGetDeviceProcAddr(d->dev, #name);                                   \
    if (!f->name)                                                                                  \
        return nm_errorf(err, NM_ERR_UNSUPPORTED, "%s: the driver has no %s", d->label, #name);
    NM_VK_DEVICE_FNS(NM_VK_LOAD)
#undef NM_VK_LOAD
    f->vkGetDeviceQueue(d->dev, d->queue_family, 0, &d->queue);

    const VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                        .queueFamilyIndex = d->queue_family};
    r = f->vkCreateCommandPool(d->dev, &pi, NULL, &d->cmd_pool);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreateCommandPool", err);
    const VkShaderModuleCreateInfo m0 = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                         .codeSize = nm_vk_spirv_ffn_gate_up_bytes,
                                         .pCode = nm_vk_spirv_ffn_gate_up};
    const VkShaderModuleCreateInfo m1 = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                         .codeSize = nm_vk_spirv_ffn_down_bytes,
                                         .pCode = nm_vk_spirv_ffn_down};
    r = f->vkCreateShaderModule(d->dev, &m0, NULL, &d->gate_up_module);
    if (r == VK_SUCCESS) r = f->vkCreateShaderModule(d->dev, &m1, NULL, &d->down_module);
    const struct {
        const uint32_t *code;
        size_t bytes;
    } dense[VK_DENSE_SHADERS] = {
        [VK_DENSE_NORM] = {nm_vk_spirv_dense_norm, nm_vk_spirv_dense_norm_bytes},
        [VK_DENSE_QK] = {nm_vk_spirv_dense_qk, nm_vk_spirv_dense_qk_bytes},
        [VK_DENSE_ATTN] = {nm_vk_spirv_dense_attn, nm_vk_spirv_dense_attn_bytes},
        [VK_DENSE_SHEXP] = {nm_vk_spirv_dense_shexp, nm_vk_spirv_dense_shexp_bytes},
        [VK_DENSE_MATMUL] = {nm_vk_spirv_dense_matmul, nm_vk_spirv_dense_matmul_bytes},
    };
    for (int i = 0; i < VK_DENSE_SHADERS && r == VK_SUCCESS; i++) {
        const VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                             .codeSize = dense[i].bytes,
                                             .pCode = dense[i].code};
        r = f->vkCreateShaderModule(d->dev, &mi, NULL, &d->dense_modules[i]);
    }
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreateShaderModule", err);
    VkDescriptorSetLayoutBinding b[3];
    for (uint32_t i = 0; i < 3; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    const VkDescriptorSetLayoutCreateInfo li = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .bindingCount = 3,
        .pBindings = b};
    r = f->vkCreateDescriptorSetLayout(d->dev, &li, NULL, &d->set_layout);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreateDescriptorSetLayout", err);
    const VkPushConstantRange push = {
        .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = 32 * sizeof(uint32_t)};
    const VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                            .setLayoutCount = 1,
                                            .pSetLayouts = &d->set_layout,
                                            .pushConstantRangeCount = 1,
                                            .pPushConstantRanges = &push};
    r = f->vkCreatePipelineLayout(d->dev, &pli, NULL, &d->pipe_layout);
    if (r != VK_SUCCESS) return nm_vk_fail(d, r, "vkCreatePipelineLayout", err);
    return NM_OK;
}

nm_status nm_vulkan_device_new(const nm_vulkan_device_params *params, nm_device **out,
                               nm_error *err) {
    *out = NULL;
    if (params->index < 0)
        return nm_errorf(err, NM_ERR_INVALID_ARG, "vulkan device index %d is negative",
                         params->index);
    vk_device *d = nm_calloc(1, sizeof *d);
    if (!d) return nm_errorf(err, NM_ERR_NOMEM, "out of memory for the vulkan device");
    d->base.ops = &vk_ops;
    d->base.ctx = d;
    d->index = params->index;
    pthread_mutex_init(&d->mutex, NULL);
    snprintf(d->label, sizeof d->label, "vulkan:%d", params->index);
    VkPhysicalDevice *phys = NULL;
    uint32_t n = 0;
    nm_status st = open_instance(d, err);
    if (st == NM_OK) st = physical_devices(d, &phys, &n, err);
    if (st == NM_OK && (uint32_t)params->index >= n)
        st = nm_errorf(err, NM_ERR_NOT_FOUND,
                       "vulkan:%d does not exist: this machine has %u Vulkan device%s, "
                       "vulkan:0 to vulkan:%u (npumoe devices lists them)",
                       params->index, n, n == 1 ? "" : "s", n - 1);
    if (st == NM_OK) {
        d->phys = phys[params->index];
        VkPhysicalDeviceProperties props;
        d->fn.vkGetPhysicalDeviceProperties(d->phys, &props);
        snprintf(d->label, sizeof d->label, "vulkan:%d (%s)", params->index, props.deviceName);
        st = open_device(d, err);
    }
    nm_free(phys);
    if (st) {
        vk_free(&d->base);
        return st;
    }
    d->budget_bytes = params->budget_bytes ? params->budget_bytes : local_memory(&d->mem_props);
    *out = &d->base;
    return NM_OK;
}

/* What the files of the vulkan device share: the loader's entry points
 * (resolved at run time, so a binary built with Vulkan runs, and says why it
 * cannot use it, on a machine without a loader or driver), the device
 * context, its memory accounting and its embedded SPIR-V. Not an interface:
 * everything outside src/device/vulkan/ goes through device.h. */
#ifndef NM_VK_IMPL_H
#define NM_VK_IMPL_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include "device/device.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* The entry points the device uses, by level (the X-macro keeps the list
 * in one place: the struct fields and the loading code come from it). */
#define NM_VK_INSTANCE_FNS(X)                                                                      \
    X(vkDestroyInstance)                                                                           \
    X(vkEnumeratePhysicalDevices)                                                                  \
    X(vkGetPhysicalDeviceProperties)                                                               \
    X(vkGetPhysicalDeviceProperties2)                                                              \
    X(vkGetPhysicalDeviceFeatures2)                                                                \
    X(vkGetPhysicalDeviceMemoryProperties)                                                         \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                                    \
    X(vkCreateDevice)                                                                              \
    X(vkGetDeviceProcAddr)
#define NM_VK_DEVICE_FNS(X)                                                                        \
    X(vkDestroyDevice)                                                                             \
    X(vkGetDeviceQueue)                                                                            \
    X(vkCreateBuffer)                                                                              \
    X(vkDestroyBuffer)                                                                             \
    X(vkGetBufferMemoryRequirements)                                                               \
    X(vkAllocateMemory)                                                                            \
    X(vkFreeMemory)                                                                                \
    X(vkBindBufferMemory)                                                                          \
    X(vkMapMemory)                                                                                 \
    X(vkUnmapMemory)                                                                               \
    X(vkFlushMappedMemoryRanges)                                                                   \
    X(vkInvalidateMappedMemoryRanges)                                                              \
    X(vkCreateShaderModule)                                                                        \
    X(vkDestroyShaderModule)                                                                       \
    X(vkCreateDescriptorSetLayout)                                                                 \
    X(vkDestroyDescriptorSetLayout)                                                                \
    X(vkCreatePipelineLayout)                                                                      \
    X(vkDestroyPipelineLayout)                                                                     \
    X(vkCreateComputePipelines)                                                                    \
    X(vkDestroyPipeline)                                                                           \
    X(vkCreateDescriptorPool)                                                                      \
    X(vkDestroyDescriptorPool)                                                                     \
    X(vkAllocateDescriptorSets)                                                                    \
    X(vkUpdateDescriptorSets)                                                                      \
    X(vkCreateCommandPool)                                                                         \
    X(vkDestroyCommandPool)                                                                        \
    X(vkAllocateCommandBuffers)                                                                    \
    X(vkFreeCommandBuffers)                                                                        \
    X(vkBeginCommandBuffer)                                                                        \
    X(vkEndCommandBuffer)                                                                          \
    X(vkCmdBindPipeline)                                                                           \
    X(vkCmdBindDescriptorSets)                                                                     \
    X(vkCmdPushConstants)                                                                          \
    X(vkCmdDispatch)                                                                               \
    X(vkCmdPipelineBarrier)                                                                        \
    X(vkCmdCopyBuffer)                                                                             \
    X(vkCmdResetQueryPool)                                                                         \
    X(vkCmdWriteTimestamp)                                                                         \
    X(vkCreateQueryPool)                                                                           \
    X(vkDestroyQueryPool)                                                                          \
    X(vkGetQueryPoolResults)                                                                       \
    X(vkCreateFence)                                                                               \
    X(vkDestroyFence)                                                                              \
    X(vkResetFences)                                                                               \
    X(vkWaitForFences)                                                                             \
    X(vkQueueSubmit)

typedef struct vk_fns {
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
#define NM_VK_FIELD(name) PFN_##name name;
    NM_VK_INSTANCE_FNS(NM_VK_FIELD)
    NM_VK_DEVICE_FNS(NM_VK_FIELD)
#undef NM_VK_FIELD
} vk_fns;

/* A buffer with its own memory; `map` is set for host-visible ones. */
typedef struct vk_buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize bytes;
    void *map;
    bool coherent;
} vk_buffer;

/* Weight types the shaders read in their own format. */
enum { VK_N_TYPES = 6 };
/* The dense graph's shaders, in the order of vk_device.dense_modules. */
enum {
    VK_DENSE_NORM = 0,
    VK_DENSE_QK = 1,
    VK_DENSE_ATTN = 2,
    VK_DENSE_SHEXP = 3,
    VK_DENSE_MATMUL = 4, /* last: the one with a pipeline per type */
    VK_DENSE_SHADERS = 5
};

typedef struct vk_device {
    nm_device base; /* base.ctx points back here */
    void *lib;      /* the loader, dlopen'ed */
    vk_fns fn;
    VkInstance instance;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    int index;
    char label[320]; /* "vulkan:N (name)", the prefix of every message */
    VkPhysicalDeviceLimits limits;
    VkPhysicalDeviceMemoryProperties mem_props;
    bool timestamps;         /* the queue family has valid timestamp bits */
    double timestamp_period; /* ns per timestamp tick */
    VkShaderModule gate_up_module, down_module;
    /* graph kind 2 (dense.c): the shaders dense_norm, dense_qk, dense_attn,
     * dense_shexp, dense_matmul, the first four's pipelines and the
     * matmul's by type */
    VkShaderModule dense_modules[VK_DENSE_SHADERS];
    VkPipeline dense_pipes[VK_DENSE_SHADERS - 1];
    VkPipeline dense_matmul[VK_N_TYPES];
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout pipe_layout;
    /* [type slot][0 gate_up, 1 down], created on first use */
    VkPipeline pipelines[VK_N_TYPES][2];
    VkCommandPool cmd_pool;

    pthread_mutex_t mutex; /* guards the queue, the pipelines and everything below */
    uint64_t budget_bytes;
    uint64_t used_bytes; /* device memory of live allocations */
    int64_t n_graphs;
    nm_device_stats stats;
    nm_status lost;     /* sticky: the device failed after compile */
    char lost_msg[512]; /* an nm_error message */
} vk_device;

/* ---- vulkan.c ---- */

/* Message text of a VkResult ("VK_ERROR_DEVICE_LOST"). */
const char *nm_vk_result_name(VkResult r);
/* A failed Vulkan call as an nm_status: out of memory is NM_ERR_NOMEM, a
 * lost device NM_ERR_IO, the rest NM_ERR_UNSUPPORTED; the message says
 * which device, what was being done and the VkResult. */
nm_status nm_vk_fail(vk_device *d, VkResult r, const char *what, nm_error *err);
/* Creates a buffer of `bytes` with memory of the given properties (host
 * visible: mapped for the buffer's life), counted against the budget. */
nm_status nm_vk_buffer_new(vk_device *d, VkDeviceSize bytes, VkBufferUsageFlags usage,
                           bool host_visible, const char *what, vk_buffer *out, nm_error *err);
void nm_vk_buffer_free(vk_device *d, vk_buffer *b);
/* A primary command buffer of the device's pool and an unsignalled fence. */
VkResult nm_vk_command_buffer(vk_device *d, VkCommandBuffer *cb, VkFence *fence);
/* The same with a pool of two timestamps when the queue has them (else
 * *queries stays NULL); freed, whatever was made, by
 * nm_vk_command_buffer_free. */
VkResult nm_vk_timed_command_buffer(vk_device *d, VkCommandBuffer *cb, VkFence *fence,
                                    VkQueryPool *queries);
void nm_vk_command_buffer_free(vk_device *d, VkCommandBuffer cb, VkFence fence,
                               VkQueryPool queries);
/* A graph's recording, between these two under the device's mutex: begin
 * starts cb and, with queries, stamps the start (query 0); end makes the
 * compute writes visible to the host, stamps the end (query 1) and ends cb. */
VkResult nm_vk_timed_begin(vk_device *d, VkCommandBuffer cb, VkQueryPool queries);
VkResult nm_vk_timed_end(vk_device *d, VkCommandBuffer cb, VkQueryPool queries);
/* A barrier after compute writes, before dst_stage's dst_access. */
void nm_vk_barrier(vk_device *d, VkCommandBuffer cb, VkPipelineStageFlags dst_stage,
                   VkAccessFlags dst_access);
/* Makes host writes of a mapped buffer visible to the device (to_device)
 * or the device's writes to the host; nothing for coherent memory. */
void nm_vk_sync_mapped(vk_device *d, const vk_buffer *b, bool to_device);
/* Uploads into one device buffer through a staging buffer: begin, any
 * number of nm_vk_upload (each copied into staging at once; the staging
 * buffer goes to the device when full), end (flush: the last copies, and
 * the bytes counted in the stats; false on error paths). */
enum { VK_UPLOAD_REGIONS = 256 };
typedef struct vk_uploader {
    vk_buffer staging;
    vk_buffer *dst;
    VkCommandBuffer cb;
    VkFence fence;
    VkDeviceSize cap;  /* bytes of staging */
    VkDeviceSize used; /* bytes of staging filled */
    VkDeviceSize uploaded;
    int n_regions;
    VkBufferCopy regions[VK_UPLOAD_REGIONS];
} vk_uploader;
nm_status nm_vk_uploader_begin(vk_device *d, vk_buffer *dst, vk_uploader *u, nm_error *err);
nm_status nm_vk_upload(vk_device *d, vk_uploader *u, VkDeviceSize dst_offset, const void *src,
                       VkDeviceSize bytes, nm_error *err);
nm_status nm_vk_uploader_end(vk_device *d, vk_uploader *u, bool flush, nm_error *err);
/* The pipeline of phase (0 gate_up, 1 down) for weights of type slot t. */
nm_status nm_vk_pipeline(vk_device *d, int t, int phase, VkPipeline *out, nm_error *err);
/* The dense graph's pipeline of shader `which` (VK_DENSE_*; the matmul's
 * for weights of type slot t, the others ignore t). */
nm_status nm_vk_dense_pipeline(vk_device *d, int which, int t, VkPipeline *out, nm_error *err);
/* Records the device's failure (the first one wins); under d->mutex. */
void nm_vk_set_lost(vk_device *d, VkResult r, const char *what);
/* Waits for a submitted command buffer's fence and resets it; adds the
 * time it ran (its two timestamps in queries, or else host time since
 * submit_ns) to the stats; a failure marks the device lost. */
void nm_vk_wait_fence(vk_device *d, VkFence fence, VkQueryPool queries, int64_t submit_ns,
                      const char *what);
/* The Vulkan devices of this machine, at most cap, into out (for
 * nm_device_list, which declares it too); why: "" or why there are none. */
int nm_vulkan_list(nm_device_info *out, int cap, char *why, size_t why_bytes);
/* Type slot of an nm_dtype the shaders read, -1 for the others. */
int nm_vk_type_slot(uint32_t type);

/* ---- ffn.c: graph kind 1 ---- */

nm_status nm_vk_ffn_compile(nm_device *dev, const nm_ffn_spec *spec, nm_graph **out, nm_error *err);
float *nm_vk_ffn_input(nm_graph *g);
const float *nm_vk_ffn_output(const nm_graph *g);
void nm_vk_ffn_submit(nm_graph *g);
void nm_vk_ffn_wait(nm_graph *g);
void nm_vk_ffn_free(nm_graph *g);

/* ---- ffn.c: graph kind 2's entry points (the graph struct is ffn.c's) ---- */

nm_status nm_vk_dense_compile(nm_device *dev, const nm_dense_spec *spec, nm_graph **out,
                              nm_error *err);
void nm_vk_dense_submit(nm_graph *g, int32_t pos);
void nm_vk_dense_outputs(const nm_graph *g, nm_dense_outputs *out);
void nm_vk_kv_read(nm_graph *g, int32_t pos0, int32_t n, void *k, void *v);
void nm_vk_kv_write(nm_graph *g, int32_t pos0, int32_t n, const void *k, const void *v);

/* ---- dense.c: the dense graph itself ---- */

typedef struct vk_dense vk_dense;
nm_status nm_vk_dense_new(vk_device *d, const nm_dense_spec *spec, vk_dense **out, nm_error *err);
void nm_vk_dense_free(vk_dense *g);
float *nm_vk_dense_input(vk_dense *g);
void nm_vk_dense_launch(vk_dense *g, int32_t pos);
void nm_vk_dense_wait(vk_dense *g);
void nm_vk_dense_get_outputs(const vk_dense *g, nm_dense_outputs *out);
/* Copies n positions from pos0 of the graph's K/V out (to_graph false)
 * or in; a failure marks the device lost (outputs of a read are zeros). */
void nm_vk_dense_kv(vk_dense *g, int32_t pos0, int32_t n, void *k, void *v, bool to_graph);

/* ---- spirv.c, generated at build time by glslc ---- */

extern const uint32_t nm_vk_spirv_ffn_gate_up[];
extern const size_t nm_vk_spirv_ffn_gate_up_bytes;
extern const uint32_t nm_vk_spirv_ffn_down[];
extern const size_t nm_vk_spirv_ffn_down_bytes;
extern const uint32_t nm_vk_spirv_dense_norm[];
extern const size_t nm_vk_spirv_dense_norm_bytes;
extern const uint32_t nm_vk_spirv_dense_qk[];
extern const size_t nm_vk_spirv_dense_qk_bytes;
extern const uint32_t nm_vk_spirv_dense_attn[];
extern const size_t nm_vk_spirv_dense_attn_bytes;
extern const uint32_t nm_vk_spirv_dense_shexp[];
extern const size_t nm_vk_spirv_dense_shexp_bytes;
extern const uint32_t nm_vk_spirv_dense_matmul[];
extern const size_t nm_vk_spirv_dense_matmul_bytes;

#endif /* NM_VK_IMPL_H */

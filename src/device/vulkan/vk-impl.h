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
enum { VK_N_TYPES = 5 };

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

/* ---- spirv.c, generated at build time by glslc ---- */

extern const uint32_t nm_vk_spirv_ffn_gate_up[];
extern const size_t nm_vk_spirv_ffn_gate_up_bytes;
extern const uint32_t nm_vk_spirv_ffn_down[];
extern const size_t nm_vk_spirv_ffn_down_bytes;

#endif /* NM_VK_IMPL_H */

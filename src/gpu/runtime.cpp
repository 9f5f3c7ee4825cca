// GPU runtime wrappers of src/tiers.h (qg::gpu_*): devices, memory, streams, events.
// Written with HIP names only; hip/compat.h maps them to CUDA under nvcc. Compiled as
// CUDA or HIP (CMakeLists.txt), only in GPU builds.
//
// Status mapping: an allocation failure is QG_ERR_OUT_OF_MEMORY, every other runtime
// error QG_ERR_DEVICE, both with the runtime's own text in qg_last_error().
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "compat.h"
#include "launch_util.h"
#include "tiers.h"

namespace qg {

namespace {

// Records a runtime error as this thread's sentence: "<what>: <runtime text> (<name>)".
qg_status gpu_error(hipError_t err, const char* what) {
    const qg_status st = err == hipErrorMemoryAllocation ? QG_ERR_OUT_OF_MEMORY : QG_ERR_DEVICE;
    return set_error(st, "%s: %s (%s)", what, hipGetErrorString(err), hipGetErrorName(err));
}

#define QG_GPU_TRY(call, what)                           \
    do {                                                 \
        const hipError_t qg_err_ = (call);               \
        if (qg_err_ != hipSuccess) {                     \
            (void)hipGetLastError(); /* clear it */      \
            return gpu_error(qg_err_, what);             \
        }                                                \
    } while (0)

// Runtime calls act on the calling thread's current device: make it the context's.
qg_status use_device(const qg_context* ctx) {
    QG_GPU_TRY(hipSetDevice(ctx->device), "selecting the context's device");
    return QG_OK;
}

hipMemcpyKind memcpy_kind(qg_copy_kind kind) {
    switch (kind) {
        case QG_COPY_HOST_TO_HOST: return hipMemcpyHostToHost;
        case QG_COPY_HOST_TO_DEVICE: return hipMemcpyHostToDevice;
        case QG_COPY_DEVICE_TO_HOST: return hipMemcpyDeviceToHost;
        case QG_COPY_DEVICE_TO_DEVICE: return hipMemcpyDeviceToDevice;
    }
    return hipMemcpyDefault;
}

inline hipStream_t as_stream(qg_stream s) { return reinterpret_cast<hipStream_t>(s); }
inline hipEvent_t as_event(void* e) { return reinterpret_cast<hipEvent_t>(e); }

}  // namespace

qg_status gpu_device_count(int* count) {
    int n = 0;
    const hipError_t err = hipGetDeviceCount(&n);
    if (err != hipSuccess) {
        // no driver, a driver older than the runtime, or no device: the caller reports 0
        (void)hipGetLastError();
        *count = 0;
        return set_error(QG_ERR_DEVICE, "%s (%s)", hipGetErrorString(err), hipGetErrorName(err));
    }
    *count = n;
    return QG_OK;
}

qg_status gpu_context_init(qg_context* ctx) {
    if (qg_status st = use_device(ctx)) return st;
    hipDeviceProp_t prop;
    memset(&prop, 0, sizeof(prop));
    QG_GPU_TRY(hipGetDeviceProperties(&prop, ctx->device), "reading the device properties");
    ctx->sm_count = prop.multiProcessorCount;
    ctx->cc_major = prop.major;
    ctx->cc_minor = prop.minor;
    ctx->l2_bytes = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : 0;
    snprintf(ctx->name, sizeof(ctx->name), "%s", prop.name);
    return QG_OK;
}

qg_status gpu_malloc(const qg_context* ctx, size_t bytes, void** ptr) {
    if (qg_status st = use_device(ctx)) return st;
    void* p = nullptr;
    const hipError_t err = hipMalloc(&p, bytes);
    if (err != hipSuccess) {
        (void)hipGetLastError();
        char what[96];
        snprintf(what, sizeof(what), "allocating %zu bytes of device memory", bytes);
        return gpu_error(err, what);
    }
    *ptr = p;
    return QG_OK;
}

qg_status gpu_free(const qg_context* ctx, void* ptr) {
    if (qg_status st = use_device(ctx)) return st;
    QG_GPU_TRY(hipFree(ptr), "freeing device memory");
    return QG_OK;
}

qg_status gpu_memcpy(const qg_context* ctx, void* dst, const void* src, size_t bytes, qg_copy_kind kind,
                     qg_stream stream) {
    if (qg_status st = use_device(ctx)) return st;
    QG_GPU_TRY(hipMemcpyAsync(dst, src, bytes, memcpy_kind(kind), as_stream(stream)), "memcpy");
    return QG_OK;
}

qg_status gpu_memset(const qg_context* ctx, void* dst, int value, size_t bytes, qg_stream stream) {
    if (qg_status st = use_device(ctx)) return st;
    QG_GPU_TRY(hipMemsetAsync(dst, value, bytes, as_stream(stream)), "memset");
    return QG_OK;
}

qg_status gpu_stream_create(const qg_context* ctx, qg_stream* stream) {
    if (qg_status st = use_device(ctx)) return st;
    hipStream_t s = nullptr;
    // non-blocking: a created stream never waits for the legacy default stream
    QG_GPU_TRY(hipStreamCreateWithFlags(&s, hipStreamNonBlocking), "creating a stream");
    *stream = reinterpret_cast<qg_stream>(s);
    return QG_OK;
}

qg_status gpu_stream_destroy(const qg_context* ctx, qg_stream stream) {
    QG_GPU_TRY(hipStreamDestroy(as_stream(stream)), "destroying a stream");
    return QG_OK;
}

qg_status gpu_stream_synchronize(const qg_context* ctx, qg_stream stream) {
    if (qg_status st = use_device(ctx)) return st;
    QG_GPU_TRY(hipStreamSynchronize(as_stream(stream)), "synchronizing a stream");
    return QG_OK;
}

qg_status gpu_event_create(const qg_context* ctx, void** event) {
    if (qg_status st = use_device(ctx)) return st;
    hipEvent_t e = nullptr;
    QG_GPU_TRY(hipEventCreate(&e), "creating an event");
    *event = reinterpret_cast<void*>(e);
    return QG_OK;
}

qg_status gpu_event_destroy(const qg_context* ctx, void* event) {
    QG_GPU_TRY(hipEventDestroy(as_event(event)), "destroying an event");
    return QG_OK;
}

qg_status gpu_event_record(const qg_context* ctx, void* event, qg_stream stream) {
    if (qg_status st = use_device(ctx)) return st;
    QG_GPU_TRY(hipEventRecord(as_event(event), as_stream(stream)), "recording an event");
    return QG_OK;
}

qg_status gpu_event_synchronize(const qg_context* ctx, void* event) {
    QG_GPU_TRY(hipEventSynchronize(as_event(event)), "synchronizing an event");
    return QG_OK;
}

qg_status gpu_event_elapsed_ms(const qg_context* ctx, void* start, void* stop, float* ms) {
    float t = 0.0f;
    QG_GPU_TRY(hipEventElapsedTime(&t, as_event(start), as_event(stop)), "measuring the time between events");
    *ms = t;
    return QG_OK;
}

qg_status gpu_check_launch(const char* what) {
    const hipError_t err = hipGetLastError();
    if (err == hipSuccess) return QG_OK;
    char buf[160];
    snprintf(buf, sizeof(buf), "launch of %s failed", what);
    return gpu_error(err, buf);
}

// The published per-SM shared-memory capacity by compute capability (CUDA programming
// guide, "Compute capabilities"); 64 KB LDS per CU / WGP on AMD.
int gpu_smem_per_sm(const qg_context* ctx) {
    if (!kGpuIsCuda) return 64 * 1024;
    const int cc = ctx->cc_major * 10 + ctx->cc_minor;
    if (cc >= 120) return 100 * 1024;              // sm_120 (consumer Blackwell)
    if (cc >= 90) return 228 * 1024;               // sm_90 (H100, H200), sm_100
    if (cc == 80 || cc == 87) return 164 * 1024;   // A100, Orin
    if (cc >= 86) return 100 * 1024;               // sm_86, sm_89
    if (cc == 75) return 64 * 1024;
    return 96 * 1024;                              // sm_70
}

}  // namespace qg

namespace qg {
namespace launch_util {
namespace {

// One entry per (kernel, device): whether its shared-memory limit was raised to `smem`,
// and its occupancy at `threads` x `smem`. A handful of kernels per process: a list.
struct KernelFacts {
    const void* kernel;
    int device, threads, smem;
    bool raised;
    int blocks;  // -1: not asked yet
};
std::mutex g_facts_mutex;
KernelFacts g_facts[512];
int g_facts_count = 0;

KernelFacts* facts_of(const void* kernel, int device, int threads, int smem) {
    for (int i = 0; i < g_facts_count; ++i) {
        KernelFacts& f = g_facts[i];
        if (f.kernel == kernel && f.device == device && f.threads == threads && f.smem == smem) return &f;
    }
    if (g_facts_count == static_cast<int>(sizeof(g_facts) / sizeof(g_facts[0]))) return nullptr;
    g_facts[g_facts_count] = {kernel, device, threads, smem, false, -1};
    return &g_facts[g_facts_count++];
}

}  // namespace

qg_status prepare_kernel(const qg_context* ctx, const void* kernel, int smem, const char* what) {
    std::lock_guard<std::mutex> lock(g_facts_mutex);
    KernelFacts* f = facts_of(kernel, ctx->device, 0, smem);
    if (f != nullptr && f->raised) return QG_OK;
    const hipError_t e = hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != hipSuccess) {
        (void)hipGetLastError();
        return set_error(QG_ERR_DEVICE, "%s: setting %d bytes of dynamic shared memory failed: %s", what, smem,
                         hipGetErrorString(e));
    }
    if (f != nullptr) f->raised = true;
    return QG_OK;
}

int env_int(const char* name, int unset) {
    const char* v = getenv(name);
    return v != nullptr ? atoi(v) : unset;
}

bool pdl_enabled(const qg_context* ctx) {
    static const bool on = env_int("QG_EXP_PDL", 1) != 0;
    return kGpuIsCuda && on && ctx->cc_major >= 9;
}

int resident_blocks(const qg_context* ctx, const void* kernel, int threads, int smem) {
    if (kernel == nullptr || prepare_kernel(ctx, kernel, smem, "occupancy query") != QG_OK) return 0;
    std::lock_guard<std::mutex> lock(g_facts_mutex);
    KernelFacts* f = facts_of(kernel, ctx->device, threads, smem);
    if (f != nullptr && f->blocks >= 0) return f->blocks;
    int blocks = 0;
    if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) != hipSuccess) {
        (void)hipGetLastError();
        blocks = 0;
    }
    if (f != nullptr) f->blocks = blocks;
    return blocks;
}

}  // namespace launch_util
}  // namespace qg

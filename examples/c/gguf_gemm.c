/* Runs one quantized tensor of a .gguf file through the C ABI: y[M, N] = x[M, K] @ W^T.
 *
 *   gguf_gemm FILE.gguf TENSOR [M]
 *   cc -O2 gguf_gemm.c $(pkg-config --cflags --libs quantgemm) -o gguf_gemm
 *
 * x is a fixed pattern, x[i][k] = ((i * 131 + k * 31) % 17 - 8) / 8, exact in fp32 so that
 * any language can rebuild it (examples/c/check_gguf_gemm.py compares y with pyquant's
 * reference). y is printed one row per line after a '#' header line naming the backend.
 * The GEMM runs on the first CUDA (then HIP) device when the library has one, else on the
 * CPU tier; QG_EXAMPLE_BACKEND=cpu forces the CPU.
 *
 * The GGUF reader is the least a program needs (the format: ggml's docs/gguf.md): header,
 * key-values (skipped, except general.alignment), tensor infos, then the tensor's blocks at
 * data_start + offset, with every length checked against the file size. A GGUF tensor
 * [ne1, ne0] is N = ne1 rows (further dimensions, e.g. experts, fold into the rows) of
 * K = ne0 elements, each row K / block_elems blocks exactly as qg_gguf_gemm reads them.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <quantgemm.h>

/* GGML type numbers (ggml.h enum ggml_type) of the block formats qg_gguf_gemm reads. */
static int format_of_ggml_type(uint32_t type, qg_format* fmt) {
    switch (type) {
    case 2: *fmt = QG_FORMAT_Q4_0; return 1;
    case 8: *fmt = QG_FORMAT_Q8_0; return 1;
    case 12: *fmt = QG_FORMAT_Q4_K; return 1;
    case 14: *fmt = QG_FORMAT_Q6_K; return 1;
    case 18: *fmt = QG_FORMAT_IQ3_XXS; return 1;
    case 23: *fmt = QG_FORMAT_IQ4_XS; return 1;
    default: return 0;
    }
}

typedef struct {
    const uint8_t* data;
    uint64_t size, pos;
    const char* path;
} reader;

static void die(const char* what) {
    fprintf(stderr, "gguf_gemm: %s\n", what);
    exit(2);
}

/* Next n bytes, or exit naming the field and where the file ended. */
static const uint8_t* take(reader* r, uint64_t n, const char* what) {
    if (n > r->size - r->pos) {
        fprintf(stderr, "gguf_gemm: %s: %s at byte %llu needs %llu bytes, past the end of the "
                "file (%llu bytes): truncated\n", r->path, what, (unsigned long long)r->pos,
                (unsigned long long)n, (unsigned long long)r->size);
        exit(2);
    }
    const uint8_t* p = r->data + r->pos;
    r->pos += n;
    return p;
}

static uint32_t u32(reader* r, const char* what) { uint32_t v; memcpy(&v, take(r, 4, what), 4); return v; }
static uint64_t u64(reader* r, const char* what) { uint64_t v; memcpy(&v, take(r, 8, what), 8); return v; }

/* GGUF value types: sizes of the fixed ones; 8 = string, 9 = array. */
static uint64_t fixed_size(uint32_t type) {
    static const uint64_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < sizeof sizes / sizeof sizes[0] ? sizes[type] : 0;
}

static void skip_value(reader* r, uint32_t type, int depth) {
    if (fixed_size(type)) { take(r, fixed_size(type), "value"); return; }
    if (type == 8) { take(r, u64(r, "string length"), "string"); return; }
    if (type == 9 && depth == 0) {
        uint32_t item = u32(r, "array item type");
        uint64_t count = u64(r, "array count");
        if (fixed_size(item)) {
            /* count * size could overflow: a count past the rest of the file is truncation */
            if (count > (r->size - r->pos) / fixed_size(item)) take(r, UINT64_MAX, "array");
            take(r, count * fixed_size(item), "array");
            return;
        }
        for (uint64_t i = 0; i < count; ++i) skip_value(r, item, 1);
        return;
    }
    fprintf(stderr, "gguf_gemm: %s: value type %u at byte %llu is not a GGUF type: not a "
            "valid GGUF file\n", r->path, type, (unsigned long long)r->pos);
    exit(2);
}

static qg_status check(qg_status st, const char* call) {
    if (st != QG_OK) {
        fprintf(stderr, "gguf_gemm: %s: %s: %s\n", call, qg_status_string(st), qg_last_error());
        exit(1);
    }
    return st;
}

int main(int argc, char** argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s FILE.gguf TENSOR [M]\n", argv[0]);
        return 2;
    }
    const char* path = argv[1];
    const char* want = argv[2];
    long m_arg = argc == 4 ? strtol(argv[3], NULL, 10) : 2;
    if (m_arg < 1 || m_arg > 4096) die("M must be 1..4096");
    int64_t m = m_arg;

    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); return 2; }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 24) die("the file is smaller than a GGUF header");
    const uint8_t* map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) { perror("mmap"); return 2; }
    reader r = {map, (uint64_t)st.st_size, 0, path};

    if (memcmp(take(&r, 4, "magic"), "GGUF", 4) != 0) die("not a GGUF file (no GGUF magic)");
    uint32_t version = u32(&r, "version");
    if (version < 2) die("GGUF version 1 is not read here (2 and 3 are)");
    uint64_t n_tensors = u64(&r, "tensor count"), n_kv = u64(&r, "key-value count");
    uint64_t alignment = 32; /* GGUF's default when general.alignment is absent */
    for (uint64_t i = 0; i < n_kv; ++i) {
        uint64_t key_len = u64(&r, "key length");
        const char* key = (const char*)take(&r, key_len, "key");
        uint32_t type = u32(&r, "value type");
        if (key_len == 17 && memcmp(key, "general.alignment", 17) == 0 && type == 4) {
            memcpy(&alignment, take(&r, 4, "alignment"), 4);
            alignment &= 0xffffffffu;
            if (alignment == 0 || (alignment & (alignment - 1))) die("general.alignment is not a power of two");
        } else {
            skip_value(&r, type, 0);
        }
    }

    int found = 0;
    uint32_t ggml_type = 0;
    uint64_t k = 0, n = 1, offset = 0;
    for (uint64_t t = 0; t < n_tensors; ++t) {
        uint64_t name_len = u64(&r, "tensor name length");
        const char* name = (const char*)take(&r, name_len, "tensor name");
        uint32_t n_dims = u32(&r, "tensor dimension count");
        if (n_dims == 0 || n_dims > 4) die("a tensor has more than 4 (or no) dimensions: not a valid GGUF file");
        uint64_t dims[4];
        for (uint32_t d = 0; d < n_dims; ++d) dims[d] = u64(&r, "tensor dimension");
        uint32_t type = u32(&r, "tensor type");
        uint64_t off = u64(&r, "tensor offset");
        if (!found && name_len == strlen(want) && memcmp(name, want, name_len) == 0) {
            found = 1;
            ggml_type = type;
            k = dims[0];
            for (uint32_t d = 1; d < n_dims; ++d) n *= dims[d];
            offset = off;
        }
    }
    if (!found) { fprintf(stderr, "gguf_gemm: %s has no tensor named %s\n", path, want); return 2; }
    qg_format fmt;
    if (!format_of_ggml_type(ggml_type, &fmt)) {
        fprintf(stderr, "gguf_gemm: %s has GGML type %u; qg_gguf_gemm reads Q4_0 (2), Q8_0 (8), "
                "Q4_K (12), Q6_K (14), IQ3_XXS (18) and IQ4_XS (23)\n", want, ggml_type);
        return 2;
    }
    int32_t block_elems = 0, block_bytes = 0;
    check(qg_format_block(fmt, &block_elems, &block_bytes), "qg_format_block");
    if (k % (uint64_t)block_elems) die("the tensor's K is not a multiple of its block size");
    uint64_t row_bytes = k / (uint64_t)block_elems * (uint64_t)block_bytes;
    uint64_t data_start = (r.pos + alignment - 1) / alignment * alignment;
    if (offset > r.size || data_start > r.size - offset || n * row_bytes > r.size - data_start - offset) {
        fprintf(stderr, "gguf_gemm: %s: %s needs %llu bytes at byte %llu, past the end of the "
                "file (%llu bytes): truncated\n", path, want, (unsigned long long)(n * row_bytes),
                (unsigned long long)(data_start + offset), (unsigned long long)r.size);
        return 2;
    }
    const uint8_t* w_host = map + data_start + offset;

    /* x[i][k] = ((i*131 + k*31) % 17 - 8) / 8: eighths, exact in fp32. */
    float* x = malloc((size_t)(m * k) * sizeof *x);
    float* y = malloc((size_t)(m * n) * sizeof *y);
    if (!x || !y) die("out of memory");
    for (int64_t i = 0; i < m; ++i)
        for (uint64_t c = 0; c < k; ++c) x[i * k + c] = (float)((int)((i * 131 + c * 31) % 17) - 8) / 8.0f;

    qg_backend backend = QG_BACKEND_CPU;
    const char* forced = getenv("QG_EXAMPLE_BACKEND");
    int count = 0;
    if (!(forced && strcmp(forced, "cpu") == 0)) {
        if (qg_device_count(QG_BACKEND_CUDA, &count) == QG_OK && count > 0) backend = QG_BACKEND_CUDA;
        else if (qg_device_count(QG_BACKEND_HIP, &count) == QG_OK && count > 0) backend = QG_BACKEND_HIP;
    }
    qg_context* ctx;
    check(qg_context_create(backend, 0, &ctx), "qg_context_create");

    qg_gguf_gemm_args a = {0};
    a.size = sizeof a;
    a.format = fmt;
    a.m = m; a.n = (int64_t)n; a.k = (int64_t)k;
    a.x_dtype = QG_DTYPE_F32; a.y_dtype = QG_DTYPE_F32;
    a.ldx = (int64_t)k; a.ldy = (int64_t)n;
    void *xd = NULL, *wd = NULL, *yd = NULL;
    if (backend == QG_BACKEND_CPU) {
        a.x = x; a.w = w_host; a.ldw = (int64_t)row_bytes; a.y = y;
    } else {
        /* Rows padded to 16 bytes: the GPU tier copies rows with 16-byte loads (Q6_K and
         * IQ3_XXS rows are otherwise 2-byte aligned); the padding is never read. */
        uint64_t ldw = (row_bytes + 15) / 16 * 16;
        uint8_t* padded = calloc((size_t)(n * ldw), 1);
        if (!padded) die("out of memory");
        for (uint64_t row = 0; row < n; ++row) memcpy(padded + row * ldw, w_host + row * row_bytes, (size_t)row_bytes);
        check(qg_malloc(ctx, (size_t)(m * k) * sizeof(float), &xd), "qg_malloc");
        check(qg_malloc(ctx, (size_t)(n * ldw), &wd), "qg_malloc");
        check(qg_malloc(ctx, (size_t)(m * n) * sizeof(float), &yd), "qg_malloc");
        check(qg_memcpy(ctx, xd, x, (size_t)(m * k) * sizeof(float), QG_COPY_HOST_TO_DEVICE, NULL), "qg_memcpy");
        check(qg_memcpy(ctx, wd, padded, (size_t)(n * ldw), QG_COPY_HOST_TO_DEVICE, NULL), "qg_memcpy");
        free(padded);
        a.x = xd; a.w = wd; a.ldw = (int64_t)ldw; a.y = yd;
    }
    size_t ws = 0;
    check(qg_gguf_gemm_workspace_size(ctx, &a, &ws), "qg_gguf_gemm_workspace_size");
    if (ws) {   /* caller memory, zeroed once (quantgemm.h) */
        check(qg_malloc(ctx, ws, &a.workspace), "qg_malloc");
        check(qg_memset(ctx, a.workspace, 0, ws, NULL), "qg_memset");
        a.workspace_bytes = ws;
    }
    check(qg_gguf_gemm(ctx, &a, NULL), "qg_gguf_gemm");
    check(qg_stream_synchronize(ctx, NULL), "qg_stream_synchronize");
    if (backend != QG_BACKEND_CPU)
        check(qg_memcpy(ctx, y, yd, (size_t)(m * n) * sizeof(float), QG_COPY_DEVICE_TO_HOST, NULL), "qg_memcpy");

    printf("# backend %s, tensor %s, M=%lld N=%llu K=%llu\n",
           backend == QG_BACKEND_CPU ? "cpu" : backend == QG_BACKEND_CUDA ? "cuda" : "hip", want,
           (long long)m, (unsigned long long)n, (unsigned long long)k);
    for (int64_t i = 0; i < m; ++i)
        for (uint64_t c = 0; c < n; ++c) printf("%.9g%c", y[i * n + c], c + 1 == n ? '\n' : ' ');

    if (a.workspace) qg_free(ctx, a.workspace);
    if (xd) { qg_free(ctx, xd); qg_free(ctx, wd); qg_free(ctx, yd); }
    qg_context_destroy(ctx);
    free(x); free(y);
    munmap((void*)map, (size_t)st.st_size);
    close(fd);
    return 0;
}

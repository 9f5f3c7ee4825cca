#include <stdio.h>
#include <stdlib.h>
#include <quantgemm.h>

/* y[M, N] = x[M, K] @ dequant(W)^T, int4 weights in the canonical layout, fp16 activations. */
static qg_status w4a16(qg_context* ctx, qg_stream stream, int64_t m, int64_t n, int64_t k,
                       const void* x, const int32_t* qweight, const void* scales,
                       const int32_t* qzeros, void* y) {
    qg_w4a16_gemm_args a = {0};
    a.size = sizeof a;                      /* argument structs only grow */
    a.m = m; a.n = n; a.k = k;
    a.group_size = 128;
    a.x_dtype = QG_DTYPE_F16; a.y_dtype = QG_DTYPE_F32;
    a.scale_dtype = QG_DTYPE_F16; a.zero_dtype = QG_DTYPE_U4X8;
    a.x = x; a.ldx = k;
    a.qweight = qweight; a.scales = scales; a.qzeros = qzeros;  /* qzeros NULL: symmetric */
    a.y = y; a.ldy = n;
    size_t bytes = 0;                       /* workspace: caller memory, zeroed once */
    qg_status st = qg_w4a16_gemm_workspace_size(ctx, &a, &bytes);
    if (st != QG_OK) return st;
    if (bytes) {
        if ((st = qg_malloc(ctx, bytes, &a.workspace)) != QG_OK) return st;
        qg_memset(ctx, a.workspace, 0, bytes, stream);
        a.workspace_bytes = bytes;
    }
    st = qg_w4a16_gemm(ctx, &a, stream);
    if (bytes) { qg_stream_synchronize(ctx, stream); qg_free(ctx, a.workspace); }
    return st;
}

int main(void) {
    enum { M = 2, N = 8, K = 256 };
    static uint16_t x[M * K], scales[N * K / 128];
    static int32_t qweight[N * K / 8];
    static float y[M * N];
    for (int i = 0; i < M * K; ++i) x[i] = 0x3C00;                 /* fp16 1.0 */
    for (int i = 0; i < N * K / 128; ++i) scales[i] = 0x2C00;      /* fp16 1/16 */
    for (int i = 0; i < N * K / 8; ++i) qweight[i] = 0x76543210;   /* q = 0..7 */

    qg_context* ctx;   /* host pointers: CPU backend; QG_BACKEND_CUDA takes device pointers */
    qg_status st = qg_context_create(QG_BACKEND_CPU, 0, &ctx);
    if (st == QG_OK) st = w4a16(ctx, NULL, M, N, K, x, qweight, scales, NULL, y);
    if (st != QG_OK) {
        fprintf(stderr, "%s: %s\n", qg_status_string(st), qg_last_error());
        return 1;
    }
    printf("y[0][0] = %g\n", y[0]);  /* 32 words x sum(q - 8, q = 0..7) / 16 = -72 */
    qg_context_destroy(ctx);
    return 0;
}

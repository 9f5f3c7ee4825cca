// The CPU tier's worker pool under ThreadSanitizer (.ci/tsan_check.sh): 16 user threads
// call qg_gguf_gemm at once, 50 times each, through contexts of their own with 2 to 5
// worker threads and through one shared context of 4, so jobs asking for 1 to 4 helpers
// share the pool. Calls alternate M = 40 (the int8 path's panel kernels: AMX tiles on 32
// rows and AVX-512 VNNI on 8 where the CPU has AMX; the activations quantized on 2 threads)
// and M = 1 (its small-M kernels), on the default precision (int8), with every third call
// on the fp32-exact path. Every result must equal the serial one bit for bit; TSan aborts on any
// race.
#include <stdio.h>
#include <string.h>

#include <random>
#include <thread>
#include <vector>

#include "quantgemm.h"

namespace {

constexpr int64_t N = 96, K = 512, M = 40, ROW_BYTES = K / 32 * 34;  // Q8_0: 34-byte blocks

// Call c's M (rows of x used) and cpu_precision (0 default = int8, 1 fp32-exact).
int64_t call_m(int c) { return c % 2 == 0 ? M : 1; }
int64_t call_precision(int c) { return c % 3 == 2 ? 1 : 0; }

qg_status gemm(qg_context* ctx, const std::vector<uint8_t>& w, const std::vector<float>& x, std::vector<float>* y,
               int64_t m = M) {
    qg_gguf_gemm_args a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.format = QG_FORMAT_Q8_0;
    a.m = m;
    a.n = N;
    a.k = K;
    a.x_dtype = a.y_dtype = QG_DTYPE_F32;
    a.x = x.data();
    a.ldx = K;
    a.w = w.data();
    a.ldw = ROW_BYTES;
    a.y = y->data();
    a.ldy = N;
    return qg_gguf_gemm(ctx, &a, nullptr);
}

qg_context* cpu_context(int threads) {
    qg_context* ctx = nullptr;
    if (qg_context_create(QG_BACKEND_CPU, 0, &ctx) != QG_OK ||
        qg_context_set_option(ctx, "cpu_threads", threads) != QG_OK) {
        fprintf(stderr, "context: %s\n", qg_last_error());
        return nullptr;
    }
    return ctx;
}

}  // namespace

int main() {
    std::mt19937 g(3);
    std::vector<uint8_t> w(N * ROW_BYTES);
    for (auto& c : w) c = (uint8_t)(g() & 0x3f);  // fp16 scales 0x3f3f and below: finite
    std::vector<float> x(M * K);
    for (auto& v : x) v = (float)(g() % 100) / 50.0f - 1.0f;

    qg_context* serial = cpu_context(1);
    qg_context* shared = cpu_context(4);
    if (serial == nullptr || shared == nullptr) return 1;
    // serial results of each call kind: want[c % 6] (M and precision cycle with period 6)
    std::vector<std::vector<float>> want(6, std::vector<float>(M * N, 0.0f));
    for (int c = 0; c < 6; ++c) {
        if (qg_context_set_option(serial, "cpu_precision", call_precision(c)) != QG_OK ||
            gemm(serial, w, x, &want[c], call_m(c)) != QG_OK)
            return 1;
    }

    constexpr int USERS = 16, CALLS = 50;
    std::vector<int> mismatches(USERS, 0);
    std::vector<std::thread> users;
    for (int t = 0; t < USERS; ++t) {
        users.emplace_back([&, t] {
            // the shared context stays on the default precision (options are not per call)
            qg_context* ctx = t % 3 == 0 ? shared : cpu_context(2 + t % 4);
            std::vector<float> y(M * N);
            for (int c = 0; c < CALLS; ++c) {
                const int kind = ctx == shared ? (c % 2 == 0 ? 0 : 1) : c % 6;  // shared: precision 0 only
                std::fill(y.begin(), y.end(), 0.0f);
                const bool set = ctx != nullptr && (ctx == shared || qg_context_set_option(ctx, "cpu_precision",
                                                                                          call_precision(kind)) == QG_OK);
                if (!set || gemm(ctx, w, x, &y, call_m(kind)) != QG_OK ||
                    memcmp(y.data(), want[kind].data(), y.size() * 4))
                    ++mismatches[t];
            }
            if (ctx != shared && ctx != nullptr) qg_context_destroy(ctx);
        });
    }
    for (auto& u : users) u.join();
    int bad = 0;
    for (int m : mismatches) bad += m;
    printf("pool_race: %d user threads x %d calls, %d differ from the serial result\n", USERS, CALLS, bad);
    return bad == 0 ? 0 : 1;
}

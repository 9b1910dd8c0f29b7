// elementwise_variants.cu: the elementwise chain of benchmarks.gpu written the ways graphc's
// generator could emit it, timed against a plain copy on the same buffers (one program; run
// by benchmarks/gpu_check.sh's `variants` stage). Prints GB/s (bytes read + written) per
// variant; every variant's output is compared with the first's.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ float chain(float a) {
    float t = tanhf(a * 0.5f + 1.0f);
    float s = 1.0f / (1.0f + expf(-a));
    float r = a - 0.1f;
    return t * s + (r < 0 ? 0.0f : r);
}

// (a) graphc today: one element per thread, 64-bit index, char* parameters
extern "C" __global__ void one_per_thread(char *p0, char *p1, long long n) {
    long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n) return;
    ((float *)p1)[gi] = chain(((float *)p0)[gi]);
}

// (b) four per thread, blockDim apart, restrict, loads first in full blocks
extern "C" __global__ void four_restrict(const float *__restrict__ x, float *__restrict__ y,
                                         long long n) {
    long long base = (long long)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    if (base + 3LL * blockDim.x < n) {
        float a[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = x[base + i * blockDim.x];
#pragma unroll
        for (int i = 0; i < 4; ++i) y[base + i * blockDim.x] = chain(a[i]);
        return;
    }
    for (int i = 0; i < 4; ++i) {
        long long gi = base + i * blockDim.x;
        if (gi >= n) return;
        y[gi] = chain(x[gi]);
    }
}

// (c) float4: four consecutive elements per thread, 16-byte loads and stores
extern "C" __global__ void vec4(const float4 *__restrict__ x, float4 *__restrict__ y,
                                long long n4) {
    long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n4) return;
    float4 a = x[gi];
    y[gi] = make_float4(chain(a.x), chain(a.y), chain(a.z), chain(a.w));
}

// (d) one per thread, no aliasing question (restrict) but otherwise as (a)
extern "C" __global__ void one_restrict(const float *__restrict__ x, float *__restrict__ y,
                                        long long n) {
    long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n) return;
    y[gi] = chain(x[gi]);
}

__global__ void copy4(const float4 *__restrict__ x, float4 *__restrict__ y, long long n4) {
    long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi < n4) y[gi] = x[gi];
}

template <class F> float timed(F launch, int reps) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
    launch(); CHECK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
        CHECK(cudaEventRecord(a));
        for (int i = 0; i < reps; ++i) launch();
        CHECK(cudaEventRecord(b)); CHECK(cudaEventSynchronize(b));
        float t; CHECK(cudaEventElapsedTime(&t, a, b)); ms.push_back(t / reps);
    }
    std::sort(ms.begin(), ms.end());
    return ms[3];
}

int main() {
    const long long n = 1LL << 26;
    std::vector<float> h(n);
    srand(1);
    for (long long i = 0; i < n; ++i) h[i] = 6.0f * rand() / RAND_MAX - 3.0f;
    float *x, *y;
    CHECK(cudaMalloc(&x, n * 4)); CHECK(cudaMalloc(&y, n * 4));
    CHECK(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice));
    std::vector<float> ref(n), got(n);
    const int B = 256;
    const double bytes = 2.0 * n * 4;
    struct V { const char *name; float ms; };
    std::vector<V> out;
    auto check = [&](const char *name, bool first) {
        CHECK(cudaMemcpy(first ? ref.data() : got.data(), y, n * 4, cudaMemcpyDeviceToHost));
        if (!first) for (long long i = 0; i < n; ++i)
            if (got[i] != ref[i]) { printf("%s differs at %lld\n", name, i); exit(1); }
        CHECK(cudaMemset(y, 0xff, n * 4));
    };
    float t;
    t = timed([&] { copy4<<<(n / 4 + B - 1) / B, B>>>((float4 *)x, (float4 *)y, n / 4); }, 20);
    out.push_back({"copy (float4)", t});
    t = timed([&] { one_per_thread<<<(n + B - 1) / B, B>>>((char *)x, (char *)y, n); }, 20);
    out.push_back({"(a) one per thread (graphc today)", t}); check("a", true);
    t = timed([&] { one_restrict<<<(n + B - 1) / B, B>>>(x, y, n); }, 20);
    out.push_back({"(d) one per thread, restrict", t}); check("d", false);
    t = timed([&] { four_restrict<<<(n + 4 * B - 1) / (4 * B), B>>>(x, y, n); }, 20);
    out.push_back({"(b) four per thread, restrict, loads first", t}); check("b", false);
    t = timed([&] { vec4<<<(n / 4 + B - 1) / B, B>>>((float4 *)x, (float4 *)y, n / 4); }, 20);
    out.push_back({"(c) float4 per thread", t}); check("c", false);
    for (auto &v : out)
        printf("%-45s %8.4f ms %8.1f GB/s %5.2fx copy\n", v.name, v.ms, bytes / v.ms / 1e6,
               out[0].ms / v.ms);
    return 0;
}

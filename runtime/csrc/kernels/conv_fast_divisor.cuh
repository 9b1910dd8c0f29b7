/* conv_fast_divisor.cuh: integer helpers of conv.cu's column kernels (conv_filter_grad.cuh,
 * conv_strided_dgrad.cuh), included by conv.cu only: FastDivisor divides by a divisor fixed
 * at launch with a multiply and a shift instead of a division (an integer division is tens of
 * instructions on a GPU, 64-bit ones far more), and round_up.
 * Invariants: FastDivisor is exact for dividends below 2^31 and divisors in [1, 2^31).
 */
#ifndef GC_CONV_FAST_DIVISOR_CUH
#define GC_CONV_FAST_DIVISOR_CUH

namespace {

/* n / divisor for 0 <= n < 2^31 by a multiply and a shift (Granlund-Montgomery): multiplier
 * = ceil(2^shift / divisor) with shift = 32 + ceil(log2 divisor); the error term stays below
 * 1 / divisor for such n, so the quotient is exact. Made on the host, used in kernels. */
struct FastDivisor {
    uint32_t divisor;
    uint32_t shift;
    uint64_t multiplier;

    static FastDivisor of(int64_t divisor) {
        FastDivisor f;
        f.divisor = (uint32_t)divisor;
        uint32_t log2_ceil = 0;
        while (((uint64_t)1 << log2_ceil) < (uint64_t)divisor) ++log2_ceil;
        f.shift = 32 + log2_ceil;
        f.multiplier = (((uint64_t)1 << f.shift) + (uint64_t)divisor - 1) / (uint64_t)divisor;
        return f;
    }
    __device__ uint32_t quotient(uint32_t n) const {
        return (uint32_t)(((uint64_t)n * multiplier) >> shift);
    }
};

inline int64_t round_up(int64_t v, int64_t multiple) {
    return (v + multiple - 1) / multiple * multiple;
}

} /* namespace */

#endif /* GC_CONV_FAST_DIVISOR_CUH */

// Reference CUDA RMSNorm for triton-norms, in the classic "one block per row" style
// with a two-level block reduction (warp shuffles, then shared memory across warps):
//
//   grid  = (rows,)                      blockIdx.x  -> one row of `hidden` elements
//   block = (threads,)                   a multiple of 32 (whole warps), <= 1024
//
//   pass 1: each thread sums x*x over columns threadIdx.x, +blockDim.x, ... (fp32)
//           warp reduce: __shfl_xor_sync butterfly (5 steps) -> lane 0 holds the warp's sum
//           lane 0 of each warp writes its sum to shared memory; __syncthreads()
//           warp 0 reduces the per-warp sums with shuffles again; thread 0 computes
//           rstd = rsqrt(sum / hidden + eps) and broadcasts it through shared memory;
//           __syncthreads()
//   pass 2: each thread reloads its columns of x (served from L2 / L1 for rows that fit)
//           and writes out = round(round(x * rstd) * w)
//
// The rounding points are LlamaRMSNorm's: the normalised value is rounded to the
// storage type before the weight multiply (triton-norms: cast_dtype = x.dtype).
// scalar_t is float, c10::Half or c10::BFloat16.

#include <cuda_runtime.h>
#include <stdint.h>

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

// Sum of v over the block; every thread gets the result. blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[1024 / kWarpSize];
  __shared__ float total;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < num_warps ? warp_sums[lane] : 0.0f;
    w = warp_sum(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

template <typename scalar_t>
__global__ void rms_norm_kernel(scalar_t* __restrict__ out,           // [rows, hidden]
                                const scalar_t* __restrict__ input,   // [rows, hidden]
                                const scalar_t* __restrict__ weight,  // [hidden]
                                const float eps, const int hidden) {
  const int64_t row = blockIdx.x;
  const scalar_t* x = input + row * hidden;
  scalar_t* y = out + row * hidden;

  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = static_cast<float>(x[i]);
    sum_sq += v * v;
  }
  const float rstd = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);

  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const scalar_t xn = static_cast<scalar_t>(static_cast<float>(x[i]) * rstd);
    y[i] = static_cast<scalar_t>(static_cast<float>(xn) * static_cast<float>(weight[i]));
  }
}

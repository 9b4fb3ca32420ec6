// Reference CUDA kernels for triton-activations, written in the classic
// "one thread block per token" style of the CUDA activation libraries:
//
//   grid  = (number of tokens,)          blockIdx.x  -> one token (one row)
//   block = (min(d, 1024),)              threadIdx.x -> columns threadIdx.x, +blockDim.x, ...
//
// Each thread loads one element of each operand per loop step (scalar loads through
// __restrict__ const pointers, which the compiler turns into read-only cached loads),
// computes in fp32 and stores one element. There is no shared memory and no
// synchronisation: the columns of a row are independent.
//
// Gated ops read x = [gate | up] of width 2 * d per row and write d columns:
//   out[t, i] = round(round(act(gate[t, i])) * up[t, i])      (act_first)
//   out[t, i] = round(gate[t, i] * round(act(up[t, i])))      (mul_and_silu)
// The activation is rounded to the storage type before the multiply: the rounding
// point of the eager expression act(a) * b and of the vLLM-derived kernels, which
// triton-activations reproduces with rounding="eager".
// Plain ops read x of width d and write round(act(x)) (one rounding).
//
// scalar_t is float, c10::Half or c10::BFloat16 (the launcher instantiates all three);
// every value is converted to float on load and rounded once on store.

#include <cuda_runtime.h>
#include <stdint.h>

namespace act {

__device__ __forceinline__ float silu(float x, float) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_erf(float x, float) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

__device__ __forceinline__ float gelu_tanh(float x, float) {
  const float kBeta = 0.79788456080286535588f;  // sqrt(2 / pi)
  const float kKappa = 0.044715f;
  return 0.5f * x * (1.0f + tanhf(kBeta * (x + kKappa * x * x * x)));
}

__device__ __forceinline__ float gelu_fast(float x, float) {
  return 0.5f * x * (1.0f + tanhf(x * 0.7978845608f * (1.0f + 0.044715f * x * x)));
}

__device__ __forceinline__ float gelu_quick(float x, float) { return x / (1.0f + expf(-1.702f * x)); }

// FATReLU: keeps x above the threshold, zero elsewhere.
__device__ __forceinline__ float fatrelu(float x, float threshold) { return x > threshold ? x : 0.0f; }

}  // namespace act

// out[t, :] = act(x[t, :d]) * x[t, d:]   (ACT_FIRST)  or  x[t, :d] * act(x[t, d:])
template <typename scalar_t, float (*ACT)(float, float), bool ACT_FIRST>
__global__ void gated_act_kernel(scalar_t* __restrict__ out,          // [tokens, d]
                                 const scalar_t* __restrict__ input,  // [tokens, 2 * d]
                                 const int d, const float param) {
  const int64_t token = blockIdx.x;
  const scalar_t* gate = input + token * 2 * d;
  const scalar_t* up = gate + d;
  scalar_t* dst = out + token * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float a = static_cast<float>(gate[i]);
    const float b = static_cast<float>(up[i]);
    float y;
    if (ACT_FIRST) {
      y = static_cast<float>(static_cast<scalar_t>(ACT(a, param))) * b;
    } else {
      y = a * static_cast<float>(static_cast<scalar_t>(ACT(b, param)));
    }
    dst[i] = static_cast<scalar_t>(y);
  }
}

// out[t, :] = act(x[t, :])
template <typename scalar_t, float (*ACT)(float, float)>
__global__ void act_kernel(scalar_t* __restrict__ out,          // [tokens, d]
                           const scalar_t* __restrict__ input,  // [tokens, d]
                           const int d) {
  const int64_t token = blockIdx.x;
  const scalar_t* src = input + token * d;
  scalar_t* dst = out + token * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    dst[i] = static_cast<scalar_t>(ACT(static_cast<float>(src[i]), 0.0f));
  }
}

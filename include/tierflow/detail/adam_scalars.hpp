#pragma once
// The per-step scalars of the Adam update, shared by the CPU kernels and the CUDA ones (so
// this header includes nothing nvcc would have to digest).

namespace tierflow::detail {

/** One group's scalars for one step, each rounded to float once (as PyTorch passes them). */
struct adam_scalars {
  float grad_scale = 1.0f;  // clip / loss_scale
  float l2 = 0.0f;          // weight_decay for L2 mode, else 0
  float decay = 1.0f;       // 1 - lr * weight_decay for decoupled mode, else 1
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bc2_sqrt = 1.0f;       // sqrt(1 - beta2^t), or 1
  float neg_step_size = 0.0f;  // -lr / (1 - beta1^t), or -lr
  float eps = 1e-8f;
};

}  // namespace tierflow::detail

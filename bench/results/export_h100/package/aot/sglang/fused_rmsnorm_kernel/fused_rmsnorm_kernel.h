/* fused_rmsnorm_kernel: Triton kernels compiled ahead of time by Kernel Farm's export (triton.tools.compile
 * and triton.tools.link). Each kernel's linked header declares
 *   CUresult <name>_<constexprs>_warps<W>xstages<S>(CUstream, <arguments>)
 * which picks the compiled specialisation that fits the arguments (alignment, values of 1).
 * Specialisations and grids:
 *   fused_rmsnorm_kernel_fused_rmsnorm_kernel: [*fp16:16, *fp16:16, *fp16:16, i32:16, i32:16, i32:16, fp32, 4096] grid (32,1,1) warps 8 stages 3
 *   fused_rmsnorm_kernel_fused_rmsnorm_kernel: [*fp16, *fp16, *fp16, i32, i32, i32, fp32, 4096] grid (32,1,1) warps 8 stages 3
 * A number in a grid means that variant serves only inputs that give that grid.
 */
#ifndef KFARM_FUSED_RMSNORM_KERNEL_H
#define KFARM_FUSED_RMSNORM_KERNEL_H
#include <string.h>
#include "src/fused_rmsnorm_kernel_fused_rmsnorm_kernel.h"

/* Triton >= 3.4 declares fp32 scalars `double` while the kernel reads 4 bytes: pass
 * kfarm_f32_arg(x) for such an argument (the float's bits in the low half). */
static inline double kfarm_f32_arg(float value) {
  double packed = 0;
  memcpy(&packed, &value, sizeof value);
  return packed;
}
#endif /* KFARM_FUSED_RMSNORM_KERNEL_H */

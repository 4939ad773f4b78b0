/* row_sum: Triton kernels compiled ahead of time by Kernel Farm's export (triton.tools.compile
 * and triton.tools.link). Each kernel's linked header declares
 *   CUresult <name>_<constexprs>_warps<W>xstages<S>(CUstream, <arguments>)
 * which picks the compiled specialisation that fits the arguments (alignment, values of 1).
 * Specialisations and grids:
 *   row_sum_row_sum_kernel: [*fp32:16, *fp32:16, i32:16, i32:16, 128] grid (4096,1,1) warps 4 stages 3
 *   row_sum_row_sum_kernel: [*fp32, *fp32, i32, i32, 128] grid (4096,1,1) warps 4 stages 3
 * A number in a grid means that variant serves only inputs that give that grid.
 */
#ifndef KFARM_ROW_SUM_H
#define KFARM_ROW_SUM_H
#include <string.h>
#include "src/row_sum_row_sum_kernel.h"

/* Triton >= 3.4 declares fp32 scalars `double` while the kernel reads 4 bytes: pass
 * kfarm_f32_arg(x) for such an argument (the float's bits in the low half). */
static inline double kfarm_f32_arg(float value) {
  double packed = 0;
  memcpy(&packed, &value, sizeof value);
  return packed;
}
#endif /* KFARM_ROW_SUM_H */

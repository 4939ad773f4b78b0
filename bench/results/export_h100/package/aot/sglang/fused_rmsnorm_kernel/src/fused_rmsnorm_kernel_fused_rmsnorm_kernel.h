#include <cuda.h>

CUresult fused_rmsnorm_kernel_fused_rmsnorm_kernel_4096_warps8xstages3(CUstream stream, CUdeviceptr out_ptr, CUdeviceptr x_ptr, CUdeviceptr w_ptr, int32_t stride_x_row, int32_t stride_out_row, int32_t n_cols, double eps);
void load_fused_rmsnorm_kernel_fused_rmsnorm_kernel_4096_warps8xstages3();
void unload_fused_rmsnorm_kernel_fused_rmsnorm_kernel_4096_warps8xstages3();
    
int fused_rmsnorm_kernel_fused_rmsnorm_kernel_get_num_algos(void);

CUresult fused_rmsnorm_kernel_fused_rmsnorm_kernel_default(CUstream stream, CUdeviceptr out_ptr, CUdeviceptr x_ptr, CUdeviceptr w_ptr, int32_t stride_x_row, int32_t stride_out_row, int32_t n_cols, double eps);
CUresult fused_rmsnorm_kernel_fused_rmsnorm_kernel(CUstream stream, CUdeviceptr out_ptr, CUdeviceptr x_ptr, CUdeviceptr w_ptr, int32_t stride_x_row, int32_t stride_out_row, int32_t n_cols, double eps, int algo_id);
void load_fused_rmsnorm_kernel_fused_rmsnorm_kernel();
void unload_fused_rmsnorm_kernel_fused_rmsnorm_kernel();
    
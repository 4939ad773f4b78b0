#include <cuda.h>

CUresult row_sum_row_sum_kernel_128_warps4xstages3(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr out_ptr, int32_t n_cols, int32_t stride_xm);
void load_row_sum_row_sum_kernel_128_warps4xstages3();
void unload_row_sum_row_sum_kernel_128_warps4xstages3();
    
int row_sum_row_sum_kernel_get_num_algos(void);

CUresult row_sum_row_sum_kernel_default(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr out_ptr, int32_t n_cols, int32_t stride_xm);
CUresult row_sum_row_sum_kernel(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr out_ptr, int32_t n_cols, int32_t stride_xm, int algo_id);
void load_row_sum_row_sum_kernel();
void unload_row_sum_row_sum_kernel();
    
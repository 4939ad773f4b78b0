#include <cuda.h>

CUresult triton_tanh_tanh_kernel_1024_warps4xstages3(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr out_ptr, int32_t n_elements);
void load_triton_tanh_tanh_kernel_1024_warps4xstages3();
void unload_triton_tanh_tanh_kernel_1024_warps4xstages3();
    
int triton_tanh_tanh_kernel_get_num_algos(void);

CUresult triton_tanh_tanh_kernel_default(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr out_ptr, int32_t n_elements);
CUresult triton_tanh_tanh_kernel(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr out_ptr, int32_t n_elements, int algo_id);
void load_triton_tanh_tanh_kernel();
void unload_triton_tanh_tanh_kernel();
    
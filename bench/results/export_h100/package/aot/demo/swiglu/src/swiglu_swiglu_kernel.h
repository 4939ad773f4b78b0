#include <cuda.h>

CUresult swiglu_swiglu_kernel_256_warps4xstages3(CUstream stream, CUdeviceptr gate_ptr, CUdeviceptr up_ptr, CUdeviceptr out_ptr, int32_t n_cols, int32_t stride_gm, int32_t stride_um, int32_t stride_om);
void load_swiglu_swiglu_kernel_256_warps4xstages3();
void unload_swiglu_swiglu_kernel_256_warps4xstages3();
    
int swiglu_swiglu_kernel_get_num_algos(void);

CUresult swiglu_swiglu_kernel_default(CUstream stream, CUdeviceptr gate_ptr, CUdeviceptr up_ptr, CUdeviceptr out_ptr, int32_t n_cols, int32_t stride_gm, int32_t stride_um, int32_t stride_om);
CUresult swiglu_swiglu_kernel(CUstream stream, CUdeviceptr gate_ptr, CUdeviceptr up_ptr, CUdeviceptr out_ptr, int32_t n_cols, int32_t stride_gm, int32_t stride_um, int32_t stride_om, int algo_id);
void load_swiglu_swiglu_kernel();
void unload_swiglu_swiglu_kernel();
    
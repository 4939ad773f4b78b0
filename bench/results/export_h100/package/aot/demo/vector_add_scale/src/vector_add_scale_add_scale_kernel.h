#include <cuda.h>

CUresult vector_add_scale_add_scale_kernel_256_warps4xstages3(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr y_ptr, CUdeviceptr out_ptr, int32_t n_elements, double alpha);
void load_vector_add_scale_add_scale_kernel_256_warps4xstages3();
void unload_vector_add_scale_add_scale_kernel_256_warps4xstages3();
    
int vector_add_scale_add_scale_kernel_get_num_algos(void);

CUresult vector_add_scale_add_scale_kernel_default(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr y_ptr, CUdeviceptr out_ptr, int32_t n_elements, double alpha);
CUresult vector_add_scale_add_scale_kernel(CUstream stream, CUdeviceptr x_ptr, CUdeviceptr y_ptr, CUdeviceptr out_ptr, int32_t n_elements, double alpha, int algo_id);
void load_vector_add_scale_add_scale_kernel();
void unload_vector_add_scale_add_scale_kernel();
    
// How many thread-block clusters of each size fit on the GPU at once, for a 384-thread block
// with the shared memory of a one- or two-block-per-SM GEMM (cudaOccupancyMaxActiveClusters).
// A persistent GEMM whose clusters do not all fit runs in more than one wave.
//   nvcc -arch=sm_90a -o cluster-fit bench/cluster-fit.cu && ./cluster-fit
#include <cuda_runtime.h>
#include <cstdio>
__global__ void footprint(int* p) {
  extern __shared__ char smem[];
  if (p) p[threadIdx.x] = smem[threadIdx.x];
}
int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  printf("SMs %d\n", sms);
  cudaFuncSetAttribute(footprint, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int smem : {100 << 10, 200 << 10, 227 << 10}) {
    cudaFuncSetAttribute(footprint, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int cs : {1, 2, 4, 8, 16}) {
      cudaLaunchConfig_t config{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = cs;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      config.gridDim = dim3(cs, 1, 1);
      config.blockDim = dim3(384, 1, 1);
      config.dynamicSmemBytes = smem;
      config.attrs = &attr;
      config.numAttrs = 1;
      int n = -1;
      cudaError_t e = cudaOccupancyMaxActiveClusters(&n, footprint, &config);
      printf("smem %3d KB  cluster %2d  max active clusters %3d  SMs used %3d  %s\n", smem >> 10,
             cs, n, n * cs, cudaGetErrorString(e));
    }
  }
}

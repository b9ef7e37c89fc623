// Probe behind cluster_placement.txt (experiment record, not built): where do the CTAs of a
// cluster launch land? For cluster sizes 8 and 16, dynamic shared memory 100/120/200 KiB and
// 64/96/128 CTAs it prints cudaOccupancyMaxActiveClusters and the number of distinct SMs used.
// nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o placement cluster_placement.cu
#include <cuda_runtime.h>

#include <cstdio>
#include <set>
#include <vector>

__global__ void where(int* sm, int spin) {
  extern __shared__ char s[];
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  if (threadIdx.x == 0) sm[blockIdx.x] = id;
  long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  s[threadIdx.x] = 0;
}

int main() {
  cudaFuncSetAttribute(where, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(where, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  int* d;
  cudaMalloc(&d, 4096 * 4);
  for (int cluster : {8, 16})
    for (int kb : {100, 120, 200})
      for (int grid : {64, 96, 128}) {
        if (grid % cluster) continue;
        cudaLaunchConfig_t c = {};
        c.gridDim = dim3(grid);
        c.blockDim = dim3(256);
        c.dynamicSmemBytes = kb * 1024;
        cudaLaunchAttribute a[1];
        a[0].id = cudaLaunchAttributeClusterDimension;
        a[0].val.clusterDim.x = cluster;
        a[0].val.clusterDim.y = 1;
        a[0].val.clusterDim.z = 1;
        c.attrs = a;
        c.numAttrs = 1;
        int active = -1;
        cudaOccupancyMaxActiveClusters(&active, where, &c);
        cudaLaunchKernelEx(&c, where, d, 20000);
        cudaError_t e = cudaDeviceSynchronize();
        std::vector<int> h(grid);
        cudaMemcpy(h.data(), d, grid * 4, cudaMemcpyDeviceToHost);
        std::set<int> sms(h.begin(), h.end());
        printf(
            "cluster %2d smem %3d KB grid %3d: max active clusters %3d, distinct SMs %3zu (%s)\n",
            cluster, kb, grid, active, sms.size(), cudaGetErrorString(e));
      }
}

// What the pieces of a decode step cost on this GPU, each as the median of 300 replays of a
// CUDA graph holding it: a memset node, empty kernels (1 and 128 CTAs), two and three kernels
// with and without programmatic dependent launch, clusters of 8 with cluster barriers,
// cooperative grid.sync and a spinning grid barrier. A measurement kept with its results (not
// part of the library or its build):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o graph_costs graph_costs.cu
//   ./graph_costs > graph_costs.txt      (two passes over the list)
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>
namespace cg = cooperative_groups;
#define CK(x)                                            \
  do {                                                   \
    cudaError_t e = (x);                                 \
    if (e != cudaSuccess) {                              \
      printf("ERR %s: %s\n", #x, cudaGetErrorString(e)); \
    }                                                    \
  } while (0)

__device__ float sink[1 << 16];
__global__ void k_plain(int pdl_trigger) {
  if (pdl_trigger) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (threadIdx.x == 0 && blockIdx.x == 100000) sink[0] = 1;
}
__global__ void k_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (threadIdx.x == 0 && blockIdx.x == 100000) sink[0] = 1;
}
__global__ void k_cluster(int syncs) {
  extern __shared__ float sm[];
  cg::cluster_group cluster = cg::this_cluster();
  sm[threadIdx.x] = threadIdx.x;
  for (int i = 0; i < syncs; ++i)
    cluster.sync();
  if (syncs)
    sink[blockIdx.x] = cluster.map_shared_rank(sm, (cluster.block_rank() + 1) % 8)[threadIdx.x];
}
__global__ void k_coop() {
  cg::grid_group grid = cg::this_grid();
  grid.sync();
  if (threadIdx.x == 0 && blockIdx.x == 100000) sink[0] = 1;
}
__global__ void k_spin(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned old = atomicAdd(counter, 1u);
    unsigned target = (old / gridDim.x + 1) * gridDim.x;
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(counter));
    } while ((int)(v - target) < 0);
  }
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 100000) sink[0] = 1;
}
// cluster + spin barrier
__global__ void k_cluster_spin(unsigned* counter) {
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned old = atomicAdd(counter, 1u);
    unsigned target = (old / (gridDim.x) + 1) * gridDim.x;
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(counter));
    } while ((int)(v - target) < 0);
  }
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 100000) sink[0] = 1;
}

cudaStream_t s;
double time_graph(const std::function<void()>& work, int iters = 300) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  work();
  CK(cudaStreamEndCapture(s, &g));
  if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
    printf("instantiate failed\n");
    cudaGetLastError();
    return -1;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < iters + 20; ++i) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 20) t.push_back(ms * 1000);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return t[t.size() / 2];
}
void launch(void* k, dim3 grid, int threads, size_t smem, void** args, int cluster, bool coop,
            bool pdl) {
  cudaLaunchConfig_t c = {};
  c.gridDim = grid;
  c.blockDim = dim3(threads);
  c.dynamicSmemBytes = smem;
  c.stream = s;
  cudaLaunchAttribute at[3];
  int n = 0;
  if (cluster > 1) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = cluster;
    at[n].val.clusterDim.y = 1;
    at[n].val.clusterDim.z = 1;
    ++n;
  }
  if (coop) {
    at[n].id = cudaLaunchAttributeCooperative;
    at[n].val.cooperative = 1;
    ++n;
  }
  if (pdl) {
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  c.attrs = at;
  c.numAttrs = n;
  cudaError_t e = cudaLaunchKernelExC(&c, k, args);
  if (e != cudaSuccess) printf("  launch error: %s\n", cudaGetErrorString(e));
}
int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned* counters;
  CK(cudaMalloc(&counters, 4096));
  CK(cudaMemset(counters, 0, 4096));
  unsigned* counter = counters;
  unsigned* counter2 = counters + 64;
  unsigned* counter3 = counters + 128;
  char* byte;
  CK(cudaMalloc(&byte, 64));
  CK(cudaFuncSetAttribute(k_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize, 110 * 1024));
  int one = 1, zero = 0, two = 2;
  void* a1[] = {&one};
  void* a0[] = {&zero};
  void* a2[] = {&two};
  void* ac[] = {&counter};
  void* ac2[] = {&counter2};
  void* ac3[] = {&counter3};
  for (int rep = 0; rep < 2; ++rep) {
    printf("memset node                       %7.2f us\n",
           time_graph([&] { cudaMemsetAsync(byte, 0, 1, s); }));
    printf("1 kernel 1 CTA                    %7.2f us\n",
           time_graph([&] { launch((void*)k_plain, 1, 256, 0, a0, 1, false, false); }));
    printf("1 kernel 128 CTA                  %7.2f us\n",
           time_graph([&] { launch((void*)k_plain, 128, 256, 0, a0, 1, false, false); }));
    printf("2 kernels 128+64                  %7.2f us\n", time_graph([&] {
             launch((void*)k_plain, 128, 256, 0, a0, 1, false, false);
             launch((void*)k_wait, 64, 256, 0, nullptr, 1, false, false);
           }));
    printf("2 kernels 128+64 PDL              %7.2f us\n", time_graph([&] {
             launch((void*)k_plain, 128, 256, 0, a1, 1, false, false);
             launch((void*)k_wait, 64, 256, 0, nullptr, 1, false, true);
           }));
    printf("3 kernels PDL                     %7.2f us\n", time_graph([&] {
             launch((void*)k_plain, 128, 256, 0, a1, 1, false, false);
             launch((void*)k_plain, 128, 256, 0, a1, 1, false, true);
             launch((void*)k_wait, 64, 256, 0, nullptr, 1, false, true);
           }));
    printf("cluster8 128 CTA 0 sync 110KB     %7.2f us\n", time_graph([&] {
             launch((void*)k_cluster, 128, 256, 110 * 1024, a0, 8, false, false);
           }));
    printf("cluster8 128 CTA 2 sync 110KB     %7.2f us\n", time_graph([&] {
             launch((void*)k_cluster, 128, 256, 110 * 1024, a2, 8, false, false);
           }));
    printf("cluster8 128 CTA 2 sync 8KB       %7.2f us\n",
           time_graph([&] { launch((void*)k_cluster, 128, 256, 8 * 1024, a2, 8, false, false); }));
    printf("cluster8 192 CTA 2 sync 100KB     %7.2f us\n", time_graph([&] {
             launch((void*)k_cluster, 192, 256, 100 * 1024, a2, 8, false, false);
           }));
    printf("cluster8 + 64 PDL                 %7.2f us\n", time_graph([&] {
             launch((void*)k_cluster, 128, 256, 8 * 1024, a2, 8, false, false);
             launch((void*)k_wait, 64, 256, 0, nullptr, 1, false, true);
           }));
    printf("coop 128 CTA grid.sync            %7.2f us\n",
           time_graph([&] { launch((void*)k_coop, 128, 256, 0, nullptr, 1, true, false); }));
    printf("coop 132 CTA grid.sync            %7.2f us\n",
           time_graph([&] { launch((void*)k_coop, 132, 256, 0, nullptr, 1, true, false); }));
    printf("spin 128 CTA                      %7.2f us\n",
           time_graph([&] { launch((void*)k_spin, 128, 256, 0, ac, 1, false, false); }));
    printf("spin 132 CTA                      %7.2f us\n",
           time_graph([&] { launch((void*)k_spin, 132, 256, 0, ac2, 1, false, false); }));
    printf("cluster8 + spin 128               %7.2f us\n",
           time_graph([&] { launch((void*)k_cluster_spin, 128, 256, 0, ac3, 8, false, false); }));
    printf("coop + cluster8 128               %7.2f us\n",
           time_graph([&] { launch((void*)k_coop, 128, 256, 0, nullptr, 8, true, false); }));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}

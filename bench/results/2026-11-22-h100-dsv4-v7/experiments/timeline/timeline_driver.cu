// Diagnostic: per-CTA %globaltimer stamps of the split gate GEMM and the row epilogue, over graph
// replays after an L2 flush. Not committed.
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "hdk/hdk.h"
namespace hdk {
namespace dsv4 {
namespace detail {
void set_split_timeline(unsigned long long*);
void set_epilogue_timeline(unsigned long long*);
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
#define CHECK(x)                                     \
  do {                                               \
    cudaError_t e = (x);                             \
    if (e != cudaSuccess) {                          \
      printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      exit(1);                                       \
    }                                                \
  } while (0)
__global__ void read_flush(const uint4* data, long n, unsigned* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n;
       i += (long)gridDim.x * blockDim.x) {
    uint4 v = data[i];
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) sink[0] = 1;
}
static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
int main(int argc, char** argv) {
  const int E = atoi(argv[1]), D = atoi(argv[2]), N = atoi(argv[3]);
  const int flush_mode = argc > 4 ? atoi(argv[4]) : 1;  // 1 memset, 2 read
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const size_t flush_bytes = std::max<size_t>(2ull * prop.l2CacheSize, 128ull << 20);
  void* flush;
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMemset(flush, 1, flush_bytes));
  unsigned* sink;
  CHECK(cudaMalloc(&sink, 64));
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0, 1);
  std::vector<uint16_t> h_hidden((size_t)N * D), h_gate((size_t)E * D);
  auto bf = [](float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
  };
  for (auto& x : h_hidden)
    x = bf(g(rng));
  for (auto& x : h_gate)
    x = bf(g(rng) / sqrtf(D));
  std::vector<float> h_bias(E);
  for (auto& x : h_bias)
    x = g(rng) * 0.1f;
  void *hidden, *gate, *bias, *ids, *weights, *ws;
  const int64_t S = hdk::dsv4::route_workspace_slabs(N);
  CHECK(cudaMalloc(&hidden, h_hidden.size() * 2));
  CHECK(cudaMemcpy(hidden, h_hidden.data(), h_hidden.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&gate, h_gate.size() * 2));
  CHECK(cudaMemcpy(gate, h_gate.data(), h_gate.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&bias, E * 4));
  CHECK(cudaMemcpy(bias, h_bias.data(), E * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&ids, N * 6 * 4));
  CHECK(cudaMalloc(&weights, N * 6 * 4));
  CHECK(cudaMalloc(&ws, S * N * E * 4));
  const int kSplitSlots = 1024, kEpiSlots = 4096;
  unsigned long long *tl_split, *tl_epi;
  CHECK(cudaMalloc(&tl_split, kSplitSlots * 8 * 8));
  CHECK(cudaMalloc(&tl_epi, kEpiSlots * 8 * 8));
  hdk::dsv4::detail::set_split_timeline(tl_split);
  hdk::dsv4::detail::set_epilogue_timeline(tl_epi);
  const hdk::Device dev = hdk::Device::cuda(0);
  hdk::dsv4::RouterParams p;
  p.hidden = hdk::TensorView::contiguous(hidden, hdk::DType::kBFloat16, {N, D}, dev);
  p.gate_weight = hdk::TensorView::contiguous(gate, hdk::DType::kBFloat16, {E, D}, dev);
  p.bias = hdk::TensorView::contiguous(bias, hdk::DType::kFloat32, {E}, dev);
  p.topk_ids = hdk::TensorView::contiguous(ids, hdk::DType::kInt32, {N, 6}, dev);
  p.topk_weights = hdk::TensorView::contiguous(weights, hdk::DType::kFloat32, {N, 6}, dev);
  p.logits_workspace = hdk::TensorView::contiguous(ws, hdk::DType::kFloat32, {S, N, E}, dev);
  p.route_scale = 2.5f;
  hdk::dsv4::route(p, hdk::CudaStream(stream));
  CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  hdk::dsv4::route(p, hdk::CudaStream(stream));
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const int kSplitStamps = 6, kEpiStamps = 7;
  const char* split_names[] = {
      "split: CTA start",        "split: hidden (stage 0) arrived (warp 0)",
      "split: warp 0 MMAs done", "split: all warps done (sync)",
      "split: stores issued",    "split: last stage arrived (warp 0)"};
  const char* epi_names[] = {"epi: CTA start",
                             "epi: after griddepcontrol.wait",
                             "epi: logits+score (thread 0)",
                             "epi: after syncthreads_or",
                             "epi: after lists",
                             "epi: after merge (warp 0)",
                             "epi: after finish_row"};
  std::vector<std::vector<double>> smin(kSplitStamps), smed(kSplitStamps), smax(kSplitStamps),
      emin(kEpiStamps), emed(kEpiStamps), emax(kEpiStamps);
  std::vector<double> total;
  std::vector<double> gran;
  int split_ctas = 0, epi_ctas = N;
  for (int it = 0; it < 60; ++it) {
    CHECK(cudaMemset(tl_split, 0, kSplitSlots * 64));
    CHECK(cudaMemset(tl_epi, 0, kEpiSlots * 64));
    if (flush_mode == 1) CHECK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, stream));
    if (flush_mode == 2)
      read_flush<<<528, 512, 0, stream>>>((const uint4*)flush, flush_bytes / 16, sink);
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::vector<unsigned long long> hs(kSplitSlots * 8), he(kEpiSlots * 8);
    CHECK(cudaMemcpy(hs.data(), tl_split, hs.size() * 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(he.data(), tl_epi, he.size() * 8, cudaMemcpyDeviceToHost));
    split_ctas = 0;
    while (split_ctas < kSplitSlots && hs[split_ctas * 8] != 0)
      ++split_ctas;
    if (it < 10) continue;
    total.push_back(ms * 1e3);
    unsigned long long base = ~0ull;
    for (int c = 0; c < split_ctas; ++c)
      base = std::min(base, hs[c * 8]);
    auto stats = [&](std::vector<unsigned long long>& h, int ctas, int slot,
                     std::vector<double>& mn, std::vector<double>& md, std::vector<double>& mx) {
      std::vector<double> v;
      for (int c = 0; c < ctas; ++c)
        if (h[c * 8 + slot]) v.push_back((double)(h[c * 8 + slot] - base) / 1e3);
      if (v.empty()) return;
      std::sort(v.begin(), v.end());
      mn.push_back(v.front());
      md.push_back(v[v.size() / 2]);
      mx.push_back(v.back());
    };
    for (int s = 0; s < kSplitStamps; ++s)
      stats(hs, split_ctas, s, smin[s], smed[s], smax[s]);
    for (int s = 0; s < kEpiStamps; ++s)
      stats(he, epi_ctas, s, emin[s], emed[s], emax[s]);
    // timer granularity: distinct start stamps
    std::vector<unsigned long long> st;
    for (int c = 0; c < split_ctas; ++c)
      st.push_back(hs[c * 8]);
    std::sort(st.begin(), st.end());
    st.erase(std::unique(st.begin(), st.end()), st.end());
    gran.push_back(st.size());
  }
  printf(
      "E=%d D=%d N=%d flush=%s: graph replay %.2f us (median of %zu); split CTAs %d, epilogue CTAs "
      "%d; distinct split start stamps %.0f\n",
      E, D, N, flush_mode == 1 ? "memset" : "read", median(total), total.size(), split_ctas,
      epi_ctas, median(gran));
  printf("  %-34s %8s %8s %8s   (us after the first split CTA starts; medians over replays)\n",
         "stamp", "first", "median", "last");
  for (int s = 0; s < kSplitStamps; ++s)
    if (!smin[s].empty())
      printf("  %-34s %8.2f %8.2f %8.2f\n", split_names[s], median(smin[s]), median(smed[s]),
             median(smax[s]));
  for (int s = 0; s < kEpiStamps; ++s)
    if (!emin[s].empty())
      printf("  %-34s %8.2f %8.2f %8.2f\n", epi_names[s], median(emin[s]), median(emed[s]),
             median(emax[s]));
  return 0;
}

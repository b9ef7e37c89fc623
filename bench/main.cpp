// hdk-bench: one binary, one subcommand per operation.
#include <cstdio>
#include <cstring>
#include <exception>

#include "bench_cli.h"
#include "hdk/version.h"

namespace {

const hdk::bench::Command kCommands[] = {
    {"gdn", "Gated DeltaNet decode (time, GB/s, % of copy bandwidth, --verify)",
     hdk::bench::gdn_command},
    {"floor", "in-place read-modify-write floors of the GPU (flat, per-warp, indexed)",
     hdk::bench::floor_command},
    {"router", "DeepSeek-V4 router: fused gate GEMM + top-k (time, % of copy bw, --verify)",
     hdk::bench::router_command},
    {"topk", "hdk::topk over [N, L] rows (time, % of copy bandwidth, --verify)",
     hdk::bench::topk_command},
    {"kv", "DeepSeek-V4 KV cache: store/gather entries, compressor step (time, % of copy bw)",
     hdk::bench::kv_command},
    {"attention",
     "DeepSeek-V4 sparse_decode and index_topk (time, % of copy bw on KV bytes, --verify)",
     hdk::bench::attention_command},
    {"dsv4-step",
     "DeepSeek-V4 one layer's decode step in one CUDA graph, per kernel and whole (x floor)",
     hdk::bench::dsv4_step_command},
};

void print_commands() {
  std::printf("hdk-bench %s%s\nusage: hdk-bench <command> [options]   (--help per command)\n\n",
              hdk::version(), hdk::built_with_cuda() ? " (CUDA)" : " (CPU only)");
  for (const auto& command : kCommands)
    std::printf("  %-9s %s\n", command.name, command.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_commands();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& command : kCommands) {
    if (std::strcmp(argv[1], command.name) != 0) continue;
    try {
      hdk::bench::Options options(argc, argv, 2);
      return command.run(options);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "hdk-bench %s: %s\n", command.name, error.what());
      return 2;
    }
  }
  std::fprintf(stderr, "hdk-bench: unknown command '%s'\n\n", argv[1]);
  print_commands();
  return 2;
}

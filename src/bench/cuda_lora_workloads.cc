// The `lora-merge` workload of `vortex bench`: what a LoRA switch costs per transformer block of the
// released model (h3 preset widths: to_q / to_k / to_v 7168 x 5376, to_out 5376 x 7168, FC1
// 28672 x 5376, FC2 5376 x 14336), with a rank-64 adapter on all six linears.
//
// Timed: h3::lora_merging_filler writing the six merged weights into device tensors as a switch
// writes them (host bf16 weights through pinned staging, the factors' upload, the device merge).
// derived: the same switch with a DoRA adapter; the plain upload of the six weights (the floor a
// switch cannot go below: the base must come back from the host); the host merge of the block
// (h3::merge_loras on every core, what a switch cost before) and its upload; and both scaled to a
// whole model's num_layers blocks. Correctness: the device merge's weights, plain and DoRA, against
// the host merge's, bit for bit (bound 0).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "bench/cuda_bench_util.h"
#include "bench/cuda_workloads.h"
#include "models/h3/config.h"
#include "models/h3/cuda_lora_merge.h"

namespace vortex::bench {

namespace {

constexpr int64_t kRank = 64;
constexpr int kHostRepetitions = 3;

// One adapter on every linear of the block, rank 64, alpha 64 (scale 1).
h3::LoraAdapter block_adapter(const std::vector<BlockLinear>& linears, uint64_t seed, bool dora) {
  h3::LoraAdapter a;
  a.path = dora ? "synthetic DoRA" : "synthetic LoRA";
  for (size_t i = 0; i < linears.size(); ++i) {
    const BlockLinear& l = linears[i];
    h3::LoraModule m;
    m.target = l.name;
    m.source = l.name + ".lora_A.weight";
    m.down = normal_f32({kRank, l.in}, seed + 10 * i, 0.02f);
    m.up = normal_f32({l.out, kRank}, seed + 10 * i + 1, 0.02f);
    if (dora) m.magnitude = normal_f32({l.out}, seed + 10 * i + 2, 0.01f, 1.0f);
    a.modules.push_back(std::move(m));
  }
  return a;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

Result<std::vector<Manifest>> run_lora_workload(const BenchOptions& o) {
  if (o.warmup < 3 || o.repetitions < 10) {
    return invalid_argument("the protocol needs >= 3 warm-ups and >= 10 repetitions (DESIGN section 4)");
  }
  if (o.workload != "lora-merge") return invalid_argument("unknown LoRA workload '" + o.workload + "' (lora-merge)");
  VORTEX_ASSIGN_OR_RETURN(const h3::H3Config config, h3::config_preset("h3"));
  const std::vector<BlockLinear> linears = block_linears(config);
  h3::NamedTensors base;
  std::vector<h3::TensorSpec> specs;
  std::vector<Tensor> targets;
  VORTEX_ASSIGN_OR_RETURN(cuda::DeviceArena arena, cuda::DeviceArena::create([&] {
    size_t bytes = 0;
    for (const BlockLinear& l : linears) bytes += cuda::DeviceArena::bytes_for({l.out, l.in}, DType::kBF16);
    return bytes;
  }()));
  for (size_t i = 0; i < linears.size(); ++i) {
    const BlockLinear& l = linears[i];
    VORTEX_ASSIGN_OR_RETURN(Tensor weight, normal_f32({l.out, l.in}, o.seed + 1000 + i, 0.02f).to(DType::kBF16));
    base.emplace_back(l.name + ".weight", weight);
    specs.push_back({l.name + ".weight", Shape{l.out, l.in}, false});
    VORTEX_ASSIGN_OR_RETURN(Tensor dst, arena.alloc({l.out, l.in}, DType::kBF16));
    targets.push_back(dst);
  }
  const auto stack_of = [&](bool dora) {
    auto stack = std::make_shared<h3::LoraStack>();
    stack->adapters.push_back(block_adapter(linears, o.seed + (dora ? 500 : 0), dora));
    stack->strengths.push_back(0.8);
    return std::shared_ptr<const h3::LoraStack>(stack);
  };
  const auto plain = stack_of(false), dora = stack_of(true);
  // The host's time in the fills (until the last returns, before finish and the sync), per sample:
  // where it is near the switch's, the host's staging bounds the switch, not the device.
  std::vector<double> host_fill_ms;
  const auto fill_all = [&](const h3::WeightFiller& fill) -> Status {
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < specs.size(); ++i) VORTEX_RETURN_IF_ERROR(fill(specs[i], targets[i]));
    const auto filled = std::chrono::steady_clock::now();
    host_fill_ms.push_back(std::chrono::duration<double, std::milli>(filled - start).count());
    VORTEX_RETURN_IF_ERROR(fill.finish());
    VORTEX_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    return ok_status();
  };
  const h3::WeightFiller merging = h3::lora_merging_filler(base, plain, DType::kBF16, nullptr);
  VORTEX_ASSIGN_OR_RETURN(auto timer, Timer::create());
  // The median of the host's fill times of the samples just measured (the warm-ups' left out).
  const auto host_fill_median = [&] {
    const size_t reps = std::min(host_fill_ms.size(), static_cast<size_t>(o.repetitions));
    const double median = median_of({host_fill_ms.end() - static_cast<std::ptrdiff_t>(reps), host_fill_ms.end()});
    host_fill_ms.clear();
    return median;
  };
  VORTEX_ASSIGN_OR_RETURN(const Samples samples, timer->measure(o, nullptr, [&] { return fill_all(merging); }));
  const double host_fill_plain_ms = host_fill_median();
  const h3::WeightFiller merging_dora = h3::lora_merging_filler(base, dora, DType::kBF16, nullptr);
  VORTEX_ASSIGN_OR_RETURN(const Samples dora_samples, timer->measure(o, nullptr, [&] { return fill_all(merging_dora); }));
  const double host_fill_dora_ms = host_fill_median();
  const h3::WeightFiller upload = h3::host_weight_filler(base, nullptr);
  VORTEX_ASSIGN_OR_RETURN(const Samples upload_samples, timer->measure(o, nullptr, [&] { return fill_all(upload); }));
  const double host_fill_upload_ms = host_fill_median();

  // The host merge, as a switch ran it before (its result is also the correctness reference).
  std::fprintf(stderr, "vortex bench: the host merge of one block, %d times\n", kHostRepetitions);
  std::vector<double> host_ms;
  h3::NamedTensors host_merged;
  for (int i = 0; i < kHostRepetitions; ++i) {
    host_merged = base;
    const auto start = std::chrono::steady_clock::now();
    VORTEX_RETURN_IF_ERROR(h3::merge_loras(host_merged, plain->applications(), DType::kBF16));
    host_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  VORTEX_RETURN_IF_ERROR(fill_all(merging));
  VORTEX_ASSIGN_OR_RETURN(const auto plain_pair, concatenated_bf16(targets, host_merged));
  // The DoRA switch's weights too (its row norms run kernels of their own).
  h3::NamedTensors host_dora = base;
  const auto dora_start = std::chrono::steady_clock::now();
  VORTEX_RETURN_IF_ERROR(h3::merge_loras(host_dora, dora->applications(), DType::kBF16));
  const double host_dora_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - dora_start).count();
  VORTEX_RETURN_IF_ERROR(fill_all(merging_dora));
  VORTEX_ASSIGN_OR_RETURN(const auto dora_pair, concatenated_bf16(targets, host_dora));
  const auto joined = [](const Tensor& a, const Tensor& b) {
    Tensor t = Tensor::empty({a.numel() + b.numel()}, DType::kBF16);
    std::memcpy(t.data(), a.data(), a.nbytes());
    std::memcpy(static_cast<char*>(t.data()) + a.nbytes(), b.data(), b.nbytes());
    return t;
  };

  const double layers = static_cast<double>(config.num_layers);
  const double host_merge_ms = median_of(host_ms);
  Manifest m;
  m.workload = o.workload;
  m.samples = samples;
  double params = 0;
  for (const BlockLinear& l : linears) params += static_cast<double>(l.out * l.in);
  m.derived = {
      {"weights_per_block", params},
      {"gb_per_s_host_to_device (bf16 weights / median)", params * 2 / (samples.median() * 1e-3) / 1e9},
      {"dora_switch_ms_per_block (median)", dora_samples.median()},
      {"upload_only_ms_per_block (median; the floor)", upload_samples.median()},
      {"host_fill_ms_per_block (median; the host's time in the fills, before finish and the sync)",
       {{"device_merge", host_fill_plain_ms},
        {"device_merge_dora", host_fill_dora_ms},
        {"upload_only", host_fill_upload_ms}}},
      {"host_merge_ms_per_block (median of 3, merge_loras)", host_merge_ms},
      {"host_merge_dora_ms_per_block (one run, merge_loras)", host_dora_ms},
      {"host_threads", std::thread::hardware_concurrency()},
      {"model_switch_s (num_layers blocks)",
       {{"device_merge", samples.median() * layers / 1e3},
        {"device_merge_dora", dora_samples.median() * layers / 1e3},
        {"host_merge_then_upload", (host_merge_ms + upload_samples.median()) * layers / 1e3},
        {"upload_only", upload_samples.median() * layers / 1e3}}},
      {"speedup_over_host_merge_then_upload", (host_merge_ms + upload_samples.median()) / samples.median()}};
  m.workload_section = {{"name", m.workload},
                        {"config", "h3 preset (the released widths), one transformer block's six linears"},
                        {"num_layers", config.num_layers},
                        {"adapter", "rank 64, alpha 64, strength 0.8 on to_q, to_k, to_v, to_out.0, ff.net.0.proj, ff.net.2"},
                        {"weights", "synthetic bf16 N(0, 0.02) on the host, as a checkpoint's are"},
                        {"seed", o.seed}};
  m.protocol = protocol_json(o);
  m.protocol["timed"] = "the six weights written through h3::lora_merging_filler (staged upload, factors, device merge)";
  VORTEX_ASSIGN_OR_RETURN(m.environment, environment_json(o));
  m.implementation = {{"backend", "cuda"},
                      {"merge", "cuda::lora_merge: fp32 chains over the rank with the host's rounding points, "
                                "rounded once to bf16; DoRA row norms as double FMA chains"}};
  m.correctness = compare(joined(plain_pair.first, dora_pair.first), joined(plain_pair.second, dora_pair.second),
                          "the host merge (h3::merge_loras) of the plain and the DoRA adapter, bit for bit", 0.0);
  return std::vector<Manifest>{std::move(m)};
}

}  // namespace vortex::bench

#include "models/h3/device_memory_plan.h"

#include <algorithm>

#include "models/h3/weights.h"

namespace vortex::h3 {

namespace {

// The device arenas align every allocation to 256 bytes (cuda::DeviceArena::kAlignment).
constexpr size_t kAlignment = 256;

size_t bytes(int64_t n, int64_t w, int64_t element_size) { return static_cast<size_t>(n * w * element_size) + kAlignment; }

size_t aligned(size_t b) { return (b + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

bool is_block_linear_weight(const std::string& name) {
  if (name.rfind("transformer_blocks.", 0) != 0) return false;
  for (const char* suffix : {".attn.to_q.weight", ".attn.to_k.weight", ".attn.to_v.weight", ".attn.to_out.0.weight",
                             ".ff.net.0.proj.weight", ".ff.net.2.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

bool is_block_adaln_weight(const std::string& name) {
  return name.rfind("transformer_blocks.", 0) == 0 && name.find(".adaln_proj.linear.") != std::string::npos;
}

Status check_cuda_fp8_widths(const H3Config& config) {
  for (auto [name, width] : {std::pair{"hidden_size", config.hidden_size}, std::pair{"inner dim", config.inner_dim()},
                             std::pair{"ffn_dim", config.ffn_dim}}) {
    if (width % 16 != 0) {
      return invalid_argument(std::string("the fp8 recipe needs ") + name + " to be a multiple of 16, got " +
                              std::to_string(width));
    }
  }
  return check_fp8_attention_width(config);
}

size_t device_weight_bytes(const H3Config& config, LinearRecipe recipe, bool adaln_resident) {
  const bool fp8 = recipe == LinearRecipe::kFp8;
  size_t total = 0;
  for (const auto& spec : diffusers_schema(config)) {
    if (!adaln_resident && is_block_adaln_weight(spec.name)) continue;
    if (fp8 && is_block_linear_weight(spec.name)) {
      // e4m3 codes + one fp32 scale per row (the out projection: per row and 128 inputs)
      const int64_t scales_per_row = spec.name.ends_with(".attn.to_out.0.weight") ? spec.shape[1] / 128 : 1;
      total += static_cast<size_t>(spec.shape.numel() + 4 * scales_per_row * spec.shape[0]) + 2 * kAlignment;
    } else {
      total += static_cast<size_t>(spec.shape.numel()) * (spec.fp32_island ? 4 : 2) + kAlignment;
    }
  }
  return total;
}

ActivationPlan plan_activations(const H3Config& c, int64_t rows, LinearRecipe recipe, bool keep_attention_inputs,
                                bool planned_tables, int64_t block_rows) {
  const int64_t N = rows, B = block_rows > 0 ? std::min(block_rows, rows) : rows;
  const int64_t C = c.hidden_size, inner = c.inner_dim(), F = c.ffn_dim, T = kDeviceMaxTimesteps;
  ActivationPlan p;
  p.attention_bytes = bytes(B, 3 * inner, 2) + bytes(B, inner, 2);
  const size_t ffn_bytes = bytes(B, 2 * F, 2);
  p.shared_bytes = keep_attention_inputs ? p.attention_bytes + ffn_bytes : std::max(p.attention_bytes, ffn_bytes);
  p.qkv_slot = aligned(static_cast<size_t>(B * 3 * inner) * 2);
  // FC1's memory holds B · 2F bf16 values, B · F / C fp32 rows of C.
  const int64_t embed_rows_in_fc1 = std::min(N, B * F / C);
  p.embeds_alias = embed_rows_in_fc1 == N || (B < N && embed_rows_in_fc1 >= 1);
  p.embed_rows = p.embeds_alias ? embed_rows_in_fc1 : N;
  p.widest_input = std::max({C, inner, F});
  p.codes_alias = p.widest_input <= 2 * F;

  size_t total = bytes(N, C, 2) + 2 * bytes(B, C, 2) + p.shared_bytes + bytes(B, F, 2);  // x; h, branch; shared; SwiGLU
  total += 2 * bytes(N, c.rotary_dim(), 4);                             // RoPE cos, sin
  total += 3 * bytes(N, 1, 8) + 2 * bytes(N, 1, 4);                     // row indices
  total += bytes(T, c.time_embed_dim, 2) + bytes(T, 18 * C, 2) + bytes(T, 2 * C, 2);  // step tables
  total += 2 * bytes(N, c.video_patch_dim(), 4) + 2 * bytes(N, c.audio_in_channels, 4);  // inputs, outputs
  if (planned_tables) total += c.num_layers * bytes(T, 18 * C, 2);
  if (!p.embeds_alias) total += bytes(N, C, 4);
  if (recipe == LinearRecipe::kFp8) {
    total += (p.codes_alias ? 0 : bytes(B, p.widest_input, 1)) + bytes(B, 1, 4) + (size_t{64} << 20);  // + fp8 GEMM workspace
    total += bytes((B + 127) / 128, (c.num_attention_heads + 3) / 4 * 4, 4);  // the attention output's tile scales
  }
  total += (size_t{64} << 20) + (size_t{1} << 20);  // bf16 GEMM workspace and slack
  p.total = total;
  return p;
}

}  // namespace vortex::h3

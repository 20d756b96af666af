// Host memory of the CPU video decode: decode_video's allocations replayed in program order on a
// ledger, so that the peak is the one the code reaches rather than a sum of everything it ever
// allocates. Each replay function names the decode function it mirrors; a change to the decode's
// buffers must change this file too (tests/test_vae_memory.cc measures the process's peak RSS on
// small clips and fails when the two drift apart).
#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "models/vae/video_vae.h"

namespace vortex::vae {

namespace {

enum Holder { kWeights, kLatents, kFrames, kClip, kTile, kScratch, kHolders };

// Buffers with reference counts, as Tensor storage has: a view or a contiguous() that did not
// copy shares its source, and the bytes go when the last handle does. Keeps the bytes alive per
// holder now, and a snapshot of them at the highest total so far.
class Ledger {
 public:
  using Id = size_t;

  Id alloc(Holder h, int64_t bytes, const char* step) {
    buffers_.push_back({h, static_cast<size_t>(bytes), 1});
    now_[h] += static_cast<size_t>(bytes);
    size_t total = 0;
    for (size_t b : now_) total += b;
    if (total > peak_total_) {
      peak_total_ = total;
      peak_ = now_;
      step_ = step;
    }
    return buffers_.size() - 1;
  }
  Id share(Id id) {
    ++buffers_[id].refs;
    return id;
  }
  void drop(Id id) {
    Buffer& b = buffers_[id];
    if (--b.refs == 0) now_[b.holder] -= b.bytes;
  }
  // slice_copy of a dim of `size` down to `kept`, with `outer` elements in the dims before it:
  // contiguous() copies unless the slice is the whole dim or nothing precedes it.
  Id slice(Id src, int64_t outer, int64_t size, int64_t kept, Holder h, int64_t bytes, const char* step) {
    return kept == size || outer == 1 ? share(src) : alloc(h, bytes, step);
  }

  VideoVaeCpuMemory peak() const {
    VideoVaeCpuMemory m;
    m.weights = peak_[kWeights];
    m.latents = peak_[kLatents];
    m.frames = peak_[kFrames];
    m.clip = peak_[kClip];
    m.tile = peak_[kTile];
    m.scratch = peak_[kScratch];
    m.peak = step_;
    return m;
  }

 private:
  struct Buffer {
    Holder holder;
    size_t bytes;
    int refs;
  };
  std::vector<Buffer> buffers_;
  std::array<size_t, kHolders> now_{}, peak_{};
  size_t peak_total_ = 0;
  std::string step_;
};

constexpr int64_t kF32 = 4;

class DecodeReplay {
 public:
  DecodeReplay(const VideoVaeConfig& c, const VideoTiling& tiling, int threads)
      : c_(c), tiling_(tiling), threads_(threads) {}

  // decode_video (video_vae_decode.cc).
  VideoVaeCpuMemory run(const Shape& latents) {
    int64_t weights = 0;
    for (const auto& spec : video_vae_decoder_schema(c_)) weights += spec.shape.numel() * kF32;
    L_.alloc(kWeights, weights, "weights");
    const int64_t C = latents[0], T = latents[1], H = latents[2], W = latents[3];
    const int64_t r = c_.spatial_ratio(), oc = c_.out_channels;
    frame_bytes_ = oc * H * r * W * r * kF32;
    const Ledger::Id x = L_.alloc(kLatents, C * T * H * W * kF32, "de-normalising the latents");

    const int64_t chunk = c_.tokens_chunk_size(), chunk_frames = chunk * c_.temporal_ratio();
    const int64_t pre = c_.frame_pre_padding();
    const int64_t num_chunks = (T + c_.token_drop) / chunk - (c_.token_drop > 0 ? 1 : 0);
    std::vector<Ledger::Id> parts;
    std::optional<Ledger::Id> overlap;  // the cross-fade tail
    int64_t frames = 0, tail_frames = 0;
    for (int64_t i = 0; i < num_chunks; ++i) {
      const int64_t t0 = i * chunk, t1 = std::min(T, t0 + chunk + c_.token_overlap()), Tc = t1 - t0;
      const Ledger::Id z = L_.slice(x, C, T, Tc, kLatents, C * Tc * H * W * kF32, "slicing a chunk's latents");
      const Ledger::Id clip = decode_clip(z, Tc, H, W);
      const int64_t clip_frames = Tc * c_.temporal_ratio();
      for (int j = 0; j < (c_.token_drop > 0 ? 2 : 1); ++j) {
        // slice_copy(clip, frames [j·chunk_frames, (j + 1)·chunk_frames)), then without the pre-padding.
        const int64_t end = std::min(clip_frames, (j + 1) * chunk_frames);
        const int64_t cut_frames = end - std::min(end, j * chunk_frames);
        const int64_t kept_frames = cut_frames - std::min(pre, cut_frames);
        const Ledger::Id cut =
            L_.slice(clip, oc, clip_frames, cut_frames, kClip, cut_frames * frame_bytes_, "cutting a chunk's frames");
        Ledger::Id part =
            L_.slice(cut, oc, cut_frames, kept_frames, kFrames, kept_frames * frame_bytes_, "cutting a chunk's frames");
        L_.drop(cut);
        if (j == 0) {
          if (overlap) {  // blend_linear returns a new tensor
            const Ledger::Id blended = L_.alloc(kFrames, kept_frames * frame_bytes_, "cross-fading a chunk");
            L_.drop(part);
            part = blended;
          }
          parts.push_back(part);
          frames += kept_frames;
        } else {
          if (overlap) L_.drop(*overlap);
          overlap = part;
          tail_frames = kept_frames;
        }
      }
      L_.drop(clip);
      L_.drop(z);
    }
    if (overlap) {
      parts.push_back(*overlap);
      frames += tail_frames;
    }
    const Ledger::Id video = L_.alloc(kFrames, frames * frame_bytes_, "concatenating the frames");
    for (Ledger::Id p : parts) L_.drop(p);
    L_.drop(video);
    L_.drop(x);
    return L_.peak();
  }

 private:
  // decode_clip: the whole chunk, or its tiles decoded one by one and kept, then blended into a
  // new clip. Returns the clip's buffer.
  Ledger::Id decode_clip(Ledger::Id z, int64_t T, int64_t H, int64_t W) {
    if (!tiling_.enabled) return decode_chunk(T, H, W);
    const int64_t r = c_.spatial_ratio(), C = c_.latent_channels;
    const TileSplit ys = split_tiles(H * r, tiling_.tile_height, tiling_.min_overlap_height, r);
    const TileSplit xs = split_tiles(W * r, tiling_.tile_width, tiling_.min_overlap_width, r);
    const int64_t th = ys.tile / r, tw = xs.tile / r;
    std::vector<Ledger::Id> tiles;
    for (size_t k = 0; k < ys.starts.size() * xs.starts.size(); ++k) {
      const Ledger::Id rows = L_.slice(z, C * T, H, th, kLatents, C * T * th * W * kF32, "slicing a tile's latents");
      const Ledger::Id cells =
          L_.slice(rows, C * T * th, W, tw, kLatents, C * T * th * tw * kF32, "slicing a tile's latents");
      tiles.push_back(decode_chunk(T, th, tw));
      L_.drop(cells);
      L_.drop(rows);
    }
    if (tiles.size() == 1) return tiles[0];
    const Ledger::Id clip =
        L_.alloc(kClip, T * c_.temporal_ratio() * frame_bytes_, "stitching a chunk's tiles");
    // blend_linear returns a new tensor: a tile with neighbours above and to the left holds two
    // blended copies at once (the second is made from the first).
    const int64_t tile_bytes = c_.out_channels * T * c_.temporal_ratio() * ys.tile * xs.tile * kF32;
    std::vector<Ledger::Id> blends;
    if (ys.starts.size() > 1) blends.push_back(L_.alloc(kClip, tile_bytes, "stitching a chunk's tiles"));
    if (xs.starts.size() > 1) blends.push_back(L_.alloc(kClip, tile_bytes, "stitching a chunk's tiles"));
    for (Ledger::Id b : blends) L_.drop(b);
    for (Ledger::Id t : tiles) L_.drop(t);
    return clip;
  }

  // decode_video_chunk (video_vae.cc) on T x H x W latents: its buffers live until it returns,
  // when only `out` stays.
  Ledger::Id decode_chunk(int64_t T, int64_t H, int64_t W) {
    const int64_t C = c_.latent_channels, N = T * H * W, rows = N + c_.decoder_num_register_tokens + 1;
    const int64_t dim = c_.decoder_dim(), ffn = c_.decoder_ffn_dim();
    const int64_t blocks[] = {
        N * C,                     // zt, the token-major latents
        N * C,                     // pq, post_quant_conv's output
        rows * dim,                // x, the residual stream
        2 * rows * c_.rope_dim(),  // cos, sin
        5 * rows * dim,            // h, q, k, v, o
        rows * 2 * ffn,            // u, ff_in's output
        rows * ffn,                // g, the SwiGLU
        rows * dim,                // branch
    };
    std::vector<Ledger::Id> held;
    for (int64_t b : blocks) held.push_back(L_.alloc(kTile, b * kF32, "a tile's transformer blocks"));
    if (c_.decoder_num_layers > 0) {
      // cpu::attention: one scratch per parallel_for chunk (at most one per thread) for the call.
      const int64_t D = c_.decoder_attention_head_dim, q_rows = std::min(cpu::kQueryBlock, rows);
      const int64_t tasks = c_.decoder_num_attention_heads * ((rows + cpu::kQueryBlock - 1) / cpu::kQueryBlock);
      const int64_t chunks = std::min<int64_t>(threads_, tasks);
      L_.drop(L_.alloc(kScratch, chunks * (2 * rows * D + 2 * q_rows * D + q_rows * rows) * kF32,
                       "a tile's attention"));
    }
    held.push_back(L_.alloc(kTile, rows * dim * kF32, "a tile's output projection"));  // normed
    held.push_back(L_.alloc(kTile, rows * c_.patch_values() * kF32, "a tile's output projection"));  // y
    const int64_t p = c_.spatial_ratio();
    const Ledger::Id out =
        L_.alloc(kClip, c_.out_channels * T * c_.temporal_ratio() * H * p * W * p * kF32, "unpatchifying a tile");
    for (Ledger::Id b : held) L_.drop(b);
    return out;
  }

  const VideoVaeConfig& c_;
  const VideoTiling& tiling_;
  const int threads_;
  int64_t frame_bytes_ = 0;  // one output frame, all channels
  Ledger L_;
};

}  // namespace

Result<VideoVaeCpuMemory> video_vae_cpu_memory(const VideoVaeConfig& config, const Shape& latent_shape,
                                               const VideoTiling& tiling, int threads) {
  VORTEX_RETURN_IF_ERROR(config.validate());
  VORTEX_RETURN_IF_ERROR(check_video_latent_shape(config, latent_shape));
  VORTEX_RETURN_IF_ERROR(validate_tiling(tiling, config.spatial_ratio()));
  if (threads < 1) return invalid_argument("video VAE memory: threads " + std::to_string(threads) + " must be >= 1");
  return DecodeReplay(config, tiling, threads).run(latent_shape);
}

}  // namespace vortex::vae

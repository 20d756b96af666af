// Shared by the audio VAE's GPU tests (decoder and encoder).
#pragma once

#include <string>

#include "gpu/gpu_test_util.h"
#include "models/vae/audio_vae.h"

namespace vortex::test {

// A preset's config with non-identity latent statistics, so that the (de-)normalisation is exercised.
inline vae::AudioVaeConfig audio_config_with_statistics(const std::string& preset) {
  vae::AudioVaeConfig c = must(vae::audio_vae_config_preset(preset));
  for (int i = 0; i < c.latent_channels; ++i) {
    c.latents_mean[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
    c.latents_std[i] = 0.6f + 0.03f * static_cast<float>(i % 7);
  }
  return c;
}

}  // namespace vortex::test

// Writes the GGUF goldens with ggml itself (make_gguf_golden.sh builds this against a ggml
// checkout): quants.gguf holds one small tensor per ggml type vortex reads, quantized by ggml's own
// quantizers and written by its own GGUF writer, plus metadata of every value kind and a
// comfy.gguf.orig_shape entry; expected.gguf holds the same names as F32, each the values ggml's
// to_float gives for that tensor. tests/test_gguf.cc reads both.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

// Deterministic values with a spread of magnitudes and signs: a xorshift generator through a
// Box-Muller transform, scaled per row.
static uint64_t state = 0x9E3779B97F4A7C15ull;
static double uniform(void) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return ((state >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s QUANTS.gguf EXPECTED.gguf\n", argv[0]);
    return 2;
  }
  const enum ggml_type types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                  GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                                  GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
  const int n_types = (int)(sizeof(types) / sizeof(types[0]));
  const int64_t rows = 3, cols = 512;
  struct ggml_init_params params = {64 * 1024 * 1024, NULL, false};
  struct ggml_context* ctx = ggml_init(params);
  struct gguf_context* quants = gguf_init_empty();
  struct gguf_context* expected = gguf_init_empty();
  gguf_set_val_str(quants, "general.architecture", "h3");
  gguf_set_val_u32(quants, "general.quantization_version", 2);
  gguf_set_val_u8(quants, "test.u8", 200);
  gguf_set_val_i8(quants, "test.i8", -7);
  gguf_set_val_u16(quants, "test.u16", 65000);
  gguf_set_val_i16(quants, "test.i16", -300);
  gguf_set_val_i32(quants, "test.i32", -123456);
  gguf_set_val_f32(quants, "test.f32", 0.25f);
  gguf_set_val_u64(quants, "test.u64", 1ull << 40);
  gguf_set_val_i64(quants, "test.i64", -(1ll << 40));
  gguf_set_val_f64(quants, "test.f64", -2.5);
  gguf_set_val_bool(quants, "test.bool", true);
  const char* strings[] = {"one", "two words", ""};
  gguf_set_arr_str(quants, "test.strings", strings, 3);
  // The F16 tensor's shape as ComfyUI-GGUF records a reshaped one: [3, 2, 256] for ggml's (512, 3).
  const int32_t orig_shape[] = {3, 2, 256};
  gguf_set_arr_data(quants, "comfy.gguf.orig_shape.t.f16", GGUF_TYPE_INT32, orig_shape, 3);

  float* src = malloc(sizeof(float) * rows * cols);
  float* back = malloc(sizeof(float) * rows * cols);
  for (int t = 0; t < n_types; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      const float magnitude = r == 0 ? 0.02f : r == 1 ? 1.5f : 300.0f;
      for (int64_t c = 0; c < cols; ++c) src[r * cols + c] = normal() * magnitude;
    }
    char name[64];
    snprintf(name, sizeof(name), "t.%s", ggml_type_name(types[t]));
    for (char* p = name; *p; ++p) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    struct ggml_tensor* q = ggml_new_tensor_2d(ctx, types[t], cols, rows);
    ggml_set_name(q, name);
    ggml_quantize_chunk(types[t], src, q->data, 0, rows, cols, NULL);
    gguf_add_tensor(quants, q);
    if (types[t] == GGML_TYPE_F32) {
      memcpy(back, q->data, sizeof(float) * rows * cols);
    } else {
      ggml_get_type_traits(types[t])->to_float(q->data, back, rows * cols);
    }
    struct ggml_tensor* e = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, rows);
    ggml_set_name(e, name);
    memcpy(e->data, back, sizeof(float) * rows * cols);
    gguf_add_tensor(expected, e);
  }
  // A 1-D tensor and a 3-D one, for the shape order.
  struct ggml_tensor* bias = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 5);
  ggml_set_name(bias, "v.bias");
  for (int i = 0; i < 5; ++i) ((float*)bias->data)[i] = (float)i - 2.0f;
  gguf_add_tensor(quants, bias);
  struct ggml_tensor* cube = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4, 3, 2);
  ggml_set_name(cube, "v.cube");
  for (int i = 0; i < 24; ++i) ((float*)cube->data)[i] = (float)i;
  gguf_add_tensor(quants, cube);
  if (!gguf_write_to_file(quants, argv[1], false) || !gguf_write_to_file(expected, argv[2], false)) {
    fprintf(stderr, "writing failed\n");
    return 1;
  }
  free(src);
  free(back);
  gguf_free(quants);
  gguf_free(expected);
  ggml_free(ctx);
  return 0;
}

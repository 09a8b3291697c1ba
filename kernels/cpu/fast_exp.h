// exp(x) in plain arithmetic, so that a loop of it vectorizes (std::exp is a library call the
// compiler leaves scalar): 2^n * 2^f with f in [-1/2, 1/2] by Cephes' exp2f polynomial, relative
// error ~2e-7, as std::exp's float rounding. Below -87 it is 0 and above 88 it is float's
// largest power of two, as the true values are outside float's range.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

inline float fast_exp(float x) {
  const float t = std::min(std::max(x, -87.f), 88.f) * 1.44269504088896341f;  // log2(e)
  const float n = (t + 12582912.f) - 12582912.f;  // round to nearest: 1.5 * 2^23
  const float f = t - n;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

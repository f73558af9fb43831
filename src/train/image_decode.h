// Decoding one image file to 8-bit RGB and turning it into a normalized square, for the image
// folder source. Private to src/train.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opfuse::data {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // row-major, 3 bytes (R, G, B) per pixel
};

// JPEG through libturbojpeg, PNG through libpng, chosen by the file's first bytes. Grayscale,
// palette and 16-bit images come out as 8-bit RGB; an alpha channel is dropped. A JPEG may be
// decoded at a reduced scale as long as its shorter side stays at least `min_side`. Throws
// std::runtime_error("PATH: cannot decode image (reason)").
RgbImage decode_image(const std::string& path, int64_t min_side);

// Writes the image as a float32 [3, size, size] CHW block at `out`: the shorter side resized to
// `size`, the centre cropped, each channel normalized as (v/255 − mean) / std.
void resize_crop_normalize(const RgbImage& image, int64_t size, float* out);

}  // namespace opfuse::data

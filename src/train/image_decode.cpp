// Image file → 8-bit RGB (libturbojpeg, libpng) → normalized square crop.
#include "train/image_decode.h"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>

#include "opfuse/data.h"

namespace opfuse::data {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& reason) {
  throw std::runtime_error(fmt::format("{}: cannot decode image ({})", path, reason));
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "read error");
  return bytes;
}

bool is_jpeg(const std::vector<uint8_t>& b) { return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF; }
bool is_png(const std::vector<uint8_t>& b) { return b.size() >= 8 && png_sig_cmp(b.data(), 0, 8) == 0; }

// The smallest DCT scaling (1/8, 1/4, …) whose shorter side still covers `min_side`: a large photo
// decodes several times faster at reduced scale, and the resize after it aliases less.
tjscalingfactor jpeg_scale(int width, int height, int64_t min_side) {
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  tjscalingfactor best{1, 1};
  int best_side = std::min(width, height);
  for (int i = 0; i < count; ++i) {
    const int side = std::min(TJSCALED(width, factors[i]), TJSCALED(height, factors[i]));
    if (side >= min_side && side < best_side) best = factors[i], best_side = side;
  }
  return best;
}

// Warnings (a truncated file, extraneous bytes) still give a full image — grey where data is
// missing — as every common loader accepts; only errors refuse the file.
RgbImage decode_jpeg(const std::string& path, const std::vector<uint8_t>& bytes, int64_t min_side) {
  std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitDecompress(), tjDestroy);
  if (!tj) fail(path, "cannot create a libturbojpeg decompressor");
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.get(), bytes.data(), bytes.size(), &width, &height, &subsamp, &colorspace) != 0)
    fail(path, tjGetErrorStr2(tj.get()));
  const tjscalingfactor scale = jpeg_scale(width, height, min_side);
  RgbImage image;
  image.width = TJSCALED(width, scale);
  image.height = TJSCALED(height, scale);
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  if (tjDecompress2(tj.get(), bytes.data(), bytes.size(), image.pixels.data(), image.width, 0, image.height,
                    TJPF_RGB, 0) != 0 &&
      tjGetErrorCode(tj.get()) != TJERR_WARNING)
    fail(path, tjGetErrorStr2(tj.get()));
  return image;
}

// libpng's simplified API expands palette, grayscale and 16-bit to 8-bit RGBA; the alpha byte is
// then dropped without compositing, as PIL's convert("RGB") does (8-bit output is not premultiplied).
RgbImage decode_png(const std::string& path, const std::vector<uint8_t>& bytes) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) fail(path, png.message);
  png.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, rgba.data(), 0, nullptr)) {
    png_image_free(&png);
    fail(path, png.message);
  }
  RgbImage image;
  image.width = static_cast<int>(png.width);
  image.height = static_cast<int>(png.height);
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  for (size_t p = 0, n = static_cast<size_t>(image.width) * image.height; p < n; ++p)
    std::copy_n(&rgba[4 * p], 3, &image.pixels[3 * p]);
  return image;
}

// Bilinear taps along one axis with half-pixel centres (align_corners=false): output index o of
// the crop sits at u = o + ½ + offset in the resized image, i.e. at u·scale − ½ in the source.
struct Tap {
  int lo, hi;
  float frac;
};

std::vector<Tap> taps(int source_len, int64_t out_len, double scale, double offset) {
  std::vector<Tap> t(out_len);
  for (int64_t o = 0; o < out_len; ++o) {
    const double s = std::clamp((o + 0.5 + offset) * scale - 0.5, 0.0, source_len - 1.0);
    const int lo = static_cast<int>(s);
    t[o] = {lo, std::min(lo + 1, source_len - 1), static_cast<float>(s - lo)};
  }
  return t;
}

}  // namespace

RgbImage decode_image(const std::string& path, int64_t min_side) {
  const std::vector<uint8_t> bytes = read_file(path);
  // By content, not extension: real data sets hold PNGs named .jpg.
  if (is_jpeg(bytes)) return decode_jpeg(path, bytes, min_side);
  if (is_png(bytes)) return decode_png(path, bytes);
  fail(path, bytes.empty() ? "empty file" : "neither a JPEG nor a PNG file");
}

// Shorter side to `size`, centre crop: the resized image is width/scale × height/scale with
// scale = min(width, height)/size, and the crop starts (resized − size)/2 in along each axis.
void resize_crop_normalize(const RgbImage& image, int64_t size, float* out) {
  const double scale = static_cast<double>(std::min(image.width, image.height)) / size;
  const auto xs = taps(image.width, size, scale, (image.width / scale - size) / 2);
  const auto ys = taps(image.height, size, scale, (image.height / scale - size) / 2);
  const uint8_t* px = image.pixels.data();
  const auto at = [&](int y, int x, int c) { return static_cast<float>(px[(static_cast<size_t>(y) * image.width + x) * 3 + c]); };
  for (int c = 0; c < 3; ++c) {
    const float gain = 1.0f / (255.0f * kStd[c]), bias = kMean[c] / kStd[c];
    float* plane = out + c * size * size;
    for (int64_t oy = 0; oy < size; ++oy) {
      const Tap& ty = ys[oy];
      for (int64_t ox = 0; ox < size; ++ox) {
        const Tap& tx = xs[ox];
        const float top = at(ty.lo, tx.lo, c) + tx.frac * (at(ty.lo, tx.hi, c) - at(ty.lo, tx.lo, c));
        const float bottom = at(ty.hi, tx.lo, c) + tx.frac * (at(ty.hi, tx.hi, c) - at(ty.hi, tx.lo, c));
        plane[oy * size + ox] = (top + ty.frac * (bottom - top)) * gain - bias;
      }
    }
  }
}

}  // namespace opfuse::data

// The batch sources of `opfuse train`: synthetic determinism, and image folders built at test time
// from real JPEG (libturbojpeg) and PNG (libpng) files.
//
// Tolerance: a solid-colour JPEG at quality 95 decodes to within ±3 of its 8-bit value per channel
// (colour conversion rounding), i.e. 3/(255·std) after normalization; PNG is exact, and bilinear
// resizing keeps a constant image constant.
#include <gtest/gtest.h>
#include <png.h>
#include <torch/torch.h>
#include <turbojpeg.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "../temp_dir.h"
#include "opfuse/data.h"
#include "train/image_decode.h"

namespace opfuse::data {
namespace {

namespace fs = std::filesystem;
using Rgb = std::array<int, 3>;

using opfuse::testing::TempDir;

std::vector<uint8_t> solid(int w, int h, std::vector<uint8_t> pixel) {
  std::vector<uint8_t> out;
  for (int i = 0; i < w * h; ++i) out.insert(out.end(), pixel.begin(), pixel.end());
  return out;
}

void write_bytes(const fs::path& path, const void* data, size_t size) {
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// gray: one byte per pixel, TJSAMP_GRAY; otherwise RGB with the given chroma subsampling.
void write_jpeg(const fs::path& path, int w, int h, const std::vector<uint8_t>& pixels, bool gray,
                int subsamp = TJSAMP_444) {
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, pixels.data(), w, 0, h, gray ? TJPF_GRAY : TJPF_RGB, &jpeg, &size,
                             gray ? TJSAMP_GRAY : subsamp, 95, 0);
  ASSERT_EQ(rc, 0) << tjGetErrorStr2(tj);
  write_bytes(path, jpeg, size);
  tjFree(jpeg);
  tjDestroy(tj);
}

void write_png(const fs::path& path, int w, int h, const std::vector<uint8_t>& pixels, png_uint_32 format) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = w;
  png.height = h;
  png.format = format;
  ASSERT_TRUE(png_image_write_to_file(&png, path.c_str(), 0, pixels.data(), 0, nullptr)) << png.message;
}

float normalized(int value, int c) { return (value / 255.0f - kMean[c]) / kStd[c]; }

// The 8-bit colour of a decoded solid image, from its mean; checks the image is in fact solid.
Rgb colour_of(const at::Tensor& image) {
  Rgb rgb{};
  for (int c = 0; c < 3; ++c) {
    const at::Tensor plane = image[c];
    EXPECT_LT((plane.max() - plane.min()).item<float>(), 2 * 3 / (255 * kStd[c])) << "channel " << c << " not solid";
    rgb[c] = static_cast<int>(std::lround((plane.mean().item<float>() * kStd[c] + kMean[c]) * 255));
  }
  return rgb;
}

bool near(const Rgb& a, const Rgb& b) {
  for (int c = 0; c < 3; ++c)
    if (std::abs(a[c] - b[c]) > 3) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Synthetic

TEST(SyntheticSource, SameSeedGivesSameBatches) {
  auto a = synthetic_source(4, 16, 10, 7), b = synthetic_source(4, 16, 10, 7);
  for (int i = 0; i < 3; ++i) {
    const Batch x = a->next(), y = b->next();
    EXPECT_TRUE(x.images.equal(y.images)) << "batch " << i;
    EXPECT_TRUE(x.labels.equal(y.labels)) << "batch " << i;
  }
}

TEST(SyntheticSource, DifferentSeedsAndSuccessiveBatchesDiffer) {
  auto a = synthetic_source(4, 16, 10, 7), b = synthetic_source(4, 16, 10, 8);
  const Batch first = a->next(), second = a->next(), other = b->next();
  EXPECT_FALSE(first.images.equal(other.images));
  EXPECT_FALSE(first.images.equal(second.images));
}

TEST(SyntheticSource, ShapesDtypesAndLabelRange) {
  auto source = synthetic_source(64, 8, 5, 1);
  EXPECT_EQ(source->num_classes(), 5);
  EXPECT_EQ(source->describe(), "synthetic 3x8x8, 5 classes");
  const Batch b = source->next();
  EXPECT_EQ(b.images.sizes(), at::IntArrayRef({64, 3, 8, 8}));
  EXPECT_EQ(b.images.scalar_type(), at::kFloat);
  EXPECT_EQ(b.labels.sizes(), at::IntArrayRef({64}));
  EXPECT_EQ(b.labels.scalar_type(), at::kLong);
  EXPECT_GE(b.labels.min().item<int64_t>(), 0);
  EXPECT_LT(b.labels.max().item<int64_t>(), 5);
  EXPECT_NE(b.labels.min().item<int64_t>(), b.labels.max().item<int64_t>());  // not one constant label
  EXPECT_NEAR(b.images.std().item<float>(), 1.0, 0.1);
}

TEST(SyntheticSource, RejectsBadSizes) {
  EXPECT_THROW(synthetic_source(0, 8, 5, 1), std::invalid_argument);
  EXPECT_THROW(synthetic_source(2, 0, 5, 1), std::invalid_argument);
  EXPECT_THROW(synthetic_source(2, 8, 0, 1), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Resizing, against ATen's bilinear interpolation (align_corners=false) as the reference

at::Tensor reference_resize(const RgbImage& img, int64_t out_h, int64_t out_w) {
  at::Tensor hwc = torch::from_blob(const_cast<uint8_t*>(img.pixels.data()), {img.height, img.width, 3}, at::kByte);
  at::Tensor chw = hwc.permute({2, 0, 1}).to(at::kFloat).unsqueeze(0);
  at::Tensor resized = at::upsample_bilinear2d(chw, {out_h, out_w}, false)[0];
  const at::Tensor mean = torch::tensor({kMean[0], kMean[1], kMean[2]}).view({3, 1, 1});
  const at::Tensor stddev = torch::tensor({kStd[0], kStd[1], kStd[2]}).view({3, 1, 1});
  return (resized / 255 - mean) / stddev;
}

RgbImage random_image(int w, int h) {
  RgbImage img{w, h, {}};
  std::mt19937 rng(w * 131 + h);
  for (int i = 0; i < w * h * 3; ++i) img.pixels.push_back(static_cast<uint8_t>(rng() % 256));
  return img;
}

TEST(ResizeCropNormalize, SquareMatchesATenBilinear) {
  for (auto [side, size] : {std::pair{10, 4}, {7, 16}, {5, 5}}) {
    const RgbImage img = random_image(side, side);
    at::Tensor out = at::empty({3, size, size});
    resize_crop_normalize(img, size, out.data_ptr<float>());
    EXPECT_TRUE(out.allclose(reference_resize(img, size, size), 1e-5, 1e-5)) << side << " -> " << size;
  }
}

// 8×4 to 2: the shorter side halves (4×2 resized), then columns 1..2 of the resized image are kept.
TEST(ResizeCropNormalize, WideImageIsCentreCropped) {
  const RgbImage img = random_image(8, 4);
  at::Tensor out = at::empty({3, 2, 2});
  resize_crop_normalize(img, 2, out.data_ptr<float>());
  const at::Tensor expected = reference_resize(img, 2, 4).slice(2, 1, 3);
  EXPECT_TRUE(out.allclose(expected, 1e-5, 1e-5)) << out << expected;
}

// ---------------------------------------------------------------------------------------------
// Image folder

struct Written {
  Rgb colour;
  int64_t label;
};

// Six solid images of different sizes, colour types and formats in three classes, plus an empty
// class folder and a file that is not an image. Each colour is distinct, so it identifies the file.
std::vector<Written> write_folder(const TempDir& dir) {
  const fs::path a = dir.sub("a_colour"), b = dir.sub("b_gray"), c = dir.sub("c_png");
  dir.sub("d_empty");
  write_jpeg(a / "red.jpg", 40, 30, solid(40, 30, {200, 30, 60}), false);
  write_jpeg(a / "BLUE.JPG", 64, 64, solid(64, 64, {20, 120, 220}), false, TJSAMP_420);
  write_jpeg(b / "gray.jpeg", 17, 64, solid(17, 64, {128}), true);
  write_png(b / "gray.png", 31, 9, solid(31, 9, {77}), PNG_FORMAT_GRAY);
  write_png(c / "yellow.PNG", 50, 50, solid(50, 50, {240, 240, 10}), PNG_FORMAT_RGB);
  write_png(c / "green_alpha.png", 33, 20, solid(33, 20, {10, 200, 30, 100}), PNG_FORMAT_RGBA);
  std::ofstream(c / "notes.txt") << "not an image\n";
  return {{{200, 30, 60}, 0}, {{20, 120, 220}, 0}, {{128, 128, 128}, 1},
          {{77, 77, 77}, 1},  {{240, 240, 10}, 2}, {{10, 200, 30}, 2}};
}

// Which written image a decoded one is, by colour; -1 if none.
int identify(const at::Tensor& image, const std::vector<Written>& written) {
  const Rgb rgb = colour_of(image);
  for (size_t i = 0; i < written.size(); ++i)
    if (near(rgb, written[i].colour)) return static_cast<int>(i);
  ADD_FAILURE() << "decoded colour " << rgb[0] << "," << rgb[1] << "," << rgb[2] << " matches no written image";
  return -1;
}

TEST(ImageFolderSource, DecodesShapesColoursAndLabels) {
  TempDir dir;
  const auto written = write_folder(dir);
  auto source = image_folder_source(dir.str(), 3, 24, 1);
  EXPECT_EQ(source->num_classes(), 4);
  EXPECT_EQ(source->describe(), "image folder " + dir.str() + ": 6 images, 4 classes");
  for (int k = 0; k < 2; ++k) {
    const Batch b = source->next();
    ASSERT_EQ(b.images.sizes(), at::IntArrayRef({3, 3, 24, 24}));
    ASSERT_EQ(b.images.scalar_type(), at::kFloat);
    ASSERT_EQ(b.labels.sizes(), at::IntArrayRef({3}));
    ASSERT_EQ(b.labels.scalar_type(), at::kLong);
    for (int64_t i = 0; i < 3; ++i) {
      const int id = identify(b.images[i], written);
      if (id < 0) continue;
      EXPECT_EQ(b.labels[i].item<int64_t>(), written[id].label) << "image " << id;
      for (int c = 0; c < 3; ++c)
        EXPECT_NEAR(b.images[i][c][5][7].item<float>(), normalized(written[id].colour[c], c), 3 / (255 * kStd[c]));
    }
  }
}

// Batches of 4 over 6 images straddle epochs: each run of 6 consecutive samples is a permutation.
TEST(ImageFolderSource, EveryImageOncePerEpoch) {
  TempDir dir;
  const auto written = write_folder(dir);
  auto source = image_folder_source(dir.str(), 4, 8, 3);
  std::vector<int> stream;
  for (int k = 0; k < 6; ++k) {
    const Batch b = source->next();
    for (int64_t i = 0; i < 4; ++i) stream.push_back(identify(b.images[i], written));
  }
  std::vector<std::vector<int>> epochs;
  for (size_t e = 0; e < stream.size() / 6; ++e) {
    std::vector<int> epoch(stream.begin() + 6 * e, stream.begin() + 6 * (e + 1));
    EXPECT_EQ(std::set<int>(epoch.begin(), epoch.end()), (std::set<int>{0, 1, 2, 3, 4, 5})) << "epoch " << e;
    epochs.push_back(epoch);
  }
  EXPECT_TRUE(epochs[0] != epochs[1] || epochs[1] != epochs[2] || epochs[2] != epochs[3]) << "never reshuffled";
}

TEST(ImageFolderSource, SameSeedSameBatchesWhateverTheThreadCount) {
  TempDir dir;
  write_folder(dir);
  auto one = image_folder_source(dir.str(), 4, 8, 11, 1), three = image_folder_source(dir.str(), 4, 8, 11, 3);
  auto other = image_folder_source(dir.str(), 4, 8, 12, 2);
  bool differs = false;
  for (int k = 0; k < 4; ++k) {
    const Batch x = one->next(), y = three->next(), z = other->next();
    EXPECT_TRUE(x.images.equal(y.images)) << "batch " << k;
    EXPECT_TRUE(x.labels.equal(y.labels)) << "batch " << k;
    differs = differs || !x.images.equal(z.images);
  }
  EXPECT_TRUE(differs) << "seeds 11 and 12 gave the same order";
}

TEST(ImageFolderSource, DestroyedWhilePrefetchingJoins) {
  TempDir dir;
  write_jpeg(dir.sub("only") / "big.jpg", 640, 480, solid(640, 480, {9, 99, 199}), false);
  for (int round = 0; round < 3; ++round) {
    auto source = image_folder_source(dir.str(), 16, 64, round, 2);
    if (round > 0) source->next();  // round 0 is destroyed before any next()
  }
}

// ---------------------------------------------------------------------------------------------
// Errors

void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected one containing '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ImageFolderErrors, BadFolders) {
  TempDir dir;
  const std::string missing = dir.str() + "/missing";
  expect_invalid([&] { image_folder_source(missing, 2, 8, 0); }, missing + ": no such folder");
  std::ofstream(dir.sub("x") / "file.jpg") << "x";
  const std::string file = (fs::path(dir.str()) / "x" / "file.jpg").string();
  expect_invalid([&] { image_folder_source(file, 2, 8, 0); }, file + ": not a folder");
  const std::string empty = dir.sub("empty").string();
  expect_invalid([&] { image_folder_source(empty, 2, 8, 0); }, empty + ": no class subfolders");
  const fs::path classes = dir.sub("classes");
  fs::create_directories(classes / "cat");
  fs::create_directories(classes / "dog");
  std::ofstream(classes / "dog" / "readme.txt") << "no images here";
  expect_invalid([&] { image_folder_source(classes.string(), 2, 8, 0); },
                 classes.string() + ": no .jpg/.jpeg/.png images in any class subfolder");
}

TEST(ImageFolderErrors, BadSizes) {
  TempDir dir;
  write_folder(dir);
  expect_invalid([&] { image_folder_source(dir.str(), 0, 8, 0); }, dir.str());
  expect_invalid([&] { image_folder_source(dir.str(), 2, 0, 0); }, dir.str());
  expect_invalid([&] { image_folder_source(dir.str(), 2, 8, 0, 0); }, dir.str());
}

// Random bytes, and random bytes behind a JPEG signature (so libturbojpeg itself refuses them):
// next() throws on the caller's thread naming the file, and the source still shuts down.
TEST(ImageFolderErrors, CorruptImageThrowsFromNext) {
  std::mt19937 rng(5);
  for (const bool jpeg_signature : {false, true}) {
    TempDir dir;
    std::vector<uint8_t> junk(500);
    for (auto& byte : junk) byte = static_cast<uint8_t>(rng());
    if (jpeg_signature) junk[0] = 0xFF, junk[1] = 0xD8, junk[2] = 0xFF;
    const fs::path bad = dir.sub("c") / "corrupt.jpg";
    write_bytes(bad, junk.data(), junk.size());
    auto source = image_folder_source(dir.str(), 1, 8, 0);
    try {
      source->next();
      ADD_FAILURE() << "decoded random bytes";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(bad.string() + ": cannot decode image ("), std::string::npos) << what;
    }
    EXPECT_THROW(source->next(), std::runtime_error);  // the next epoch meets it again, no hang
  }
}

}  // namespace
}  // namespace opfuse::data

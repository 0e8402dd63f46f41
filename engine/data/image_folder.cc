#include "engine/data/image_folder.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::data {
namespace {

namespace fs = std::filesystem;

std::string lower_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}

bool is_png(const std::string& ext) { return ext == ".png"; }
bool is_jpeg(const std::string& ext) { return ext == ".jpg" || ext == ".jpeg"; }

std::vector<uint8_t> hwc_to_chw(const std::vector<uint8_t>& hwc, int64_t h, int64_t w, int64_t c) {
  std::vector<uint8_t> chw(hwc.size());
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k) chw[(k * h + y) * w + x] = hwc[(y * w + x) * c + k];
  return chw;
}

std::vector<uint8_t> decode_png(const std::string& path, int64_t channels, int64_t* height,
                                int64_t* width) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  MAMMOTH_CHECK(png_image_begin_read_from_file(&image, path.c_str()) != 0)
      << "[image_folder] " << path << " is not a readable PNG file: " << image.message;
  // Whatever the file's colour type, 8-bit RGB or gray; alpha is composited by libpng.
  image.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  std::vector<uint8_t> hwc(PNG_IMAGE_SIZE(image));
  const int ok = png_image_finish_read(&image, nullptr, hwc.data(), 0, nullptr);
  const std::string message = image.message;
  png_image_free(&image);
  MAMMOTH_CHECK(ok != 0) << "[image_folder] " << path << " is not a valid PNG file: " << message;
  *height = image.height;
  *width = image.width;
  return hwc_to_chw(hwc, *height, *width, channels);
}

// libjpeg reports errors through error_exit, which must not return: jump back to the decoder
// with the message (no C++ object with a destructor lives between setjmp and longjmp).
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

extern "C" void jpeg_error_exit(j_common_ptr cinfo) {
  JpegError* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Decodes `bytes` into `out` (h * w * channels interleaved); false with err->message set on a
// libjpeg error.
bool decode_jpeg_bytes(const std::vector<uint8_t>& bytes, int64_t channels,
                       std::vector<uint8_t>* out, int64_t* height, int64_t* width, JpegError* err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_error_exit;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_start_decompress(&cinfo);
  *height = cinfo.output_height;
  *width = cinfo.output_width;
  const size_t row = static_cast<size_t>(cinfo.output_width) * cinfo.output_components;
  out->resize(row * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW p = out->data() + row * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &p, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

std::vector<uint8_t> decode_jpeg(const std::string& path, int64_t channels, int64_t* height,
                                 int64_t* width) {
  std::ifstream f(path, std::ios::binary);
  MAMMOTH_CHECK(f.good()) << "[image_folder] cannot read " << path;
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                   std::istreambuf_iterator<char>());
  MAMMOTH_CHECK(!bytes.empty()) << "[image_folder] " << path << " is empty, not a JPEG file";
  std::vector<uint8_t> hwc;
  JpegError err{};
  const bool ok = decode_jpeg_bytes(bytes, channels, &hwc, height, width, &err);
  MAMMOTH_CHECK(ok) << "[image_folder] " << path << " is not a valid JPEG file: " << err.message;
  return hwc_to_chw(hwc, *height, *width, channels);
}

}  // namespace

std::vector<uint8_t> decode_image(const std::string& path, int64_t channels, int64_t* height,
                                  int64_t* width) {
  MAMMOTH_CHECK(channels == 1 || channels == 3)
      << "[image_folder] images decode to 1 (gray) or 3 (RGB) channels, not " << channels;
  const std::string ext = lower_extension(path);
  if (is_png(ext)) return decode_png(path, channels, height, width);
  MAMMOTH_CHECK(is_jpeg(ext)) << "[image_folder] " << path
                              << " is not an image file (.png, .jpg or .jpeg)";
  return decode_jpeg(path, channels, height, width);
}

void write_png(const std::string& path, const uint8_t* hwc, int64_t height, int64_t width,
               int64_t channels) {
  MAMMOTH_CHECK(channels == 1 || channels == 3) << "[write_png] channels must be 1 or 3";
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  const int ok = png_image_write_to_file(&image, path.c_str(), 0, hwc, 0, nullptr);
  const std::string message = image.message;
  png_image_free(&image);
  MAMMOTH_CHECK(ok != 0) << "[write_png] cannot write " << path << ": " << message;
}

namespace {

bool encode_jpeg(std::FILE* f, const uint8_t* hwc, int64_t height, int64_t width, int64_t channels,
                 int quality, JpegError* err) {
  jpeg_compress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_error_exit;
  if (setjmp(err->jump)) {
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = static_cast<int>(channels);
  cinfo.in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t row = static_cast<size_t>(width * channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW p = const_cast<uint8_t*>(hwc) + row * cinfo.next_scanline;
    jpeg_write_scanlines(&cinfo, &p, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

}  // namespace

void write_jpeg(const std::string& path, const uint8_t* hwc, int64_t height, int64_t width,
                int64_t channels, int quality) {
  MAMMOTH_CHECK(channels == 1 || channels == 3) << "[write_jpeg] channels must be 1 or 3";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  MAMMOTH_CHECK(f != nullptr) << "[write_jpeg] cannot write " << path;
  JpegError err{};
  const bool ok = encode_jpeg(f, hwc, height, width, channels, quality, &err);
  const bool closed = std::fclose(f) == 0;
  MAMMOTH_CHECK(ok && closed) << "[write_jpeg] cannot write " << path << ": "
                              << (ok ? "close failed" : err.message);
}

namespace {

// One axis of a bilinear resize as Pillow computes it (its Resample.c, which transformers'
// ViTImageProcessor calls): the triangle filter widened by the scale when shrinking (so every
// source pixel counts: an antialiased reduction), weights normalised to sum 1 and then held in
// fixed point with kPrecisionBits fraction bits, each output rounded and clipped to 8 bits.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct AxisWeights {
  std::vector<int64_t> first;   // first source index of each output index
  std::vector<int64_t> count;   // number of source indices
  std::vector<int32_t> weight;  // out * stride: fixed-point weights
  int64_t stride = 0;
};

AxisWeights axis_weights(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;    // the triangle's support is 1
  const double inv_scale = 1.0 / filter_scale;  // multiplied, as Pillow does, for equal rounding
  AxisWeights a;
  a.stride = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  a.first.resize(static_cast<size_t>(out));
  a.count.resize(static_cast<size_t>(out));
  a.weight.assign(static_cast<size_t>(out * a.stride), 0);
  std::vector<double> k(static_cast<size_t>(a.stride));
  for (int64_t o = 0; o < out; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    const int64_t n = hi - lo;
    double total = 0;
    for (int64_t x = 0; x < n; ++x) {
      const double t = std::abs((static_cast<double>(x + lo) - center + 0.5) * inv_scale);
      k[static_cast<size_t>(x)] = t < 1.0 ? 1.0 - t : 0.0;
      total += k[static_cast<size_t>(x)];
    }
    for (int64_t x = 0; x < n; ++x) {
      const double v = total != 0 ? k[static_cast<size_t>(x)] / total : k[static_cast<size_t>(x)];
      const double fixed = v * static_cast<double>(1 << kPrecisionBits);
      a.weight[static_cast<size_t>(o * a.stride + x)] =
          static_cast<int32_t>(fixed < 0 ? std::trunc(fixed - 0.5) : std::trunc(fixed + 0.5));
    }
    a.first[static_cast<size_t>(o)] = lo;
    a.count[static_cast<size_t>(o)] = n;
  }
  return a;
}

uint8_t clip8(int64_t v) {
  return static_cast<uint8_t>(std::clamp<int64_t>(v >> kPrecisionBits, 0, 255));
}

}  // namespace

std::vector<uint8_t> resize_bilinear(const std::vector<uint8_t>& chw, int64_t channels,
                                     int64_t height, int64_t width, int64_t out_height,
                                     int64_t out_width) {
  MAMMOTH_CHECK(height > 0 && width > 0 && out_height > 0 && out_width > 0 &&
                static_cast<int64_t>(chw.size()) == channels * height * width)
      << "[image_folder] resize of a " << width << "x" << height << " image to " << out_width << "x"
      << out_height;
  const int64_t rounding = int64_t{1} << (kPrecisionBits - 1);
  // One axis of `planes` [rows, cols] planes resampled to `out` samples.
  auto pass = [&](const std::vector<uint8_t>& src, int64_t planes, int64_t rows, int64_t cols,
                  bool horizontal, int64_t out) {
    const int64_t n = horizontal ? cols : rows;
    const AxisWeights a = axis_weights(n, out);
    const int64_t out_rows = horizontal ? rows : out, out_cols = horizontal ? out : cols;
    std::vector<uint8_t> dst(static_cast<size_t>(planes * out_rows * out_cols));
    for (int64_t p = 0; p < planes; ++p) {
      const uint8_t* in = src.data() + p * rows * cols;
      uint8_t* o = dst.data() + p * out_rows * out_cols;
      for (int64_t r = 0; r < out_rows; ++r) {
        for (int64_t c = 0; c < out_cols; ++c) {
          const int64_t j = horizontal ? c : r;  // the output index along the resampled axis
          const int32_t* k = a.weight.data() + j * a.stride;
          const int64_t first = a.first[static_cast<size_t>(j)];
          int64_t sum = rounding;
          for (int64_t t = 0; t < a.count[static_cast<size_t>(j)]; ++t) {
            const int64_t at = horizontal ? r * cols + first + t : (first + t) * cols + c;
            sum += int64_t{in[at]} * k[t];
          }
          o[r * out_cols + c] = clip8(sum);
        }
      }
    }
    return dst;
  };
  // Pillow resamples each axis whose size changes, horizontally first unless the height shrinks
  // by more than twice as many pixels as the width does (Pillow 13; the two orders round
  // differently). The rule was read off Pillow 13.0 itself: it decides 1474 random size pairs
  // as stated (image_resize_interop_test checks both orders).
  const bool vertical_first = height > out_height && height - out_height > 2 * (width - out_width);
  std::vector<uint8_t> cur = chw;
  int64_t h = height, w = width;
  for (int step = 0; step < 2; ++step) {
    const bool horizontal = (step == 0) != vertical_first;
    if (horizontal && out_width != w) {
      cur = pass(cur, channels, h, w, true, out_width);
      w = out_width;
    } else if (!horizontal && out_height != h) {
      cur = pass(cur, channels, h, w, false, out_height);
      h = out_height;
    }
  }
  return cur;
}

bool image_processor_resizes(const std::string& model_dir, int64_t channels, int64_t image_size) {
  const std::string path = model_dir + "/preprocessor_config.json";
  if (!fs::exists(path)) return true;
  const json::Value c = json::parse_file(path);
  MAMMOTH_CHECK(c.is_object()) << "[image_folder] " << path << " is not a JSON object";
  const std::string where = "[image_folder] " + path + ": ";
  static const std::set<std::string> known = {"image_processor_type",
                                              "feature_extractor_type",
                                              "processor_class",
                                              "do_resize",
                                              "size",
                                              "resample",
                                              "do_rescale",
                                              "rescale_factor",
                                              "do_normalize",
                                              "image_mean",
                                              "image_std"};
  for (const json::Value& member : c) {
    MAMMOTH_CHECK(known.count(member.key()) > 0)
        << where << "key \"" << member.key()
        << "\" is not one ViTImageProcessor takes; not honoured";
  }
  for (const char* key : {"image_processor_type", "feature_extractor_type"}) {
    if (const json::Value* v = c.find(key)) {
      MAMMOTH_CHECK(v->is_string() && (v->as_string() == "ViTImageProcessor" ||
                                       v->as_string() == "ViTFeatureExtractor"))
          << where << key << " " << json::dump(*v)
          << ": only ViTImageProcessor's steps (resize, rescale, normalise) are implemented";
    }
  }
  auto flag = [&](const char* key) {
    const json::Value* v = c.find(key);
    return v == nullptr || v->is_null() || v->as_bool();  // ViTImageProcessor's defaults: true
  };
  const bool resize = flag("do_resize");
  if (const json::Value* v = c.find("size"); v != nullptr && resize) {
    int64_t h = -1, w = -1;
    if (v->is_object() && v->find("height") && v->find("width")) {
      h = v->at("height").as_int();
      w = v->at("width").as_int();
    } else if (v->is_number()) {
      h = w = v->as_int();
    }
    MAMMOTH_CHECK(h == image_size && w == image_size)
        << where << "size " << json::dump(*v) << " is not the model's image_size " << image_size;
  }
  if (const json::Value* v = c.find("resample"); v != nullptr && resize) {
    MAMMOTH_CHECK(v->is_number() && v->as_int() == 2)
        << where << "resample " << json::dump(*v) << ": only 2 (bilinear) is implemented";
  }
  MAMMOTH_CHECK(flag("do_rescale")) << where << "do_rescale false is not implemented";
  if (const json::Value* v = c.find("rescale_factor")) {
    MAMMOTH_CHECK(v->is_number() && std::abs(v->as_double() - 1.0 / 255.0) < 1e-12)
        << where << "rescale_factor " << json::dump(*v) << ": only 1/255 is implemented";
  }
  MAMMOTH_CHECK(flag("do_normalize")) << where << "do_normalize false is not implemented";
  for (const char* key : {"image_mean", "image_std"}) {
    if (const json::Value* v = c.find(key)) {
      bool half = v->is_number() && v->as_double() == 0.5;
      if (v->is_array()) {
        half = static_cast<int64_t>(v->size()) == channels;
        for (size_t i = 0; half && i < v->size(); ++i)
          half = (*v)[i].is_number() && (*v)[i].as_double() == 0.5;
      }
      MAMMOTH_CHECK(half) << where << key << " " << json::dump(*v)
                          << ": only 0.5 per channel is implemented ((p / 255 - 0.5) / 0.5)";
    }
  }
  return resize;
}

ImageExamples ImageExamples::open_folder(const std::string& dir, int64_t channels, int64_t size,
                                         bool resize) {
  MAMMOTH_CHECK(fs::is_directory(dir))
      << "[image_folder] " << dir << " is not a directory (DIR/<class>/*.png|jpg)";
  ImageExamples e;
  e.source_ = dir;
  e.channels_ = channels;
  e.image_size_ = size;
  std::vector<fs::path> class_dirs;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    MAMMOTH_CHECK(entry.is_directory()) << "[image_folder] " << entry.path().string()
                                        << " is not a class directory (images go in DIR/<class>/)";
    class_dirs.push_back(entry.path());
  }
  std::sort(class_dirs.begin(), class_dirs.end());
  MAMMOTH_CHECK(class_dirs.size() >= 2) << "[image_folder] " << dir << " has " << class_dirs.size()
                                        << " class directories; classification needs at least 2";
  const int64_t per_image = channels * size * size;
  for (size_t k = 0; k < class_dirs.size(); ++k) {
    e.classes_.push_back(class_dirs[k].filename().string());
    std::vector<fs::path> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(class_dirs[k])) {
      const std::string ext = lower_extension(entry.path());
      MAMMOTH_CHECK(entry.is_regular_file() && (is_png(ext) || is_jpeg(ext)))
          << "[image_folder] " << entry.path().string()
          << " is not an image file (.png, .jpg or .jpeg)";
      files.push_back(entry.path());
    }
    MAMMOTH_CHECK(!files.empty()) << "[image_folder] class directory " << class_dirs[k].string()
                                  << " has no images";
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      int64_t h = 0, w = 0;
      const std::vector<uint8_t> chw = decode_image(f.string(), channels, &h, &w);
      if (h == size && w == size) {
        e.pixels_.insert(e.pixels_.end(), chw.begin(), chw.begin() + per_image);
      } else {
        MAMMOTH_CHECK(resize) << "[image_folder] " << f.string() << " is " << w << "x" << h
                              << " pixels but the model takes " << size << "x" << size
                              << " and its preprocessor_config.json sets do_resize false";
        const std::vector<uint8_t> r = resize_bilinear(chw, channels, h, w, size, size);
        e.pixels_.insert(e.pixels_.end(), r.begin(), r.end());
        ++e.resized_;
      }
      e.labels_.push_back(static_cast<int32_t>(k));
    }
  }
  e.count_ = static_cast<int64_t>(e.labels_.size());
  return e;
}

ImageExamples ImageExamples::open_shard(const std::string& path, int64_t channels, int64_t size) {
  ImageExamples e;
  e.shard_.emplace(ImageShard::open(path));
  const ImageShardInfo& in = e.shard_->info();
  MAMMOTH_CHECK(in.channels == channels && in.height == size && in.width == size)
      << "[image_folder] image shard " << path << " holds " << in.channels << "x" << in.height
      << "x" << in.width << " images but the model takes " << channels << "x" << size << "x"
      << size;
  e.source_ = path;
  e.channels_ = channels;
  e.image_size_ = size;
  e.count_ = in.count;
  for (int64_t k = 0; k < in.num_classes; ++k) e.classes_.push_back(std::to_string(k));
  return e;
}

const uint8_t* ImageExamples::pixels(int64_t i) const {
  if (shard_) return shard_->pixels(i);
  return pixels_.data() + i * channels_ * image_size_ * image_size_;
}

int32_t ImageExamples::label(int64_t i) const {
  return shard_ ? shard_->label(i) : labels_[static_cast<size_t>(i)];
}

ExampleBatch ImageExamples::read(const std::vector<int64_t>& which) const {
  const int64_t n = static_cast<int64_t>(which.size()),
                per_image = channels_ * image_size_ * image_size_;
  ExampleBatch b;
  b.shape = {n, channels_, image_size_, image_size_};
  b.pixels.resize(static_cast<size_t>(n * per_image));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = which[static_cast<size_t>(j)];
    MAMMOTH_CHECK(i >= 0 && i < count_)
        << "[image_folder] image " << i << " outside the " << count_ << " of " << source_;
    const uint8_t* p = pixels(i);
    for (int64_t k = 0; k < per_image; ++k)
      b.pixels[static_cast<size_t>(j * per_image + k)] =
          (static_cast<float>(p[k]) / 255.0f - 0.5f) / 0.5f;
    b.labels.push_back(label(i));
  }
  return b;
}

std::string ImageExamples::describe() const {
  return std::string(shard_ ? "image shard " : "image folder ") + source_ + ": " +
         std::to_string(count_) + " images " + std::to_string(channels_) + "x" +
         std::to_string(image_size_) + "x" + std::to_string(image_size_) + ", " +
         std::to_string(classes_.size()) + " classes" +
         (resized_ > 0
              ? ", " + std::to_string(resized_) + " resized (bilinear, as ViTImageProcessor)"
              : "");
}

}  // namespace mammoth::data

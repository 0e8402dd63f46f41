#include "engine/data/image_folder.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/error.h"

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

ImageExamples ImageExamples::open_folder(const std::string& dir, int64_t channels, int64_t size) {
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
      MAMMOTH_CHECK(h == size && w == size)
          << "[image_folder] " << f.string() << " is " << w << "x" << h
          << " pixels but the model takes " << size << "x" << size
          << " (images are not resized; resize them beforehand)";
      e.pixels_.insert(e.pixels_.end(), chw.begin(), chw.begin() + per_image);
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
         std::to_string(classes_.size()) + " classes";
}

}  // namespace mammoth::data

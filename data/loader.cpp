// Data loader: order, background processing, collation.
#include "data/loader.h"

#include <algorithm>
#include <random>

#include "core/memory/category.h"
#include "core/ops/copy.h"

namespace hr::data {

using namespace hr::core;

OnBadSample parse_on_bad_sample(const std::string& s) {
  if (s == "skip") return OnBadSample::Skip;
  if (s == "fail") return OnBadSample::Fail;
  throw Error(str("[config] data.on_bad_sample '", s, "' is not one of: skip, fail"));
}

DataLoader::DataLoader(const LlavaDataset& data, const LoaderOptions& opt, LoaderPosition start)
    : data_(data), opt_(opt), pos_(start) {
  HR_CHECK(data.size() > 0, "[data] the dataset is empty");
  HR_CHECK(pos_.offset >= 0 && pos_.offset < data.size() && pos_.epoch >= 0 &&
               pos_.epoch <= (INT64_MAX - pos_.offset) / data.size(),
           "[data] loader position (epoch ", pos_.epoch, ", offset ", pos_.offset, ") is outside ", data.path(), "'s ",
           data.size(), " samples");
  next_to_start_ = consumed_ = pos_.epoch * data.size() + pos_.offset;
  start_workers();
}

DataLoader::~DataLoader() {
  stop_workers();
}

std::vector<int64_t> DataLoader::order_for(int64_t epoch) const {
  const int64_t n = data_.size();
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (!opt_.shuffle) return order;
  std::mt19937_64 rng(opt_.seed * 1000003 + uint64_t(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  if (!opt_.group_by_modality_length) return order;
  // LLaVA's modality-length grouping: batches hold one modality, and within a megabatch similar lengths.
  const int64_t mb = opt_.micro_batch * opt_.world * 8;
  std::vector<int64_t> mm, text;
  for (int64_t i : order) (data_.has_image(i) ? mm : text).push_back(i);
  std::vector<std::vector<int64_t>> batches;
  for (auto* group : {&mm, &text})
    for (std::size_t s = 0; s < group->size(); s += std::size_t(mb)) {
      auto b = group->begin() + long(s), e = group->begin() + long(std::min(group->size(), s + std::size_t(mb)));
      std::stable_sort(b, e, [&](int64_t x, int64_t y) { return data_.length(x) > data_.length(y); });
      for (auto it = b; it < e; it += opt_.micro_batch) batches.emplace_back(it, std::min(e, it + opt_.micro_batch));
    }
  std::shuffle(batches.begin(), batches.end(), rng);
  order.clear();
  for (const auto& b : batches) order.insert(order.end(), b.begin(), b.end());
  return order;
}

void DataLoader::start_workers() {
  for (int i = 0; i < std::max(1, opt_.workers); ++i) threads_.emplace_back([this] { worker_loop(); });
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void DataLoader::worker_loop() {
  MemoryScope scope(Category::IO, "loader");
  const int64_t n = data_.size();
  while (true) {
    int64_t k;
    int64_t index;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || next_to_start_ < consumed_ + opt_.prefetch; });
      if (stopping_) return;
      k = next_to_start_++;
      const int64_t epoch = k / n;
      auto order = orders_.find(epoch);
      if (order == orders_.end()) {  // a new epoch: the ones before it are done (workers start samples in order)
        orders_.erase(orders_.begin(), orders_.lower_bound(epoch));
        order = orders_.emplace(epoch, order_for(epoch)).first;
      }
      index = order->second[std::size_t(k % n)];
      slots_[k];
    }
    Slot result;
    result.index = index;
    try {
      result.example = std::make_unique<Example>(data_.get(index));
    } catch (const Error& e) {
      result.error = e.what();
    } catch (const std::exception& e) {  // anything else a library throws: a bad sample, not a dead thread
      result.error = str("[data] ", data_.name(index), ": ", e.what());
    }
    result.ready = true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slots_[k] = std::move(result);
    }
    cv_.notify_all();
  }
}

DataLoader::Slot DataLoader::take(int64_t k) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] {
    auto it = slots_.find(k);
    return it != slots_.end() && it->second.ready;
  });
  Slot s = std::move(slots_[k]);
  slots_.erase(k);
  consumed_ = k + 1;
  cv_.notify_all();
  return s;
}

// Each rank takes micro-batches round-robin from one global stream of samples: every rank's next one.
std::vector<std::vector<Example>> DataLoader::draw() {
  std::vector<std::vector<Example>> all(std::size_t(opt_.world));
  const int64_t n = data_.size();
  for (auto& mine : all) {
    while (int64_t(mine.size()) < opt_.micro_batch) {
      const int64_t k = pos_.epoch * n + pos_.offset;
      Slot s = take(k);
      if (++pos_.offset == n) pos_ = {pos_.epoch + 1, 0};
      if (!s.example) {
        if (opt_.on_bad_sample == OnBadSample::Fail) throw Error(s.error + " (data.on_bad_sample: fail)");
        ++skips_;
        if (bad_.insert(s.index).second) skipped_.push_back(s.error);
        // Every entry of the file is bad: there is nothing to train on.
        HR_CHECK(int64_t(bad_.size()) < n, "[data] no usable sample in ", data_.path(), " (", bad_.size(), " of ", n,
                 " skipped; the first: ", skipped_.front(), ")");
        continue;
      }
      if (s.example->masked && masked_seen_.insert(s.index).second) masked_.push_back(data_.name(s.index));
      mine.push_back(std::move(*s.example));
    }
  }
  return all;
}

LoadedBatch DataLoader::loaded(std::vector<Example> examples) const {
  LoadedBatch out;
  out.examples = std::move(examples);
  const int64_t ignore = -100;
  out.batch = collate(out.examples, batch_length(out.examples, opt_), ignore);
  bool truncated = false;
  for (const Example& e : out.examples) {
    out.tokens += int64_t(e.ids.size());
    truncated |= e.truncated;
  }
  out.no_labels_after_truncation = truncated && std::all_of(out.batch.labels.begin(), out.batch.labels.end(),
                                                            [&](int64_t l) { return l == ignore; });
  return out;
}

LoadedBatch DataLoader::next() {
  LoadedBatch out = loaded(std::move(draw()[std::size_t(opt_.rank)]));
  for (const Example& e : out.examples) images_dropped_ += e.images_dropped;
  return out;
}

std::vector<LoadedBatch> DataLoader::next_for_every_rank() {
  std::vector<LoadedBatch> out;
  for (std::vector<Example>& mine : draw()) out.push_back(loaded(std::move(mine)));
  return out;
}

int64_t batch_length(const std::vector<Example>& examples, const LoaderOptions& o) {
  if (o.pad_to_max_seq_len) return o.max_seq_len;
  int64_t seq = 0;
  for (const Example& e : examples) seq = std::max<int64_t>(seq, int64_t(e.ids.size()));
  const int64_t m = std::max<int64_t>(o.pad_to_multiple_of, 1);
  const int64_t rounded = (seq + m - 1) / m * m;
  return std::max(seq, std::min(rounded, o.max_seq_len));
}

Batch collate(const std::vector<Example>& ex, int64_t seq, int64_t ignore) {
  Batch b;
  b.batch = int64_t(ex.size());
  b.seq = seq;
  b.input_ids.assign(std::size_t(b.batch * seq), ByteTokenizer::kPad);
  b.labels.assign(std::size_t(b.batch * seq), ignore);
  // Each image is (3, size, size), or with AnyRes (crops, 3, size, size): pixel_values holds them one after another.
  int64_t crops = 0;
  Shape crop;
  for (std::size_t i = 0; i < ex.size(); ++i) {
    HR_CHECK(int64_t(ex[i].ids.size()) <= seq, "[data] sample ", ex[i].id, " has ", ex[i].ids.size(),
             " tokens, more than the batch length ", seq);
    std::copy(ex[i].ids.begin(), ex[i].ids.end(), b.input_ids.begin() + long(i) * seq);
    std::copy(ex[i].labels.begin(), ex[i].labels.end(), b.labels.begin() + long(i) * seq);
    for (const Tensor& img : ex[i].images) {
      crops += img.dim() == 4 ? img.size(0) : 1;
      crop = img.dim() == 4 ? Shape{img.size(1), img.size(2), img.size(3)} : img.shape();
    }
    b.image_sizes.insert(b.image_sizes.end(), ex[i].image_sizes.begin(), ex[i].image_sizes.end());
  }
  if (crops) {
    MemoryScope scope(Category::IO, "loader");
    b.pixel_values = Tensor::empty({crops, crop[0], crop[1], crop[2]}, DType::F32, Device::host());
    int64_t at = 0;
    for (const auto& e : ex)
      for (const Tensor& img : e.images) {
        const int64_t n = img.dim() == 4 ? img.size(0) : 1;
        copy_(b.pixel_values.slice(0, at, at + n), img.view({n, crop[0], crop[1], crop[2]}));
        at += n;
      }
  }
  return b;
}

}  // namespace hr::data

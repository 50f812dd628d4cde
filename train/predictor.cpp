// The planner's dry runs: the real engine on a meta device of its own, one training step (or an evaluation pass,
// a generation) at given shapes through the same caching allocator, its peaks and who reached them.
#include <algorithm>
#include <functional>

#include "core/memory/device_memory.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "models/anyres.h"
#include "train/engine.h"
#include "train/planner.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::models;
using namespace hr::data;

namespace {

const Device kMetaHost{DeviceType::Meta, 1};  // the host as a plan sees it: nothing is really allocated

// Follows one allocator's events: who reached the peak (the breakdown at it is MemoryStats::at_peak).
struct PeakWatch {
  CategoryBytes current{};
  int64_t allocated = 0, best = 0, activations_best = 0;
  std::string owner, activation_owner;

  explicit PeakWatch(const MemoryStats& s) {
    for (Category c : kAllCategories) current[std::size_t(c)] = s.category(c).current;
    allocated = best = s.allocated_bytes.current;
    activations_best = current[std::size_t(Category::Activations)];
  }
  void operator()(const TraceEvent& e) {
    const auto c = std::size_t(e.category);
    if (e.kind == TraceEvent::Kind::Alloc) {
      allocated += int64_t(e.size);
      current[c] += int64_t(e.size);
      if (allocated > best) {
        best = allocated;
        owner = e.owner ? *e.owner : "";
      }
      if (e.category == Category::Activations && current[c] > activations_best) {
        activations_best = current[c];
        activation_owner = e.owner ? *e.owner : "";
      }
    } else if (e.kind == TraceEvent::Kind::Free) {
      allocated -= int64_t(e.size);
      current[c] -= int64_t(e.size);
    }
  }
};

// A dry run's peaks from its allocators' statistics and the watch that followed its device allocations.
void record_peaks(Prediction& p, const MemoryStats& s, const MemoryStats& h, const PeakWatch& dw) {
  p.peak_allocated = s.allocated_bytes.peak;
  p.peak_reserved = s.reserved_bytes.peak;
  HR_ASSERT(p.peak_allocated == dw.best, "peak watch ", dw.best, " disagrees with the allocator's peak ",
            p.peak_allocated);
  p.at_peak = s.at_peak;
  for (Category c : kAllCategories) p.category_peaks[std::size_t(c)] = s.category(c).peak;
  p.peak_owner = dw.owner;
  p.activation_peak_owner = dw.activation_owner;
  p.host_peak = h.allocated_bytes.peak;
  p.host_at_peak = h.at_peak;
}

// The traces a dry run sets on its allocators, cleared however it ends: the peak watch, its request trace, and
// for a training step (headroom plan --trace) a timeline of both allocators and the step's spans.
class DryRunTraces {
 public:
  DryRunTraces(CachingAllocator& dev, CachingAllocator& host, PeakWatch& watch, RequestTrace& requests,
               Timeline* timeline)
      : dev_(dev), host_(host), spans_before_(span_timeline_slot().load()) {
    // The dry run's spans go to its own timeline or nowhere: a dry run inside a traced training step (the plan
    // of a planned step's shapes) must not write its phases into that step's timeline.
    set_span_timeline(timeline);
    const int dev_track = timeline ? timeline->add_allocator("device", dev.stats()) : -1;
    const int host_track = timeline ? timeline->add_allocator("host", host.stats(), Timeline::Advance::No) : -1;
    dev.set_trace([&watch, &requests, timeline, dev_track](const TraceEvent& e) {
      watch(e);
      requests.record(e);
      if (timeline) timeline->allocator_event(dev_track, e);
    });
    if (!timeline) return;
    host.set_trace([timeline, host_track](const TraceEvent& e) { timeline->allocator_event(host_track, e); });
  }
  ~DryRunTraces() {
    dev_.set_trace(nullptr);
    host_.set_trace(nullptr);
    set_span_timeline(spans_before_);
  }
  DryRunTraces(const DryRunTraces&) = delete;
  DryRunTraces& operator=(const DryRunTraces&) = delete;

 private:
  CachingAllocator &dev_, &host_;
  Timeline* spans_before_;  // the span timeline before the dry run, put back after it
};

// A dry run's micro-batches in turn. Micro-batches of one shape after the first (which creates the gradients) make
// the same requests; once one leaves both allocators exactly as the one before it did, every later one would too,
// and the rest are recorded as repetitions of it instead of being run: a dry run costs the same at any accumulation.
class MicroBatches {
 public:
  MicroBatches(const std::vector<MicroShape>& micro, bool last_differs, bool recording, CachingAllocator& dev,
               CachingAllocator& host, RequestTrace& requests)
      : micro_(micro),
        // The last micro-batch's backward may differ (Zero::last_backward_differs): it is never a repetition.
        last_(micro.size() - (last_differs ? 1 : 0)),
        recording_(recording),
        dev_(dev),
        host_(host),
        requests_(requests) {}

  // The next micro-batch's shape, as its draw starts.
  const MicroShape& next() {
    begins_.push_back(requests_.requests().size());
    return micro_[i_++];
  }

  // After micro-batch `k`: how many of the ones after it are recorded as its repetitions instead of being run.
  int64_t after(int64_t k) {
    const std::size_t at = std::size_t(k);
    // Only a micro-batch followed by one of its shape can be repeated, and never the first or the last: the
    // allocators are compared (snapshots cost a walk over every block) only where it can pay. A recorded dry run
    // runs every micro-batch.
    if (recording_ || at == 0 || at + 1 >= last_ || micro_[at + 1] != micro_[at]) return 0;
    AllocatorSnapshot dev_now = dev_.snapshot(), host_now = host_.snapshot();
    if (at >= 2 && micro_[at] == micro_[at - 1] &&
        requests_.periodic(begins_[at - 1], begins_[at], requests_.requests().size()) && dev_now == dev_was_ &&
        host_now == host_was_) {
      std::size_t rest = 0;
      while (at + 1 + rest < last_ && micro_[at + 1 + rest] == micro_[at]) ++rest;
      requests_.repeat_last(begins_[at], rest);
      repeated_ += int64_t(rest);
      i_ += rest;
      return int64_t(rest);
    }
    dev_was_ = std::move(dev_now);  // the micro-batch after this one, of the same shape, compares with these
    host_was_ = std::move(host_now);
    return 0;
  }

  int64_t repeated() const { return repeated_; }

 private:
  const std::vector<MicroShape>& micro_;
  const std::size_t last_;
  const bool recording_;
  CachingAllocator &dev_, &host_;
  RequestTrace& requests_;
  std::vector<std::size_t> begins_;  // where each micro-batch's requests start
  std::size_t i_ = 0;                // the next micro-batch's shape
  int64_t repeated_ = 0;
  AllocatorSnapshot dev_was_, host_was_;
};

}  // namespace

LoadedBatch synthetic_batch(const LlavaConfig& m, const MicroShape& s, Device host) {
  LoadedBatch lb;
  Batch& b = lb.batch;
  b.batch = s.batch;
  b.seq = s.seq;
  // Each image's placeholders and crops: tokens_per_image and one, or its AnyRes layout's.
  std::vector<int64_t> tokens(std::size_t(s.images), m.vision.tokens_per_image());
  int64_t crops = s.images;
  if (m.anyres.on()) {
    HR_CHECK(int64_t(s.image_sizes.size()) == s.images, "[plan] an AnyRes batch shape of ", s.images, " images has ",
             s.image_sizes.size(), " image sizes");
    crops = 0;
    for (std::size_t i = 0; i < s.image_sizes.size(); ++i) {
      tokens[i] = anyres_tokens(s.image_sizes[i], m.anyres, m.vision.image_size, m.vision.grid());
      crops += anyres_crops(s.image_sizes[i], m.anyres, m.vision.image_size);
    }
    b.image_sizes = s.image_sizes;
  }
  b.input_ids.assign(std::size_t(s.batch * s.seq), int64_t('a') + ByteTokenizer::kByteOffset);
  b.labels.assign(std::size_t(s.batch * s.seq), m.ignore_index);
  std::size_t image = 0;
  for (int64_t r = 0; r < s.batch; ++r) {
    const int64_t images = s.images / s.batch + (r < s.images % s.batch ? 1 : 0);
    int64_t placeholders = 0;
    for (int64_t i = 0; i < images; ++i) placeholders += tokens[image + std::size_t(i)];
    HR_CHECK(1 + placeholders < s.seq, "[plan] a sequence of ", s.seq, " tokens cannot hold ", images, " image(s) of ",
             placeholders, " tokens in all", m.anyres.on() ? " (AnyRes's largest layout)" : "",
             "; raise data.max_seq_len or lower data.max_images_per_sample");
    image += std::size_t(images);
    b.input_ids[std::size_t(r * s.seq)] = ByteTokenizer::kBos;
    for (int64_t t = 1; t <= placeholders; ++t) b.input_ids[std::size_t(r * s.seq + t)] = m.image_token_id;
  }
  // Padding-free: sequence r of the LLM is row r, labelled through its length's last position (every row, of the
  // whole length, where nothing packs), from the first position its tail reads (from position 1 without tails: the
  // whole row is read, so nothing trims).
  int64_t packed = 0, kept = 0;
  for (int64_t n : s.packed) {
    HR_CHECK(n >= 2 && n <= s.seq, "[plan] a packed sequence of ", n, " positions in rows of ", s.seq);
    packed += n;
  }
  const int64_t sequences = s.packed.empty() ? s.batch : int64_t(s.packed.size());
  HR_CHECK(sequences <= s.batch && (s.packed.empty() || packed < s.batch * s.seq), "[plan] ", s.batch, " rows of ",
           s.seq, " tokens cannot pack ", s.packed.size(), " sequences of ", packed, " positions in all");
  HR_CHECK(s.tails.empty() || int64_t(s.tails.size()) == sequences, "[plan] ", s.tails.size(), " tails for ", sequences,
           " sequences");
  for (int64_t r = 0; r < sequences; ++r) {
    const int64_t n = s.packed.empty() ? s.seq : s.packed[std::size_t(r)];
    const int64_t tail = s.tails.empty() ? n : s.tails[std::size_t(r)];
    HR_CHECK(tail >= 2 && tail <= n, "[plan] sequence ", r, " of ", n, " positions cannot have a tail of ", tail,
             " (the loss reads at least its last 2)");
    kept += tail;
    for (int64_t t = std::max<int64_t>(n - tail, 0) + 1; t < n; ++t)
      b.labels[std::size_t(r * s.seq + t)] = int64_t('a') + ByteTokenizer::kByteOffset;
  }
  HR_CHECK(s.tails.empty() || 2 * kept <= (s.packed.empty() ? s.batch * s.seq : packed), "[plan] tails of ", kept,
           " positions in all are over half the ", s.packed.empty() ? s.batch * s.seq : packed, " rows they are of");
  if (crops > 0) {
    MemoryScope scope(Category::IO, "loader");
    const Shape shape{crops, m.vision.channels, m.vision.image_size, m.vision.image_size};
    b.pixel_values =
        host.type == DeviceType::Meta ? Tensor::empty(shape, DType::F32, host) : Tensor::zeros(shape, DType::F32, host);
  }
  lb.tokens = s.batch * s.seq;
  return lb;
}

Predictor::Predictor(const RunConfig& c, int world, int rank, core::SizingTarget target, std::size_t capacity)
    : config_(c) {
  MemoryContext::Use use(memory_);
  configure_device(Device::meta(), {capacity, target, c.allocator});
  configure_device(kMetaHost, {0, target});
  comm_ = parallel::make_planned(world, rank);
  engine_ = std::make_unique<Engine>(config_, Device::meta(), *comm_);
  engine_->shard();
  // Planned: the trainer releases what starting left cached before the first step; so does the dry run.
  if (c.allocator == AllocatorKind::Planned) allocator_for(Device::meta())->empty_cache();
}

Predictor::~Predictor() = default;

std::vector<MicroShape> Predictor::worst_case() const {
  const int64_t m = config_.micro_batch_size, images = m * config_.max_images_per_sample;
  return std::vector<MicroShape>(std::size_t(config_.gradient_accumulation_steps),
                                 {m, config_.max_seq_len, images, worst_image_sizes(images)});
}

const Llava& Predictor::model() const {
  return engine_->model();
}

Prediction Predictor::step(const std::vector<MicroShape>& micro, StepRecording* rec,
                           std::optional<std::size_t> arena_held) {
  int64_t repeated = 0;
  Prediction p = dry_run(
      [&](RequestTrace& requests) {
        auto dev = allocator_for(Device::meta()), host = allocator_for(kMetaHost);
        const bool last_differs = engine_->zero().last_backward_differs();
        MicroBatches batches(micro, last_differs, rec != nullptr, *dev, *host, requests);
        engine_->step([&] { return synthetic_batch(config_.model.config, batches.next(), kMetaHost); },
                      int64_t(micro.size()), 1.f, [&](int64_t k) { return batches.after(k); });
        engine_->update(1e-3f, 1.f);
        repeated = batches.repeated();
      },
      rec, true, arena_held);
  p.micro_batches_repeated = repeated;
  return p;
}

int64_t Predictor::eval_rows() const {
  // Each rank evaluates its share of the samples, in batches of eval_batch_size.
  int64_t n = config_.eval_samples > 0 ? config_.eval_samples : 0;
  if (config_.eval_json.empty() && config_.synth_eval > 0)
    n = n > 0 ? std::min(n, config_.synth_eval) : config_.synth_eval;
  const int64_t world = comm_->world();
  return n > 0 ? std::max<int64_t>(1, std::min(config_.eval_batch_size, (n + world - 1) / world))
               : config_.eval_batch_size;
}

MicroShape shape_of(const data::Batch& b, const RunConfig& c) {
  MicroShape s{b.batch, b.seq, data::images_of(b), b.image_sizes};
  if (c.padding_free != PaddingFree::On) return s;
  // As Llava packs them: only the sequences it keeps, in order.
  const std::vector<int64_t> lengths = models::packed_lengths(b, c.model.config.ignore_index);
  for (int64_t n : lengths)
    if (n > 0) s.packed.push_back(n);
  s.tails = models::tail_lengths(b, c.model.config.ignore_index, lengths);
  return s;
}

data::Resolution planned_image(const RunConfig& c) {
  const LlavaConfig& m = c.model.config;
  if (c.plan_image)  // shrunk as the loader would shrink such an image
    return data::within_image_tokens(*c.plan_image, models::input_spec(m), c.max_image_tokens, "--image-size");
  int64_t room = (c.max_seq_len - 2) / std::max<int64_t>(c.max_images_per_sample, 1);
  if (c.max_image_tokens > 0) room = std::min(room, c.max_image_tokens);
  return anyres_worst_image(m.anyres, m.vision.image_size, m.vision.grid(), room);
}

// AnyRes: `images` images of the planned layout; none without AnyRes.
std::vector<data::Resolution> Predictor::worst_image_sizes(int64_t images) const {
  if (!config_.model.config.anyres.on()) return {};
  return std::vector<data::Resolution>(std::size_t(images), planned_image(config_));
}

EvalShape Predictor::eval_worst_case() const {
  const int64_t b = eval_rows(), images = b * config_.max_images_per_sample;
  return {b, config_.max_seq_len, images, b * config_.max_new_tokens, worst_image_sizes(images)};
}

GenerationShape Predictor::generation_worst_case() const {
  const int64_t b = eval_rows(), images = b * config_.max_images_per_sample;
  return {std::vector<int64_t>(std::size_t(b), config_.max_seq_len), images, config_.max_new_tokens, 1,
          worst_image_sizes(images)};
}

Prediction Predictor::dry_run(const std::function<void(RequestTrace&)>& pass, StepRecording* rec, bool stretch,
                              std::optional<std::size_t> arena_held) {
  MemoryContext::Use use(memory_);
  auto dev = allocator_for(Device::meta()), host = allocator_for(kMetaHost);
  dev->reset_peak_stats();
  host->reset_peak_stats();
  Prediction p;
  p.persistent = dev->stats().allocated_bytes.current;
  PeakWatch dw(dev->stats());
  auto requests = std::make_shared<RequestTrace>();
  if (rec) rec->start = dev->snapshot();
  // memory.allocator: planned: a step is a stretch that records; its layout is worked out from its requests.
  const bool planned = stretch && dev->kind() == AllocatorKind::Planned;
  {
    const DryRunTraces traces(*dev, *host, dw, *requests, rec ? rec->timeline : nullptr);
    if (planned) dev->begin_stretch(nullptr);
    pass(*requests);
  }
  requests->check();
  if (planned) {
    p.layout = arena_held ? layouts_.layout_of(*requests, *arena_held)
                          : std::make_shared<const ArenaLayout>(layout_arena(*requests));
    dev->end_stretch(p.layout);
  }
  record_peaks(p, dev->stats(), host->stats(), dw);
  p.requests = std::move(requests);
  return p;
}

void Predictor::begin_evaluation() {
  MemoryContext::Use use(memory_);
  if (config_.allocator == AllocatorKind::Planned) allocator_for(Device::meta())->empty_cache();
}

Prediction Predictor::evaluation(const EvalShape& e) {
  return dry_run([&](RequestTrace&) {
    const LoadedBatch lb = synthetic_batch(config_.model.config, {e.batch, e.seq, e.images, e.image_sizes}, kMetaHost);
    ModelOptions o;
    o.inference = true;
    o.ce_chunk_rows = config_.ce_chunk_rows;
    for (int64_t i = 0; i < e.logit_rows; ++i) o.logits_at.push_back(i % (e.batch * e.seq));
    LlavaState st;
    engine_->model().forward(lb.batch, st, o);
  });
}

Prediction Predictor::generation(const GenerationShape& g) {
  HR_CHECK(!g.prompt_lengths.empty() && g.max_new_tokens >= 1,
           "[plan] generation needs prompts and max_new_tokens >= 1");
  return dry_run([&](RequestTrace&) {
    const Llava& model = engine_->model();
    const int64_t B = int64_t(g.prompt_lengths.size());
    const int64_t longest = *std::max_element(g.prompt_lengths.begin(), g.prompt_lengths.end());
    // As generate() does it: the cache, the prompts' batch, the prefill, then decode steps.
    KvCache cache = model.make_cache(B, longest + g.max_new_tokens - 1);
    const LoadedBatch lb = synthetic_batch(model.config(), {B, longest, g.images, g.image_sizes}, kMetaHost);
    Tensor logits = model.prefill(lb.batch, g.prompt_lengths, cache);
    if (g.max_new_tokens > 1 && g.decode_steps > 0) {
      logits = Tensor();
      logits = model.decode(std::vector<int64_t>(std::size_t(B), ByteTokenizer::kPad), cache);
    }
  });
}

}  // namespace hr::train

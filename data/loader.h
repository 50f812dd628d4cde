// The data loader: a deterministic order (seeded shuffle per epoch, optional grouping by modality and
// length), background threads that process samples ahead into a bounded queue, collation into right-padded
// micro-batches, bad-sample handling, and a position to resume from.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"

namespace hr::data {

enum class OnBadSample : uint8_t { Skip, Fail };
OnBadSample parse_on_bad_sample(const std::string& s);

struct LoaderOptions {
  int64_t micro_batch = 1;
  int workers = 2;
  int prefetch = 8;  // samples processed ahead of the consumer
  uint64_t seed = 0;
  bool shuffle = true;
  bool group_by_modality_length = false;
  bool pad_to_max_seq_len = false;  // fixed shapes (exact planning), else pad to the longest in the batch
  int64_t pad_to_multiple_of = 1;   // ... rounded up to a multiple of this (at most max_seq_len)
  int64_t max_seq_len = 2048;
  OnBadSample on_bad_sample = OnBadSample::Skip;
  int rank = 0, world = 1;  // each rank reads every world-th micro-batch
};

// Where the loader stands: epoch and offset into that epoch's order (in samples).
struct LoaderPosition {
  int64_t epoch = 0, offset = 0;
};

struct LoadedBatch {
  Batch batch;
  std::vector<Example> examples;  // the samples, for eval and logging
  int64_t tokens = 0;             // non-pad tokens
  // data.max_seq_len cut samples of this batch and no label is left in it: nothing to learn (loss and gradient 0).
  bool no_labels_after_truncation = false;
};

class DataLoader {
 public:
  DataLoader(const LlavaDataset& data, const LoaderOptions& options, LoaderPosition start = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  LoadedBatch next();
  // Every rank's next micro-batch, in rank order (what `headroom plan --data-steps` dry-runs); next() is one of them.
  std::vector<LoadedBatch> next_for_every_rank();
  LoaderPosition position() const { return pos_; }
  // The bad samples met so far, each once (the first time it was skipped), with its name and reason.
  const std::vector<std::string>& skipped() const { return skipped_; }
  // How many times a bad sample was skipped (once per epoch for each).
  int64_t skips() const { return skips_; }
  // The samples met so far whose labels are all masked by LLaVA's "tokenization mismatch" rule, each once.
  const std::vector<std::string>& masked() const { return masked_; }
  // Images this rank's batches dropped with their placeholders (data.max_seq_len cut before or into them).
  int64_t images_dropped() const { return images_dropped_; }

 private:
  std::vector<int64_t> order_for(int64_t epoch) const;
  std::vector<std::vector<Example>> draw();
  LoadedBatch loaded(std::vector<Example> examples) const;
  void start_workers();
  void stop_workers();
  void worker_loop();
  // The processed sample at global stream index k (epoch * size + offset), waiting for a worker.
  struct Slot {
    bool ready = false;
    int64_t index = -1;  // in the dataset
    std::unique_ptr<Example> example;
    std::string error;
  };
  Slot take(int64_t k);

  const LlavaDataset& data_;
  LoaderOptions opt_;
  LoaderPosition pos_;
  std::map<int64_t, std::vector<int64_t>> orders_;  // the order of the epochs the workers are in
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<int64_t, Slot> slots_;
  int64_t next_to_start_ = 0, consumed_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::vector<std::string> skipped_;
  std::set<int64_t> bad_;  // dataset indices known to be bad
  std::vector<std::string> masked_;
  std::set<int64_t> masked_seen_;
  int64_t skips_ = 0;
  int64_t images_dropped_ = 0;
};

// The length a batch of `examples` is padded to: max_seq_len with pad_to_max_seq_len, else the longest sample
// rounded up to a multiple of pad_to_multiple_of, at most max_seq_len (what the planner's worst case assumes).
int64_t batch_length(const std::vector<Example>& examples, const LoaderOptions& options);

// Collates examples into a right-padded batch (pad id 0, label ignore_index) of length `seq`.
Batch collate(const std::vector<Example>& examples, int64_t seq, int64_t ignore_index);

}  // namespace hr::data

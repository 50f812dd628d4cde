// Activation offload: the kept tensors of checkpointed blocks wait on the host between forward and backward.
#include "models/activation_offload.h"

#include "core/memory/category.h"
#include "core/memory/timeline.h"
#include "core/ops/copy.h"

namespace hr::models {

using namespace hr::core;

namespace {

// Where a device's offloaded tensors go: the host, or a second meta device in a dry run (nothing is allocated).
Device host_of(Device device) {
  return device.type == DeviceType::Meta ? Device{DeviceType::Meta, 1} : Device::host();
}

}  // namespace

ActivationOffload::~ActivationOffload() {
  if (moving_) side_copies_done(device_);
}

void ActivationOffload::arrive() {
  if (!moving_) return;
  side_copies_done(device_);
  moving_ = false;
  for (auto& [field, host] : leaving_) *field = host;
  leaving_.clear();
  arriving_.clear();
}

void ActivationOffload::send(std::size_t index, std::vector<Tensor*> kept, const std::string& owner) {
  arrive();
  if (kept.empty()) return;
  MemoryScope scope(Category::Activations, owner);
  Block& b = blocks_[index];
  b.fields = std::move(kept);
  b.device = device_ = b.fields[0]->device();
  TraceSpan span("offload", "activations to the host");
  for (Tensor* f : b.fields) {
    Tensor host = Tensor::empty(f->shape(), f->dtype(), host_of(b.device));
    copy_side_(host, *f);
    leaving_.emplace_back(f, host);
  }
  moving_ = true;
}

void ActivationOffload::sent_all() {
  arrive();
}

void ActivationOffload::fetch(std::size_t index) {
  auto it = blocks_.find(index);
  if (it == blocks_.end() || it->second.fetched) return;
  Block& b = it->second;
  TraceSpan span("offload", "activations from the host");
  for (Tensor* f : b.fields) {
    Tensor dev = Tensor::empty(f->shape(), f->dtype(), b.device);
    copy_side_(dev, *f);
    arriving_.push_back(*f);
    *f = dev;
  }
  b.fetched = true;
  device_ = b.device;
  moving_ = true;
}

void ActivationOffload::before_backward(std::size_t index, const std::string& owner,
                                        const std::string* previous_owner) {
  {
    MemoryScope scope(Category::Activations, owner);
    fetch(index);  // not started ahead: the first block the backward meets that left
    arrive();
    blocks_.erase(index);
  }
  if (previous_owner) {
    MemoryScope ahead(Category::Activations, *previous_owner);
    fetch(index - 1);
  }
}

}  // namespace hr::models

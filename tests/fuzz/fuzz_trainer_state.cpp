// Fuzzes trainer_state.json as a resume reads it (parse_trainer_state, then the loader position against a data set
// of each size below): every value must come out of its type and range or as an hr::Error naming the file. What
// is accepted must be a position and a state the loader and the loss scaler can start from; anything else, or any
// other exception, is a finding.
#include <cmath>
#include <cstdint>
#include <string>

#include "train/checkpoint.h"

using namespace hr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  train::TrainerState st;
  try {
    st = train::parse_trainer_state(text, "fuzz/trainer_state.json");
  } catch (const Error&) {
    return 0;
  }
  if (st.step < 0 || st.optimizer_steps < 0 || st.optimizer_steps > st.step || st.skipped_steps < 0 ||
      st.loader.epoch < 0 || st.loader.offset < 0 || !std::isfinite(st.scaler.scale) || st.scaler.scale <= 0 ||
      st.scaler.iter < 0 || st.scaler.hysteresis_left < 0 || st.world_size < 1 || st.zero_stage < 0 ||
      st.zero_stage > 3)
    __builtin_trap();
  for (int64_t samples : {int64_t(1), int64_t(64), int64_t(1) << 40}) {
    try {
      train::check_loader_position(st, "fuzz", samples, "fuzz.json");
    } catch (const Error&) {
      continue;
    }
    // Accepted: the loader's global sample index epoch * samples + offset is representable.
    int64_t k = 0;
    if (st.loader.offset >= samples || __builtin_mul_overflow(st.loader.epoch, samples, &k) ||
        __builtin_add_overflow(k, st.loader.offset, &k))
      __builtin_trap();
  }
  return 0;
}

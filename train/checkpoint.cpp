// Atomic checkpoint directories, rotation, resume.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/io/atomic_file.h"
#include "models/weights.h"

namespace hr::train {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace hr::core;

namespace {

constexpr const char* kPrefix = "checkpoint-";

int64_t step_of(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind(kPrefix, 0) != 0) return -1;
  try {
    std::size_t used = 0;
    const int64_t s = std::stoll(name.substr(11), &used);
    return used == name.size() - 11 ? s : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Deletes a checkpoint directory without ever leaving a partial one under a checkpoint name: it is first
// renamed (atomically) out of the way, then removed.
void discard(const fs::path& dir) {
  const fs::path trash = dir.parent_path() / (".trash-" + dir.filename().string());
  fs::remove_all(trash);
  fs::rename(dir, trash);
  fs::remove_all(trash);
}

std::vector<std::pair<int64_t, fs::path>> checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, fs::path>> v;
  if (!fs::exists(output_dir)) return v;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    const int64_t s = step_of(e.path());
    if (s >= 0 && e.is_directory() && fs::exists(e.path() / "trainer_state.json")) v.emplace_back(s, e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

void save_checkpoint(const std::string& output_dir, const models::Llava& model, const optim::Optimizer& optimizer,
                     const TrainerState& st, int64_t keep_last) {
  const fs::path final_dir = fs::path(output_dir) / (kPrefix + std::to_string(st.step));
  const fs::path tmp = fs::path(output_dir) / (".tmp-" + std::string(kPrefix) + std::to_string(st.step));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_safetensors((tmp / "model.safetensors").string(), models::named_weights(model.params()));
  save_safetensors((tmp / "optimizer.safetensors").string(), optimizer.state());
  json j = {{"step", st.step},
            {"optimizer_steps", optimizer.steps()},
            {"loader", {{"epoch", st.loader.epoch}, {"offset", st.loader.offset}}},
            {"loss_scaler",
             {{"scale", st.scaler.scale}, {"iter", st.scaler.iter}, {"last_overflow", st.scaler.last_overflow},
              {"hysteresis_left", st.scaler.hysteresis_left}}},
            {"skipped_steps", st.skipped_steps}};
  {
    AtomicFile f((tmp / "trainer_state.json").string());
    const std::string text = j.dump(2) + "\n";
    f.write(text.data(), text.size());
    f.commit();
  }
  fsync_dir(tmp);
  if (fs::exists(final_dir)) discard(final_dir);
  fs::rename(tmp, final_dir);
  fsync_dir(output_dir);
  auto all = checkpoints(output_dir);
  for (std::size_t i = 0; i + std::size_t(keep_last) < all.size(); ++i) discard(all[i].second);
}

std::optional<std::string> latest_checkpoint(const std::string& output_dir) {
  auto all = checkpoints(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

TrainerState load_checkpoint(const std::string& dir, models::Llava& model, optim::Optimizer& optimizer) {
  const std::string state_path = dir + "/trainer_state.json";
  std::ifstream in(state_path);
  HR_CHECK(in, "[checkpoint] cannot read ", state_path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(str("[checkpoint] ", state_path, ": not valid JSON: ", e.what()));
  }
  TrainerState st;
  try {
    st.step = j.at("step");
    st.loader = {j.at("loader").at("epoch"), j.at("loader").at("offset")};
    const json& s = j.at("loss_scaler");
    st.scaler = {s.at("scale"), s.at("iter"), s.at("last_overflow"), s.at("hysteresis_left")};
    st.skipped_steps = j.value("skipped_steps", int64_t(0));
  } catch (const json::exception& e) {
    throw Error(str("[checkpoint] ", state_path, ": ", e.what()));
  }
  models::load_weights(model.params(), Checkpoint::open(dir + "/model.safetensors"));
  optimizer.load_state(Checkpoint::open(dir + "/optimizer.safetensors"), j.at("optimizer_steps"));
  return st;
}

}  // namespace hr::train

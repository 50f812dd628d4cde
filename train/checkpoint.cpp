// Atomic checkpoint directories, rotation, resume.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/io/atomic_file.h"
#include "core/ops/copy.h"
#include "models/hf_config.h"
#include "models/weights.h"

namespace hr::train {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace hr::core;

namespace {

constexpr const char* kPrefix = "checkpoint-";
// A checkpoint is written into .tmp-checkpoint-N, renamed .complete-checkpoint-N once every rank's files are in
// it (the rename is the mark that it is whole), then swapped into checkpoint-N.
constexpr const char* kTmp = ".tmp-";
constexpr const char* kComplete = ".complete-";

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

// Puts the complete directory `ready` in place as `final_dir`. When final_dir exists (the same step saved again:
// a finished run resumed, a requeued job), the two are swapped first and the old one deleted after, so that at
// every instant a checkpoint-N is there: renameat2's RENAME_EXCHANGE swaps them in one step; where the file system
// cannot (EINVAL), the old one is renamed aside first, and a crash between the two renames leaves the complete
// directory that recover_checkpoints() finishes.
void install(const fs::path& ready, const fs::path& final_dir) {
  if (fs::exists(final_dir)) {
    if (::renameat2(AT_FDCWD, ready.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_dir(final_dir.parent_path());
      discard(ready);  // the old checkpoint, now under the .complete- name
      return;
    }
    HR_CHECK(errno == EINVAL || errno == ENOSYS, "[checkpoint] swapping ", ready.string(), " and ", final_dir.string(),
             ": ", std::strerror(errno));
    discard(final_dir);
  }
  fs::rename(ready, final_dir);
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

std::vector<std::string> optimizer_files(const std::string& dir) {
  if (fs::exists(dir + "/optimizer.safetensors")) return {dir + "/optimizer.safetensors"};
  std::vector<std::string> files;
  for (int r = 0; fs::exists(str(dir, "/optimizer.rank", r, ".safetensors")); ++r)
    files.push_back(str(dir, "/optimizer.rank", r, ".safetensors"));
  HR_CHECK(!files.empty(), "[checkpoint] ", dir, " has no optimizer.safetensors and no optimizer.rankR.safetensors");
  return files;
}

// This rank's files of a checkpoint, into `tmp`.
static void write_checkpoint_files(const fs::path& tmp, const models::Llava& model, const parallel::Zero& zero,
                                   const TrainerState& st, parallel::Communicator& comm, const std::string& config_yaml,
                                   const HfSidecar& sidecar);

void save_checkpoint(const std::string& output_dir, const models::Llava& model, const parallel::Zero& zero,
                     const TrainerState& st, int64_t keep_last, parallel::Communicator& comm,
                     const std::string& config_yaml, const HfSidecar& sidecar) {
  const int rank = comm.rank();
  const fs::path final_dir = fs::path(output_dir) / (kPrefix + std::to_string(st.step));
  const fs::path tmp = fs::path(output_dir) / (kTmp + std::string(kPrefix) + std::to_string(st.step));
  if (rank == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  comm.barrier();
  try {
    write_checkpoint_files(tmp, model, zero, st, comm, config_yaml, sidecar);
  } catch (const Error& e) {
    // A full disk or a failed write: the partial directory goes, the previous checkpoints stay as they were.
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    const auto last = latest_checkpoint(output_dir);
    throw Error(str("[checkpoint] writing ", final_dir.string(), " failed: ", e.what(), "; ",
                    last ? "the last checkpoint, " + *last + ", is intact" : std::string("no earlier checkpoint")));
  }
  comm.barrier();
  if (rank == 0) {
    fsync_dir(tmp);
    const fs::path ready = fs::path(output_dir) / (kComplete + final_dir.filename().string());
    fs::remove_all(ready);
    fs::rename(tmp, ready);  // whole: every rank's files are in it
    fsync_dir(output_dir);
    install(ready, final_dir);
    fsync_dir(output_dir);
    auto all = checkpoints(output_dir);
    for (std::size_t i = 0; i + std::size_t(keep_last) < all.size(); ++i) discard(all[i].second);
  }
  comm.barrier();
}

void write_hf_sidecar(const std::string& dir, const HfSidecar& s) {
  bool preprocessor = false;
  for (const auto& [name, text] : s.written) {
    AtomicFile f((fs::path(dir) / name).string());
    f.write(text.data(), text.size());
    f.commit();
    preprocessor |= name == "preprocessor_config.json";
  }
  for (const std::string& f : s.files) {
    const fs::path to = fs::path(dir) / fs::path(f).filename();
    bool replaced = false;
    for (const auto& [name, text] : s.written) replaced |= name == fs::path(f).filename().string();
    if (replaced) continue;
    std::error_code ec;
    if (fs::equivalent(to, f, ec)) continue;  // already there (consolidating in place)
    fs::copy_file(f, to, fs::copy_options::overwrite_existing, ec);
    HR_CHECK(!ec, "[checkpoint] cannot copy ", f, " to ", to.string(), ": ", ec.message());
    preprocessor |= fs::path(f).filename() == "preprocessor_config.json";
  }
  if (!preprocessor && !s.preprocessor_json.empty() && !fs::exists(fs::path(dir) / "preprocessor_config.json")) {
    AtomicFile f((fs::path(dir) / "preprocessor_config.json").string());
    f.write(s.preprocessor_json.data(), s.preprocessor_json.size());
    f.commit();
  }
}

void save_model_weights(const std::string& dir, const NamedTensors& w, std::size_t max_shard_bytes) {
  std::size_t total = 0;
  for (const auto& [name, t] : w) total += t.nbytes();
  if (total <= max_shard_bytes)
    save_safetensors(dir + "/model.safetensors", w);
  else
    save_sharded(dir, w, max_shard_bytes);
}

bool has_model_weights(const std::string& dir) {
  return fs::exists(dir + "/model.safetensors") || fs::exists(dir + "/model.safetensors.index.json");
}

namespace {
// model.safetensors, or the index of its shards.
std::string model_weights_path(const std::string& dir) {
  return fs::exists(dir + "/model.safetensors") ? dir + "/model.safetensors" : dir;
}
}  // namespace

static void write_checkpoint_files(const fs::path& tmp, const models::Llava& model, const parallel::Zero& zero,
                                   const TrainerState& st, parallel::Communicator& comm, const std::string& config_yaml,
                                   const HfSidecar& sidecar) {
  const int rank = comm.rank();
  if (rank == 0 && !zero.shards_parameters()) {
    save_model_weights(tmp.string(), models::named_weights(model.params()), sidecar.max_shard_bytes);
    // LoRA: the adapters as PEFT writes them, in adapter/ (an adapter_config.json beside config.json would make
    // transformers' from_pretrained take the directory for an adapter); their base is this directory: the frozen
    // model with its trained projector in model.safetensors.
    const NamedTensors adapters = models::named_adapters(model.params());
    if (!adapters.empty()) {
      fs::create_directories(tmp / "adapter");
      save_safetensors((tmp / "adapter" / "adapter_model.safetensors").string(), adapters);
      const fs::path final_dir = tmp.parent_path() / tmp.filename().string().substr(5);  // without ".tmp-"
      const std::string text = models::adapter_config_json(model.config().llm.lora, fs::absolute(final_dir).string());
      AtomicFile f((tmp / "adapter" / "adapter_config.json").string());
      f.write(text.data(), text.size());
      f.commit();
    }
  }
  // config.json, generation_config.json, the tokenizer and preprocessor files: with the weights, a directory
  // transformers (LlavaForConditionalGeneration, AutoProcessor) opens.
  if (rank == 0 && models::hf_expressible(model.config())) {
    models::write_hf_config(tmp.string(), model.config(), model.params().dtype(), sidecar.tokens);
    write_hf_sidecar(tmp.string(), sidecar);
  }
  const bool sharded = zero.options().stage > 0 || zero.options().offload_optimizer != parallel::Offload::None;
  if (!sharded && rank == 0) save_safetensors((tmp / "optimizer.safetensors").string(), zero.state());
  if (sharded && (rank == 0 || zero.options().stage > 0))
    save_safetensors((tmp / str("optimizer.rank", rank, ".safetensors")).string(), zero.state());
  if (rank == 0) {
    json j = {{"step", st.step},
              {"optimizer_steps", zero.steps()},
              {"loader", {{"epoch", st.loader.epoch}, {"offset", st.loader.offset}}},
              {"loss_scaler",
               {{"scale", st.scaler.scale},
                {"iter", st.scaler.iter},
                {"last_overflow", st.scaler.last_overflow},
                {"hysteresis_left", st.scaler.hysteresis_left}}},
              {"skipped_steps", st.skipped_steps},
              {"world_size", comm.world()},
              {"zero_stage", zero.options().stage}};
    for (const auto& [name, text] :
         {std::pair<const char*, std::string>{"trainer_state.json", j.dump(2) + "\n"}, {"config.yaml", config_yaml}}) {
      AtomicFile f((tmp / name).string());
      f.write(text.data(), text.size());
      f.commit();
    }
  }
}

std::vector<std::string> recover_checkpoints(const std::string& output_dir) {
  std::vector<std::string> done;
  if (!fs::is_directory(output_dir)) return done;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kComplete, 0) != 0 || step_of(name.substr(std::strlen(kComplete))) < 0) continue;
    const fs::path final_dir = fs::path(output_dir) / name.substr(std::strlen(kComplete));
    if (fs::exists(final_dir)) {
      // Interrupted around the swap: either half is that step's checkpoint; the one in place stays.
      discard(e.path());
      continue;
    }
    fs::rename(e.path(), final_dir);
    fsync_dir(output_dir);
    done.push_back(final_dir.string());
  }
  return done;
}

std::optional<std::string> latest_checkpoint(const std::string& output_dir) {
  auto all = checkpoints(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

namespace {

// trainer_state.json's values, each checked by name: a whole number in [lo, hi], or a finite number.
struct StateReader {
  const std::string& where;

  const json& at(const json& obj, const char* key, const std::string& path) const {
    HR_CHECK(obj.is_object() && obj.contains(key), "[checkpoint] ", where, ": ", path, " is missing");
    return obj.at(key);
  }
  int64_t whole(const json& obj, const char* key, const std::string& path, int64_t lo, int64_t hi) const {
    const json& v = at(obj, key, path);
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() <= uint64_t(hi) && int64_t(v.get<uint64_t>()) >= lo
                              : v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    HR_CHECK(in_range, "[checkpoint] ", where, ": ", path, " ", v.dump(), " is not a whole number from ", lo, " to ",
             hi);
    return v.get<int64_t>();
  }
  double positive(const json& obj, const char* key, const std::string& path) const {
    const json& v = at(obj, key, path);
    HR_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0 &&
                 v.get<double>() <= double(std::numeric_limits<float>::max()),
             "[checkpoint] ", where, ": ", path, " ", v.dump(), " is not a positive finite number");
    return v.get<double>();
  }
};

}  // namespace

TrainerState parse_trainer_state(const std::string& text, const std::string& where) {
  const json j = json::parse(text, nullptr, false);
  HR_CHECK(!j.is_discarded(), "[checkpoint] ", where, ": not valid JSON");
  HR_CHECK(j.is_object(), "[checkpoint] ", where, ": not a JSON object");
  const StateReader r{where};
  TrainerState st;
  st.step = r.whole(j, "step", "step", 0, kMaxTrainerCount);
  st.optimizer_steps = r.whole(j, "optimizer_steps", "optimizer_steps", 0, st.step);
  const json& loader = r.at(j, "loader", "loader");
  st.loader.epoch = r.whole(loader, "epoch", "loader.epoch", 0, kMaxTrainerCount);
  st.loader.offset = r.whole(loader, "offset", "loader.offset", 0, kMaxTrainerCount);
  const json& s = r.at(j, "loss_scaler", "loss_scaler");
  st.scaler.scale = float(r.positive(s, "scale", "loss_scaler.scale"));
  st.scaler.iter = r.whole(s, "iter", "loss_scaler.iter", 0, kMaxTrainerCount);
  st.scaler.last_overflow = r.whole(s, "last_overflow", "loss_scaler.last_overflow", -1, st.scaler.iter);
  st.scaler.hysteresis_left = int(r.whole(s, "hysteresis_left", "loss_scaler.hysteresis_left", 0, 1 << 20));
  st.skipped_steps = j.contains("skipped_steps") ? r.whole(j, "skipped_steps", "skipped_steps", 0, st.step) : 0;
  st.world_size = j.contains("world_size") ? int(r.whole(j, "world_size", "world_size", 1, 1 << 20)) : 1;
  st.zero_stage = j.contains("zero_stage") ? int(r.whole(j, "zero_stage", "zero_stage", 0, 3)) : 0;
  return st;
}

TrainerState read_trainer_state(const std::string& dir) {
  const std::string state_path = dir + "/trainer_state.json";
  std::error_code ec;
  HR_CHECK(fs::is_regular_file(state_path, ec), "[checkpoint] cannot read ", state_path,
           ec ? ": " + ec.message() : std::string(": not a regular file"));
  std::ifstream in(state_path, std::ios::binary);
  HR_CHECK(in, "[checkpoint] cannot read ", state_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_trainer_state(text, state_path);
}

void check_loader_position(const TrainerState& st, const std::string& dir, int64_t samples, const std::string& data) {
  const std::string where = dir + "/trainer_state.json";
  HR_CHECK(st.loader.offset < samples, "[checkpoint] ", where, ": loader.offset ", st.loader.offset,
           " is past the end of ", data, "'s ", samples, " samples (the checkpoint of a run on another data set?)");
  HR_CHECK(samples <= 0 || st.loader.epoch <= (kMaxTrainerCount - st.loader.offset) / samples, "[checkpoint] ", where,
           ": loader.epoch ", st.loader.epoch, " of ", samples, " samples is more samples than a run can count");
}

namespace {

std::vector<Checkpoint> open_all(const std::vector<std::string>& paths) {
  std::vector<Checkpoint> v;
  for (const auto& p : paths) v.push_back(Checkpoint::open(p));
  return v;
}

std::vector<const Checkpoint*> pointers(const std::vector<Checkpoint>& v) {
  std::vector<const Checkpoint*> out;
  for (const auto& c : v) out.push_back(&c);
  return out;
}

}  // namespace

bool load_adapters_in(const std::string& dir, models::Llava& model) {
  if (!fs::is_directory(dir)) return false;
  std::string path = dir + "/adapter/adapter_model.safetensors";     // a checkpoint's adapters
  if (!fs::exists(path)) path = dir + "/adapter_model.safetensors";  // an adapter directory itself
  if (!fs::exists(path)) return false;
  HR_CHECK(model.config().llm.lora.r > 0, "[checkpoint] ", dir,
           " holds LoRA adapters (adapter_model.safetensors): set "
           "lora.enable: true with the adapters' lora.r and lora.target_modules (adapter_config.json) to load them");
  models::load_adapters(model.params(), Checkpoint::open(path));
  return true;
}

void load_model_weights(const std::string& dir, models::Llava& model) {
  if (has_model_weights(dir)) {
    models::load_weights(model.params(), Checkpoint::open(model_weights_path(dir)));
    load_adapters_in(dir, model);
    return;
  }
  // Only a ZeRO-3 run keeps its weights in the optimizer shards; any other wrote model.safetensors.
  const int stage = read_trainer_state(dir).zero_stage;
  HR_CHECK(stage == 3, "[checkpoint] ", dir, "/model.safetensors is missing (a checkpoint written at ZeRO stage ",
           stage,
           " keeps its weights there): the checkpoint is incomplete; resume from another one or restore the file");
  auto files = open_all(optimizer_files(dir));
  NamedTensors w = parallel::Zero::consolidate(model.params().groups(), pointers(files));
  HR_CHECK(!w.empty(), "[checkpoint] ", dir, " has no model.safetensors and no ZeRO-3 parameter shards");
  HR_CHECK(w.size() == model.params().all().size(), "[checkpoint] ", dir, ": the shards hold ", w.size(),
           " of the model's ", model.params().all().size(), " parameters");
  for (const auto& [name, t] : w) {
    core::Param* p = model.params().find(name);
    HR_CHECK(p && p->shape == t.shape(), "[checkpoint] ", dir, ": shard tensor ", name, " ", shape_str(t.shape()),
             " does not match the model");
    copy_(p->data, t);
  }
}

void load_optimizer_state(const std::string& dir, parallel::Zero& zero, int64_t optimizer_steps) {
  auto files = open_all(optimizer_files(dir));
  zero.load_state(pointers(files), optimizer_steps);
}

void consolidate_checkpoint(const std::string& dir, const models::Llava& model, const std::string& out, bool out_dir,
                            std::size_t max_shard_bytes) {
  auto save = [&](const NamedTensors& w) {
    if (out_dir)
      save_model_weights(out, w, max_shard_bytes);
    else
      save_safetensors(out, w);
  };
  if (has_model_weights(dir)) {
    Checkpoint c = Checkpoint::open(model_weights_path(dir));
    NamedTensors w;
    for (const auto& p : model.params().all())
      if (!models::is_lora(*p)) w.emplace_back(p->name, c.get(p->name));
    save(w);
    return;
  }
  auto files = open_all(optimizer_files(dir));
  NamedTensors w = parallel::Zero::consolidate(model.params().groups(), pointers(files));
  HR_CHECK(w.size() == model.params().all().size(), "[ckpt consolidate] ", dir, ": the shards hold ", w.size(),
           " of the model's ", model.params().all().size(), " parameters");
  save(w);
}

void load_inference_weights(models::Llava& model, const std::string& path) {
  std::string weights = path;
  if (fs::is_directory(weights)) {
    const bool whole = has_model_weights(weights);
    HR_CHECK(whole || fs::exists(weights + "/consolidated.safetensors"), "[checkpoint] ", weights,
             " has no model.safetensors (a ZeRO-3 checkpoint: run `headroom ckpt consolidate ", weights, "` first)");
    weights = whole ? model_weights_path(weights) : weights + "/consolidated.safetensors";
  }
  HR_CHECK(fs::exists(weights), "[checkpoint] ", weights, " does not exist");
  models::load_weights(model.params(), core::Checkpoint::open(weights));
  load_adapters_in(path, model);
}

}  // namespace hr::train

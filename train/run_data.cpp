// The run's data sets: the options and paths of the files a config names, and the synthetic VQA set written under
// output_dir/data on first use.
#include "train/run_data.h"

#include <algorithm>
#include <fstream>

#include "core/io/atomic_file.h"
#include "data/synth.h"
#include "train/run_files.h"

namespace hr::train {

using namespace hr::core;
using namespace hr::data;

void ensure_synthetic_data(const RunConfig& c, const std::string& dir, std::FILE* out) {
  const std::string stamp =
      str("train=", c.synth_train, " eval=", c.synth_eval, " seed=", c.synth_seed, " size=", c.synth_image_size,
          c.synth_questions > 1 ? str(" questions=", c.synth_questions) : std::string(),
          c.synth_captions > 0 ? str(" captions=", c.synth_captions) : std::string(),
          c.synth_aspect != data::SynthAspect::Square ? str(" aspect=", data::synth_aspect_name(c.synth_aspect)) : "",
          "\n");
  const std::string stamp_path = dir + "/synthetic.txt";
  std::ifstream in(stamp_path);
  std::string have((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (have == stamp) return;
  std::fprintf(out, "writing the synthetic VQA set to %s (%lld train, %lld eval)\n", dir.c_str(),
               (long long)c.synth_train, (long long)c.synth_eval);
  write_synthetic_vqa({dir, c.synth_train, c.synth_eval, c.synth_seed, int(c.synth_image_size), int(c.synth_questions),
                       c.synth_captions, c.synth_aspect});
  AtomicFile f(stamp_path);
  f.write(stamp.data(), stamp.size());
  f.commit();
}

LoaderOptions loader_options(const RunConfig& c, int rank, int world) {
  LoaderOptions o;
  o.micro_batch = c.micro_batch_size;
  o.workers = c.num_workers;
  o.prefetch = std::max<int>(c.prefetch, int(c.micro_batch_size));
  o.seed = c.seed;
  o.group_by_modality_length = c.group_by_modality_length;
  o.pad_to_max_seq_len = c.pad_to_max_length;
  o.pad_to_multiple_of = c.pad_to_multiple_of;
  o.max_seq_len = c.max_seq_len;
  o.on_bad_sample = c.on_bad_sample;
  o.rank = rank;
  o.world = world;
  return o;
}

DataOptions data_options(const RunConfig& c, const std::string& json_path, const std::string& image_folder) {
  DataOptions d;
  d.json_path = json_path;
  d.image_folder = image_folder;
  d.chat_template = c.chat_template;
  d.system_prompt = c.system_prompt;
  d.aspect = c.aspect;
  d.max_seq_len = c.max_seq_len;
  d.blank_images = c.blank_images;
  d.allow_outside_image_folder = c.allow_outside_image_folder;
  d.tokenizer = load_run_tokenizer(c);
  d.image_norm = run_image_norm(c);
  d.processor = run_image_processor(c);
  d.image_lengths = c.group_by_modality_length;  // AnyRes groups by each image's own tokens
  d.max_image_tokens = c.max_image_tokens;
  return d;
}

DataPaths resolve_data_paths(const RunConfig& c, parallel::Communicator& comm, std::FILE* out) {
  DataPaths p{c.train_json, c.eval_json, c.image_folder};
  if (!p.train_json.empty()) return p;
  const std::string dir = c.output_dir + "/data";
  if (comm.rank() == 0) ensure_synthetic_data(c, dir, out);
  comm.barrier();
  p.train_json = dir + "/train.json";
  if (p.eval_json.empty()) p.eval_json = dir + "/eval.json";
  if (p.image_folder.empty()) p.image_folder = dir;
  return p;
}

}  // namespace hr::train

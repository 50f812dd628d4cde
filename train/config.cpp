// Run configuration: the YAML text, --set overrides, validation and derived values (the keys: config_keys.cpp).
#include "train/config.h"

#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/check.h"
#include "core/io/text_file.h"
#include "core/suggest.h"
#include "data/anyres.h"
#include "models/anyres.h"
#include "train/config_keys.h"
#include "train/deepspeed.h"

namespace hr::train {

OnNonfinite parse_on_nonfinite(const std::string& s) {
  if (s == "stop") return OnNonfinite::Stop;
  if (s == "skip") return OnNonfinite::Skip;
  throw Error(str("[config] train.on_nonfinite '", s, "' is not one of: stop, skip"));
}

namespace {

using namespace key_schema;

// Bounds on the batch keys, checked before anything is sized from them: the products must not overflow, and
// one micro-batch's inputs (token ids and labels, pixel values) must fit in this machine's memory.
void check_batch_bounds(const RunConfig& c, int world) {
  const auto& m = c.model.config;
  int64_t tokens = 0, per_step = 0, pixels = 0, images = 0, bytes = 0;
  const bool overflow =
      __builtin_mul_overflow(c.micro_batch_size, c.max_seq_len, &tokens) ||
      __builtin_mul_overflow(c.micro_batch_size, c.gradient_accumulation_steps, &per_step) ||
      __builtin_mul_overflow(per_step, int64_t(world), &per_step) ||
      __builtin_mul_overflow(c.micro_batch_size, c.max_images_per_sample, &images) ||
      __builtin_mul_overflow(images, m.vision.channels * m.vision.image_size * m.vision.image_size, &pixels) ||
      __builtin_mul_overflow(tokens, int64_t(16), &bytes) || pixels > INT64_MAX / 4 ||
      __builtin_add_overflow(bytes, pixels * 4, &bytes);
  HR_CHECK(!overflow, "[config] train.micro_batch_size ", c.micro_batch_size, " with max_seq_len ", c.max_seq_len,
           ", gradient_accumulation_steps ", c.gradient_accumulation_steps, " and world size ", world,
           ": the batch's sizes overflow 64 bits");
  const double host = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  HR_CHECK(host <= 0 || double(bytes) <= host, "[config] train.micro_batch_size ", c.micro_batch_size,
           ": one micro-batch's inputs (", tokens, " tokens of max_seq_len ", c.max_seq_len, ", ", images,
           " images) take ", format_bytes(double(bytes)), ", more than this machine's ", format_bytes(host),
           " of memory");
}

// Visits every leaf of `node` outside `model` (the model section has its own parser, except model.weights).
void walk(const YAML::Node& node, const std::string& prefix,
          const std::function<void(const std::string&, const YAML::Node&)>& f) {
  for (const auto& kv : node) {
    const std::string key = prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>();
    if (key == "model") continue;
    // memory.gradient_checkpointing may be a scalar (both groups) or a map per group.
    if (kv.second.IsMap())
      walk(kv.second, key, f);
    else
      f(key, kv.second);
  }
}

void set_path(YAML::Node root, const std::string& path, const YAML::Node& value) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    parts.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  parts.push_back(path.substr(start));
  std::vector<YAML::Node> chain = {root};
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next.IsMap()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
}

// The node at a dotted path, or an undefined node when any part is missing.
YAML::Node lookup(const YAML::Node& root, const std::string& path) {
  YAML::Node n;
  n.reset(root);  // reset, not assignment: assigning a Node would overwrite the value it refers to
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!n.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& cn = n;
    YAML::Node next = cn[part];
    if (!next.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    n.reset(next);
    if (dot == std::string::npos) return n;
    start = dot + 1;
  }
}

bool has_path(const YAML::Node& root, const std::string& path) {
  return lookup(root, path).IsDefined();
}

constexpr int64_t kMaxConfigNodes = 100'000;  // a real config has hundreds; aliases can make a tree look endless

// yaml-cpp keeps the first of two equal keys in a mapping and says nothing, so `train:` twice would drop a
// whole section. Every mapping key must be a scalar that appears once; a repeat names both lines. Aliased
// subtrees are visited once per use: the node budget stops an alias bomb before anything copies it.
void check_keys(const YAML::Node& node, const std::string& prefix, const std::string& where, int64_t& budget) {
  HR_CHECK(--budget >= 0, "[config] ", where, ": more than ", kMaxConfigNodes,
           " YAML nodes (aliases nested too deep?)");
  if (node.IsSequence()) {
    for (const YAML::Node& item : node) check_keys(item, prefix, where, budget);
    return;
  }
  if (!node.IsMap()) return;
  std::map<std::string, int> line_of;
  for (const auto& kv : node) {
    const int line = kv.first.Mark().line + 1;
    HR_CHECK(kv.first.IsScalar(), "[config] ", where, ": line ", line, ": a key ",
             prefix.empty() ? std::string("at the top level") : "under '" + prefix + "'", " is not a plain name");
    const std::string key = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    const auto [seen, fresh] = line_of.emplace(kv.first.Scalar(), line);
    HR_CHECK(fresh, "[config] ", where, ": duplicate key '", key, "' at lines ", seen->second, " and ", line);
    check_keys(kv.second, key, where, budget);
  }
}

const RunConfig& defaults() {
  static const RunConfig c = [] {
    RunConfig d;
    for (const Key& k : schema()) k.set(d, YAML::Load(k.fallback), k.path);
    return d;
  }();
  return c;
}

// The schema's defaults as YAML nodes, in schema order; never handed out uncloned, so never changed.
const std::vector<YAML::Node>& default_nodes() {
  static const std::vector<YAML::Node> nodes = [] {
    std::vector<YAML::Node> n;
    for (const Key& k : schema()) n.push_back(YAML::Load(k.fallback));
    return n;
  }();
  return nodes;
}

// Events of a YAML parse, only to see where each document starts.
struct DocumentStarts : YAML::EventHandler {
  YAML::Mark start;
  void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// yaml-cpp 0.7 cannot read a ',' (or a flow end) where a document would start, as in "," or "- a\n,": its parser
// reports an empty document there without moving on, and LoadAll collects them until memory runs out. Each
// document must start past the previous one's start; the first that does not is named.
void check_documents_advance(const std::string& yaml, const std::string& where) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  DocumentStarts starts;
  int previous = -1;
  while (parser.HandleNextDocument(starts)) {
    HR_CHECK(starts.start.pos > previous, "[config] ", where, ": line ", starts.start.line + 1, ", column ",
             starts.start.column + 1, ": '", yaml.substr(std::size_t(starts.start.pos), 1),
             "' cannot begin a YAML document (a ',' or a closing bracket outside any [...] or {...})");
    previous = starts.start.pos;
  }
}

// The config's one YAML document (an empty text: an empty mapping).
YAML::Node parse_document(const std::string& yaml, const std::string& where) {
  YAML::Node root(YAML::NodeType::Map);
  try {
    check_documents_advance(yaml, where);
    // Every document: yaml-cpp's Load reads the first and drops what follows a '---' line without a word.
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml);
    for (std::size_t i = 1; i < docs.size(); ++i)
      HR_CHECK(docs[i].IsNull(), "[config] ", where, ": holds ", docs.size(), " YAML documents (document ", i + 1,
               ", after a '---' line, begins at line ", docs[i].Mark().line + 1,
               "); a config is one document and the others would be ignored");
    root = docs.empty() ? YAML::Node() : docs.front();
  } catch (const YAML::Exception& e) {
    throw Error(str("[config] ", where, ": ", e.what()));
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  HR_CHECK(root.IsMap(), "[config] ", where, ": the top level must be a mapping of sections");
  return root;
}

// The DeepSpeed JSON a run reads (`deepspeed: FILE` at the top level, taken out of `root`, or the last
// --deepspeed FILE, which wins); empty when none.
std::string take_deepspeed(YAML::Node root, const std::vector<std::string>& overrides) {
  std::string deepspeed;
  if (root["deepspeed"]) {
    deepspeed = get<std::string>(root["deepspeed"], "deepspeed", "a file name");
    root.remove("deepspeed");
  }
  for (const std::string& o : overrides)
    if (o.rfind("deepspeed=", 0) == 0) deepspeed = o.substr(10);
  return deepspeed;
}

// Each --set key=value over `root` (the deepspeed= ones are taken already), its value checked as the file's are.
void apply_overrides(YAML::Node root, const std::vector<std::string>& overrides, int64_t& budget) {
  for (const std::string& o : overrides) {
    if (o.rfind("deepspeed=", 0) == 0) continue;
    const std::size_t eq = o.find('=');
    HR_CHECK(eq != std::string::npos && eq > 0, "[config] --set '", o, "': expected key=value");
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw Error(str("[config] --set ", o, ": value is not valid YAML: ", e.what()));
    }
    check_keys(value, o.substr(0, eq), "--set " + o, budget);
    set_path(root, o.substr(0, eq), value);
  }
}

void check_sections(const YAML::Node& root, const std::string& where) {
  static const std::vector<std::string> sections = {"run",    "device",   "model", "data", "train",
                                                    "memory", "parallel", "log",   "lora"};
  for (const auto& kv : root) {
    const std::string s = kv.first.as<std::string>();
    if (std::find(sections.begin(), sections.end(), s) == sections.end())
      throw Error(str("[config] ", where, ": unknown section '", s, "'", did_you_mean(s, sections),
                      " (sections: run, device, model, data, train, memory, parallel, log, lora)"));
  }
}

// Every key outside the model section onto `c`; an unknown key names the closest known one.
void set_keys(RunConfig& c, const YAML::Node& root, const std::string& where) {
  const std::vector<std::string> paths = all_paths();
  walk(root, "", [&](const std::string& key, const YAML::Node& value) {
    if (key == "memory.gradient_checkpointing") {  // one policy for both groups
      checkpointing(true, true)(c, value, key);
      return;
    }
    if (key == "memory.offload_activations") {
      activation_offload(true, true)(c, value, key);
      return;
    }
    const Key* k = find_key(key);
    if (!k) {
      const std::string close = closest_match(key, paths);
      throw Error(
          str("[config] ", where, ": unknown key '", key, "'", close.empty() ? "" : "; did you mean '" + close + "'?"));
    }
    k->set(c, value, key);
  });
}

// The model section: model.weights and LLaVA's stage-1 projector (loaded over the weights) are the run's; the
// rest is the model's own spec.
void read_model_section(RunConfig& c, const YAML::Node& root, const std::string& where) {
  YAML::Node model = root["model"] ? YAML::Clone(root["model"]) : YAML::Node(YAML::NodeType::Map);
  if (model.IsMap() && model["weights"]) {
    c.init_weights = get<std::string>(model["weights"], "model.weights", "a string");
    model.remove("weights");
  }
  if (model.IsMap() && model["pretrain_mm_mlp_adapter"]) {
    c.projector_weights =
        get<std::string>(model["pretrain_mm_mlp_adapter"], "model.pretrain_mm_mlp_adapter", "a file name");
    model.remove("pretrain_mm_mlp_adapter");
  }
  c.model = models::parse_model_spec(model, where);
}

// The keys whose values are valid alone but not together, then the values that follow from others.
void check_and_derive(RunConfig& c) {
  HR_CHECK(c.loss_scale_min <= c.loss_scale_initial, "[config] memory.loss_scale.min ", c.loss_scale_min,
           " is above memory.loss_scale.initial ", c.loss_scale_initial);
  HR_CHECK(c.lora_enable || !c.lora.quantizes_base(), "[config] lora.base_bits: ", c.lora.base_bits,
           " quantizes the frozen base of a LoRA run; set lora.enable: true (or lora.base_bits: 16)");
  if (c.init_weights.empty()) c.init_weights = c.model.name_or_path;  // a Hugging Face directory's own weights
  const bool cuda = c.device.rfind("cuda", 0) == 0;
  if (c.pad_to_multiple_of == 0) c.pad_to_multiple_of = cuda ? 64 : 1;
  HR_CHECK(!cuda || c.padding_free != PaddingFree::On, "[config] train.padding_free: true is for the CPU: on ",
           c.device,
           " cuDNN's attention would build a graph (and size a workspace) for every packed sequence "
           "length, which the planner does not predict; use auto or false");
  if (c.padding_free == PaddingFree::Auto) c.padding_free = cuda ? PaddingFree::Off : PaddingFree::On;
  if (c.grad_accum == GradAccum::Auto)
    c.grad_accum = c.precision == Precision::BF16 ? GradAccum::Fp32 : GradAccum::Model;
  const models::LlavaConfig& m = c.model.config;
  HR_CHECK(c.max_image_tokens == 0 || m.anyres.on(), "[config] data.max_image_tokens bounds AnyRes images; this model ",
           "gives every image ", m.vision.tokens_per_image(), " tokens (set model.image_grid_pinpoints)");
  // Every image shrinks at most to a tiny one, which takes the pinpoint of the least area (LLaVA's rule: no waste
  // beats it) and un-pads to at most its full layout: the bound must hold that layout.
  if (c.max_image_tokens > 0) {
    const data::Resolution least = data::best_resolution({1, 1}, m.anyres.pinpoints);
    const int64_t floor = models::anyres_tokens(least, m.anyres, m.vision.image_size, m.vision.grid());
    HR_CHECK(c.max_image_tokens >= floor, "[config] data.max_image_tokens ", c.max_image_tokens, " is below the ",
             floor, " tokens of the smallest layout (an image of ", least.height, " x ", least.width,
             " px): images of that shape make that many at any size");
  }
}

// A global batch given with at most one of micro-batch and accumulation: the other inferred; given with both,
// their product checked.
void infer_from_global(RunConfig& c, const YAML::Node& root, int world_size) {
  const int64_t g = c.global_batch_size, w = world_size;
  if (has_path(root, "train.micro_batch_size") && has_path(root, "train.gradient_accumulation_steps")) {
    HR_CHECK(c.micro_batch_size * c.gradient_accumulation_steps * w == g, "[config] train.global_batch_size ", g,
             " disagrees with micro_batch_size ", c.micro_batch_size, " x gradient_accumulation_steps ",
             c.gradient_accumulation_steps, " x world size ", w);
  } else if (has_path(root, "train.gradient_accumulation_steps")) {
    HR_CHECK(g % (c.gradient_accumulation_steps * w) == 0, "[config] train.global_batch_size ", g,
             " is not a multiple of gradient_accumulation_steps x world size ", c.gradient_accumulation_steps * w);
    c.micro_batch_size = g / (c.gradient_accumulation_steps * w);
  } else {
    HR_CHECK(g % (c.micro_batch_size * w) == 0, "[config] train.global_batch_size ", g,
             " is not a multiple of micro_batch_size x world size ", c.micro_batch_size * w);
    c.gradient_accumulation_steps = g / (c.micro_batch_size * w);
  }
}

// Global batch = micro x accumulation x world size: infer one from the other two, refuse a contradiction.
void resolve_batch(RunConfig& c, const YAML::Node& root, int world_size) {
  check_batch_bounds(c, world_size);  // the given values, before they are multiplied below
  if (c.micro_auto) {                 // the planner picks micro and accumulation for the global batch
    HR_CHECK(c.global_batch_size > 0, "[config] train.micro_batch_size: auto needs train.global_batch_size");
    HR_CHECK(c.global_batch_size % world_size == 0, "[config] train.global_batch_size ", c.global_batch_size,
             " is not a multiple of the world size ", world_size);
    c.micro_batch_size = 1;
    c.gradient_accumulation_steps = c.global_batch_size / world_size;
  } else if (c.global_batch_size > 0) {
    infer_from_global(c, root, world_size);
  }
  check_batch_bounds(c, world_size);
  c.global_batch_size = c.micro_batch_size * c.gradient_accumulation_steps * world_size;
}

// The resolved configuration: every key with its value (given or default), the derived ones as resolved.
std::string resolved_yaml(const RunConfig& c, const YAML::Node& root) {
  YAML::Node resolved(YAML::NodeType::Map);
  for (std::size_t i = 0; i < schema().size(); ++i) {
    const Key& k = schema()[i];
    YAML::Node given = lookup(root, k.path);
    set_path(resolved, k.path, given.IsDefined() ? given : YAML::Clone(default_nodes()[i]));
  }
  set_path(resolved, "memory.gradient_checkpointing.vision", YAML::Node(models::checkpoint_name(c.vision_ckpt.kind)));
  set_path(resolved, "memory.gradient_checkpointing.llm", YAML::Node(models::checkpoint_name(c.llm_ckpt.kind)));
  set_path(resolved, "memory.offload_activations.vision", YAML::Node(c.vision_ckpt.offload ? "cpu" : "none"));
  set_path(resolved, "memory.offload_activations.llm", YAML::Node(c.llm_ckpt.offload ? "cpu" : "none"));
  set_path(resolved, "train.global_batch_size", YAML::Node(c.global_batch_size));
  set_path(resolved, "data.pad_to_multiple_of", YAML::Node(c.pad_to_multiple_of));
  set_path(resolved, "memory.grad_accum_dtype", YAML::Node(c.grad_accum == GradAccum::Fp32 ? "fp32" : "model"));
  set_path(resolved, "train.micro_batch_size", YAML::Node(c.micro_batch_size));
  set_path(resolved, "train.gradient_accumulation_steps", YAML::Node(c.gradient_accumulation_steps));
  if (root["model"]) resolved["model"] = YAML::Clone(root["model"]);
  resolved["model"]["weights"] = c.init_weights;
  return YAML::Dump(resolved) + "\n";
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const Key& k : schema()) keys.push_back(k.path);
  return keys;
}

const char* precision_name(Precision p) {
  return p == Precision::FP32 ? "fp32" : p == Precision::BF16 ? "bf16" : "fp16";
}
const char* stage_name(Stage s) {
  return s == Stage::Pretrain ? "pretrain" : s == Stage::Finetune ? "finetune" : "full";
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int world_size) {
  if (path.empty()) return load_config_text("", "(defaults)", overrides, world_size);
  return load_config_text(core::read_text_file(path, "config"), path, overrides, world_size);
}

RunConfig load_config_text(const std::string& yaml, const std::string& where, const std::vector<std::string>& overrides,
                           int world_size) {
  YAML::Node root = parse_document(yaml, where);
  int64_t budget = kMaxConfigNodes;
  check_keys(root, "", where, budget);
  // DeepSpeed JSON: its keys land on headroom's before the --set overrides, which still win.
  const std::string deepspeed = take_deepspeed(root, overrides);
  DeepSpeedConfig ds;
  if (!deepspeed.empty()) {
    ds = read_deepspeed(deepspeed, world_size);
    for (const auto& [key, value] : ds.sets) set_path(root, key, YAML::Load(value));
  }
  apply_overrides(root, overrides, budget);
  check_sections(root, where);
  // Defaults first (parsed once per process), then what the file and overrides say.
  RunConfig c = defaults();
  c.deepspeed = deepspeed;
  c.deepspeed_not_acted_on = ds.not_acted_on;
  set_keys(c, root, where);
  read_model_section(c, root, where);
  check_and_derive(c);
  resolve_batch(c, root, world_size);
  c.resolved_yaml = resolved_yaml(c, root);
  return c;
}

}  // namespace hr::train

// Parsing of the model section: strict keys, typed values, errors that name the key and the file.
#include "models/model_spec.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <optional>

#include "core/check.h"
#include "core/suggest.h"
#include "models/hf_config.h"
#include "models/hf_start.h"

namespace hr::models {

namespace {

template <typename T>
T as(const YAML::Node& n, const std::string& key, const std::string& where) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    throw Error(str("[config] ", where, ": model.", key, " has value '", YAML::Dump(n), "' of the wrong type"));
  }
}

using Setter = std::function<void(const YAML::Node&)>;

void apply(const YAML::Node& node, const std::string& path, const std::map<std::string, Setter>& keys,
           const std::string& where) {
  HR_CHECK(node.IsMap(), "[config] ", where, ": ", path, " must be a mapping");
  std::vector<std::string> names;
  for (const auto& [k, s] : keys) names.push_back(k);
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    auto it = keys.find(key);
    if (it == keys.end()) {
      const std::string close = closest_match(key, names);
      throw Error(str("[config] ", where, ": unknown key '", path, ".", key, "'",
                      close.empty() ? "" : str("; did you mean '", path, ".", close, "'?")));
    }
    it->second(kv.second);
  }
}

// OneVision's image_grid_pinpoints "(1x1),...,(6x6)": every grid of rows x columns tiles from the first to the last.
struct TileRange {
  int64_t rows0 = 0, cols0 = 0, rows1 = 0, cols1 = 0;
};

TileRange tile_range(const std::string& v, const std::string& where) {
  std::vector<std::pair<int64_t, int64_t>> grids;
  std::size_t at = 0;
  while ((at = v.find('(', at)) != std::string::npos) {
    const std::size_t x = v.find('x', at), close = v.find(')', at);
    if (x == std::string::npos || close == std::string::npos || x > close) break;
    try {
      std::size_t used_r = 0, used_c = 0;
      const std::string r = v.substr(at + 1, x - at - 1), c = v.substr(x + 1, close - x - 1);
      const int64_t rows = std::stoll(r, &used_r), cols = std::stoll(c, &used_c);
      if (used_r == r.size() && used_c == c.size() && rows >= 1 && cols >= 1 && rows <= 64 && cols <= 64)
        grids.emplace_back(rows, cols);
    } catch (const std::exception&) {
    }
    at = close + 1;
  }
  HR_CHECK(
      grids.size() >= 1 && grids.front().first <= grids.back().first && grids.front().second <= grids.back().second,
      "[config] ", where, ": model.image_grid_pinpoints '", v,
      "' is neither a list of [height, width] pairs nor a tile range such as '(1x1),...,(3x3)'");
  return {grids.front().first, grids.front().second, grids.back().first, grids.back().second};
}

// model.image_grid_pinpoints: [[height, width], ...] in pixels, set at once, or a tile range, returned for the caller
// to set once the tower's size is known.
std::optional<TileRange> set_pinpoints(const YAML::Node& n, AnyresConfig& a, const std::string& where) {
  a.pinpoints.clear();
  if (n.IsScalar()) return tile_range(as<std::string>(n, "image_grid_pinpoints", where), where);
  for (const auto& p : as<std::vector<std::vector<int64_t>>>(n, "image_grid_pinpoints", where)) {
    HR_CHECK(p.size() == 2, "[config] ", where, ": model.image_grid_pinpoints[", a.pinpoints.size(),
             "] is not a [height, width] pair");
    a.pinpoints.push_back({p[0], p[1]});
  }
  HR_CHECK(a.on(), "[config] ", where,
           ": model.image_grid_pinpoints is empty (leave it out for one image of the tower's size)");
  return std::nullopt;
}

// The range's grids in pixels of `tile` (the tower's image size), row by row as LLaVA-NeXT lists them.
std::vector<data::Resolution> tile_pinpoints(const TileRange& t, int64_t tile) {
  std::vector<data::Resolution> out;
  for (int64_t r = t.rows0; r <= t.rows1; ++r)
    for (int64_t c = t.cols0; c <= t.cols1; ++c) out.push_back({r * tile, c * tile});
  return out;
}

}  // namespace

ModelSpec parse_model_spec(const YAML::Node& model, const std::string& where) {
  ModelSpec s;
  HR_CHECK(model.IsMap() || model.IsNull(), "[config] ", where, ": model must be a mapping, not '", YAML::Dump(model),
           "'");
  HR_CHECK(!(model["preset"] && model["name_or_path"]), "[config] ", where,
           ": model.preset and model.name_or_path both give the dimensions; keep one");
  const bool stage1 = model["vision_tower"] || model["language_model"];
  HR_CHECK(!stage1 || (model["vision_tower"] && model["language_model"]), "[config] ", where,
           ": model.vision_tower and model.language_model go together (LLaVA's stage-1 start)");
  HR_CHECK(!stage1 || !(model["preset"] || model["name_or_path"]), "[config] ", where,
           ": model.vision_tower + model.language_model give the dimensions; drop model.",
           model["preset"] ? "preset" : "name_or_path");
  if (stage1) {
    s.vision_tower = as<std::string>(model["vision_tower"], "vision_tower", where);
    s.language_model = as<std::string>(model["language_model"], "language_model", where);
    s.config = stage1_config(s.vision_tower, s.language_model);
  }
  if (model["preset"]) s.config = preset(as<std::string>(model["preset"], "preset", where));
  if (model["name_or_path"]) {
    s.name_or_path = as<std::string>(model["name_or_path"], "name_or_path", where);
    s.config = read_hf_config(s.name_or_path);
  }
  VisionConfig& v = s.config.vision;
  std::optional<TileRange> tiles;  // a tile range of image_grid_pinpoints, in pixels once the tower's size is known
  LlmConfig& l = s.config.llm;
  auto i64 = [&](int64_t& dst, const std::string& key) {
    return [&dst, key, where](const YAML::Node& n) { dst = as<int64_t>(n, key, where); };
  };
  auto f32 = [&](float& dst, const std::string& key) {
    return [&dst, key, where](const YAML::Node& n) { dst = as<float>(n, key, where); };
  };
  auto flag = [&](bool& dst, const std::string& key) {
    return [&dst, key, where](const YAML::Node& n) { dst = as<bool>(n, key, where); };
  };
  std::map<std::string, Setter> vision_keys = {
      {"hidden_size", i64(v.hidden, "vision.hidden_size")},
      {"num_hidden_layers", i64(v.layers, "vision.num_hidden_layers")},
      {"num_attention_heads", i64(v.heads, "vision.num_attention_heads")},
      {"intermediate_size", i64(v.intermediate, "vision.intermediate_size")},
      {"image_size", i64(v.image_size, "vision.image_size")},
      {"patch_size", i64(v.patch, "vision.patch_size")},
      {"num_channels", i64(v.channels, "vision.num_channels")},
      {"layer_norm_eps", f32(v.layer_norm_eps, "vision.layer_norm_eps")},
      {"select_layer", [&](const YAML::Node& n) { v.select_layer = as<int>(n, "vision.select_layer", where); }},
      {"model_type",
       [&](const YAML::Node& n) {
         v.tower = parse_tower(as<std::string>(n, "vision.model_type", where), "model.vision.model_type");
       }},
      {"select_feature",
       [&](const YAML::Node& n) {
         v.select_feature = parse_feature_select(as<std::string>(n, "vision.select_feature", where));
       }},
  };
  std::map<std::string, Setter> llm_keys = {
      {"vocab_size", i64(l.vocab, "llm.vocab_size")},
      {"hidden_size", i64(l.hidden, "llm.hidden_size")},
      {"num_hidden_layers", i64(l.layers, "llm.num_hidden_layers")},
      {"num_attention_heads", i64(l.heads, "llm.num_attention_heads")},
      {"num_key_value_heads", i64(l.kv_heads, "llm.num_key_value_heads")},
      {"intermediate_size", i64(l.intermediate, "llm.intermediate_size")},
      {"rms_norm_eps", f32(l.rms_norm_eps, "llm.rms_norm_eps")},
      {"rope_theta", f32(l.rope_theta, "llm.rope_theta")},
      {"model_type",
       [&](const YAML::Node& n) {
         l.decoder = parse_decoder(as<std::string>(n, "llm.model_type", where), "model.llm.model_type");
       }},
      {"sliding_window", i64(l.sliding_window, "llm.sliding_window")},
      {"max_window_layers", i64(l.max_window_layers, "llm.max_window_layers")},
      {"tie_word_embeddings", flag(l.tied_embeddings, "llm.tie_word_embeddings")},
  };
  std::map<std::string, Setter> freeze_keys = {
      {"vision", flag(s.freeze_vision, "freeze.vision")},
      {"projector", flag(s.freeze_projector, "freeze.projector")},
      {"llm", flag(s.freeze_llm, "freeze.llm")},
  };
  std::map<std::string, Setter> top = {
      {"preset", [](const YAML::Node&) {}},
      {"name_or_path", [](const YAML::Node&) {}},
      {"vision_tower", [](const YAML::Node&) {}},
      {"language_model", [](const YAML::Node&) {}},
      {"dtype", [&](const YAML::Node& n) { s.dtype = core::parse_dtype(as<std::string>(n, "dtype", where)); }},
      {"vision", [&](const YAML::Node& n) { apply(n, "model.vision", vision_keys, where); }},
      {"llm", [&](const YAML::Node& n) { apply(n, "model.llm", llm_keys, where); }},
      {"projector",
       [&](const YAML::Node& n) { s.config.projector = parse_projector(as<std::string>(n, "projector", where)); }},
      {"image_token_index", i64(s.config.image_token_id, "image_token_index")},
      // LLaVA-NeXT's AnyRes: [[height, width], ...] in pixels, multiples of the tower's image size (validate checks)
      {"image_grid_pinpoints", [&](const YAML::Node& n) { tiles = set_pinpoints(n, s.config.anyres, where); }},
      // OneVision's: anyres_max_N pools each image's tile features above N base images' worth (anyres: never)
      {"vision_aspect_ratio",
       [&](const YAML::Node& n) {
         s.config.anyres.max_num_patches =
             parse_vision_aspect_ratio(as<std::string>(n, "vision_aspect_ratio", where), where + ": model");
       }},
      {"mm_patch_merge_type",
       [&](const YAML::Node& n) {
         s.config.anyres.merge = parse_patch_merge(as<std::string>(n, "mm_patch_merge_type", where));
       }},
      {"freeze", [&](const YAML::Node& n) { apply(n, "model.freeze", freeze_keys, where); }},
      {"fused_kernels",
       [&](const YAML::Node& n) {
         const FusedKernels k =
             parse_fused_kernels(as<std::string>(n, "fused_kernels", where), where + ": model.fused_kernels");
         s.config.llm.kernels = s.config.vision.kernels = k;
       }},
  };
  apply(model, "model", top, where);
  if (tiles) s.config.anyres.pinpoints = tile_pinpoints(*tiles, s.config.vision.image_size);
  try {
    s.config.validate();
  } catch (const Error& e) {  // "[config] model.llm.intermediate_size 0 ..." said of this file
    const std::string m = e.what();
    throw Error(str("[config] ", where, ": ", m.rfind("[config] ", 0) == 0 ? m.substr(9) : m));
  }
  return s;
}

ModelSpec load_model_spec(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw Error(str("[config] ", path, ": ", e.what()));
  }
  HR_CHECK(root.IsMap() && root["model"], "[config] ", path, ": no 'model' section");
  return parse_model_spec(root["model"], path);
}

}  // namespace hr::models

// Each LLaVA / TrainingArguments flag and the headroom key it sets, or why it is refused.
#include "train/llava_args.h"

#include <cctype>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "core/check.h"

namespace hr::train {

namespace {

// A Python or YAML boolean.
bool truth(const std::string& flag, const std::string& v) {
  if (v == "True" || v == "true" || v == "1") return true;
  if (v == "False" || v == "false" || v == "0") return false;
  throw Error(str("[args] --", flag, " expects True or False; got '", v, "'"));
}

using Map = std::function<void(const std::string& value, LlavaArgs& out)>;

Map key(const char* k) {
  return [k](const std::string& v, LlavaArgs& o) { o.sets.push_back(str(k, "=", v)); };
}
Map boolean(const char* flag, const char* k) {
  return [flag, k](const std::string& v, LlavaArgs& o) {
    o.sets.push_back(str(k, "=", truth(flag, v) ? "true" : "false"));
  };
}
// Accepted only with the value headroom implements.
Map only(const char* flag, const char* value, const char* why) {
  return [flag, value, why](const std::string& v, LlavaArgs& o) {
    const bool is_bool = std::string(value) == "False" || std::string(value) == "True";
    if (is_bool ? truth(flag, v) == truth(flag, value) : v == value)
      return o.not_acted_on.push_back(str("--", flag, " ", v));
    throw Error(str("[args] --", flag, " ", v, ": only ", value, " is supported (", why, ")"));
  };
}
// LLaVA-NeXT's --image_grid_pinpoints: a Python list of pairs, "[(336, 672), (672, 336)]", as the key's
// [[336, 672], [672, 336]]; or OneVision's tile range "(1x1),...,(6x6)", which the key takes as it is (its tiles are
// the tower's size, which the model knows). The numbers are kept in their order, as llava-hf's conversion copies them
// into config.json, where transformers reads each pair as (height, width); LLaVA's own code reads (width, height),
// which differs only for a set that is not symmetric and in ties (the published sets are symmetric).
void grid_pinpoints(const std::string& v, LlavaArgs& o) {
  if (v.find('x') != std::string::npos) return o.sets.push_back(str("model.image_grid_pinpoints='", v, "'"));
  std::vector<std::string> numbers(1);
  for (char ch : v) {
    HR_CHECK(std::isdigit(static_cast<unsigned char>(ch)) || std::string("[](), ").find(ch) != std::string::npos,
             "[args] --image_grid_pinpoints ", v,
             ": expected (height, width) pairs such as \"[(336, 672), (672, 336)]\" or a tile range such as "
             "\"(1x1),...,(3x3)\"");
    if (std::isdigit(static_cast<unsigned char>(ch)))
      numbers.back() += ch;
    else if (!numbers.back().empty())
      numbers.emplace_back();
  }
  if (numbers.back().empty()) numbers.pop_back();
  HR_CHECK(!numbers.empty() && numbers.size() % 2 == 0, "[args] --image_grid_pinpoints ", v,
           ": expected (height, width) pairs");
  std::string list;
  for (std::size_t i = 0; i < numbers.size(); i += 2)
    list += str(i ? ", " : "", "[", numbers[i], ", ", numbers[i + 1], "]");
  o.sets.push_back(str("model.image_grid_pinpoints=[", list, "]"));
}

// A flag of named values, each setting a key ("" sets nothing: the value another flag completes); any other value
// is refused with `accepted`.
Map choice(const char* flag, std::vector<std::pair<const char*, const char*>> values, const char* accepted) {
  return [flag, values = std::move(values), accepted](const std::string& v, LlavaArgs& o) {
    for (const auto& [name, set] : values)
      if (v == name) {
        if (*set) o.sets.emplace_back(set);
        return;
      }
    throw Error(str("[args] --", flag, " ", v, ": ", accepted));
  };
}

Map nothing(const char* flag) {
  return [flag](const std::string& v, LlavaArgs& o) { o.not_acted_on.push_back(str("--", flag, " ", v)); };
}

const std::map<std::string, Map>& flags() {
  static const std::map<std::string, Map> m = {
      // LLaVA's ModelArguments
      {"model_name_or_path", key("model.name_or_path")},
      // LLaVA-NeXT's names too (its conv_templates: qwen_2 is the same conversation as qwen_1_5).
      {"version", choice("version",
                         {{"v1", "data.template=vicuna_v1"},
                          {"vicuna_v1", "data.template=vicuna_v1"},
                          {"plain", "data.template=plain"},
                          {"llava_llama_2", "data.template=llava_llama_2"},
                          {"qwen_1_5", "data.template=qwen_1_5"},
                          {"qwen_2", "data.template=qwen_1_5"},
                          {"mistral_instruct", "data.template=mistral_instruct"},
                          {"llava_mistral_instruct", "data.template=mistral_instruct"}},
                         "the conversation templates are plain, v1 (vicuna_v1), llava_llama_2, qwen_1_5 (qwen_2) and "
                         "mistral_instruct (llava_mistral_instruct)")},
      // With --vision_tower, --model_name_or_path is the language model (LLaVA's stage-1 start; see below).
      {"vision_tower", key("model.vision_tower")},
      {"pretrain_mm_mlp_adapter", key("model.pretrain_mm_mlp_adapter")},
      {"mm_projector_type", key("model.projector")},
      {"mm_vision_select_layer", key("model.vision.select_layer")},
      {"mm_vision_select_feature", key("model.vision.select_feature")},
      {"mm_use_im_start_end", only("mm_use_im_start_end", "False", "no <im_start>/<im_end> tokens")},
      {"mm_use_im_patch_token", only("mm_use_im_patch_token", "False", "no <im_patch> tokens")},
      {"tune_mm_mlp_adapter",
       [](const std::string& v, LlavaArgs& o) {
         if (truth("tune_mm_mlp_adapter", v)) o.sets.push_back("train.stage=pretrain");
       }},
      {"freeze_backbone", boolean("freeze_backbone", "model.freeze.llm")},
      {"freeze_mm_mlp_adapter", boolean("freeze_mm_mlp_adapter", "model.freeze.projector")},
      // LLaVA's DataArguments
      {"data_path", key("data.train_json")},
      {"image_folder", key("data.image_folder")},
      {"image_aspect_ratio",
       [](const std::string& v, LlavaArgs& o) {
         if (v == "pad") return o.sets.push_back("data.image_aspect_ratio=pad");
         // LLaVA's default: the image processor on the image as it is (CLIP's shortest edge and centre crop).
         if (v == "square") return o.sets.push_back("data.image_aspect_ratio=square");
         // LLaVA-NeXT's: AnyRes is on wherever model.image_grid_pinpoints is (this flag's list, or config.json's).
         if (v == "anyres") return o.not_acted_on.push_back("--image_aspect_ratio anyres");
         // OneVision's: AnyRes whose tile features are pooled above N base images' worth.
         if (v.rfind("anyres_max_", 0) == 0) return o.sets.push_back("model.vision_aspect_ratio=" + v);
         throw Error(str("[args] --image_aspect_ratio ", v,
                         ": pad (LLaVA-1.5's), square (LLaVA's default: the image processor alone), anyres "
                         "(LLaVA-NeXT's, with --image_grid_pinpoints) and anyres_max_N (OneVision's) are supported; "
                         "headroom's other mode, resize, is data.image_aspect_ratio: resize"));
       }},
      {"image_grid_pinpoints", grid_pinpoints},
      {"mm_patch_merge_type", key("model.mm_patch_merge_type")},
      {"lazy_preprocess", nothing("lazy_preprocess")},  // headroom always processes samples on demand
      {"is_multimodal", nothing("is_multimodal")},
      // LLaVA's TrainingArguments
      {"model_max_length", key("data.max_seq_len")},
      {"group_by_modality_length", boolean("group_by_modality_length", "data.group_by_modality_length")},
      {"mm_projector_lr", key("train.mm_projector_lr")},
      {"mm_vision_tower_lr", key("train.mm_vision_tower_lr")},
      {"freeze_mm_vision_tower", boolean("freeze_mm_vision_tower", "model.freeze.vision")},
      {"lora_enable", boolean("lora_enable", "lora.enable")},
      {"lora_r", key("lora.r")},
      {"lora_alpha", key("lora.alpha")},
      {"lora_dropout", key("lora.dropout")},
      {"lora_bias", key("lora.bias")},
      {"bits", key("lora.base_bits")},
      {"double_quant", boolean("double_quant", "lora.double_quant")},
      {"quant_type", key("lora.quant_type")},
      {"remove_unused_columns", nothing("remove_unused_columns")},
      {"cache_dir", nothing("cache_dir")},
      // bitsandbytes' 8-bit AdamW; the paged variant's unified memory has nothing to page here: the plan fits.
      {"optim", choice("optim",
                       {{"adamw_torch", "train.optimizer=adamw"},
                        {"adamw_hf", "train.optimizer=adamw"},
                        {"adamw_torch_fused", "train.optimizer=adamw"},
                        {"sgd", "train.optimizer=sgd"},
                        {"adafactor", "train.optimizer=adafactor"},
                        {"adamw_bnb_8bit", "train.optimizer=adamw_8bit"},
                        {"adamw_8bit", "train.optimizer=adamw_8bit"},
                        {"paged_adamw_8bit", "train.optimizer=adamw_8bit"}},
                       "adamw_torch, adamw_bnb_8bit, sgd and adafactor are supported")},
      // Hugging Face TrainingArguments
      {"output_dir", key("run.output_dir")},
      {"seed", key("run.seed")},
      {"num_train_epochs", key("train.num_train_epochs")},
      {"max_steps", key("train.max_steps")},
      {"per_device_train_batch_size", key("train.micro_batch_size")},
      {"per_device_eval_batch_size", key("train.eval_batch_size")},
      {"gradient_accumulation_steps", key("train.gradient_accumulation_steps")},
      {"learning_rate", key("train.learning_rate")},
      {"weight_decay", key("train.weight_decay")},
      {"adam_beta1", key("train.adam_beta1")},
      {"adam_beta2", key("train.adam_beta2")},
      {"adam_epsilon", key("train.adam_epsilon")},
      {"max_grad_norm", key("train.max_grad_norm")},
      {"warmup_ratio", key("train.warmup_ratio")},
      {"warmup_steps", key("train.warmup_steps")},
      {"lr_scheduler_type", key("train.lr_scheduler_type")},
      {"logging_steps", key("log.logging_steps")},
      {"report_to",
       choice(
           "report_to",
           {{"none", "log.report_to=none"}, {"tensorboard", "log.report_to=tensorboard"}, {"all", "log.report_to=all"}},
           "none and tensorboard are supported")},
      {"bf16",
       [](const std::string& v, LlavaArgs& o) {
         if (truth("bf16", v)) o.sets.push_back("memory.precision=bf16");
       }},
      {"fp16",
       [](const std::string& v, LlavaArgs& o) {
         if (truth("fp16", v)) o.sets.push_back("memory.precision=fp16");
       }},
      {"tf32", nothing("tf32")},  // a matmul mode of NVIDIA GPUs; headroom's CPU GEMMs are f32 or bf16
      {"gradient_checkpointing",
       [](const std::string& v, LlavaArgs& o) {
         o.sets.push_back(str("memory.gradient_checkpointing=", truth("gradient_checkpointing", v) ? "full" : "none"));
       }},
      {"dataloader_num_workers", key("data.num_workers")},
      {"save_strategy",  // steps: with --save_steps
       choice("save_strategy", {{"no", "train.save_steps=0"}, {"steps", ""}}, "steps and no are supported")},
      {"save_steps", key("train.save_steps")},
      {"save_total_limit", key("train.save_total_limit")},
      {"evaluation_strategy",  // steps: with --eval_steps
       choice("evaluation_strategy", {{"no", "train.eval_steps=0"}, {"steps", ""}}, "steps and no are supported")},
      {"eval_steps", key("train.eval_steps")},
      {"deepspeed", key("deepspeed")},
      {"ddp_timeout", key("parallel.timeout")},  // TrainingArguments' collective timeout, in seconds
  };
  return m;
}

}  // namespace

LlavaArgs translate_llava_args(const std::vector<std::string>& args) {
  LlavaArgs out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      out.rest.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const std::size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "eval_strategy") name = "evaluation_strategy";  // the newer TrainingArguments name
    const auto it = flags().find(name);
    if (it == flags().end()) {
      out.rest.push_back(a);
      continue;
    }
    if (!inline_value) {  // the next argument, unless it is the next flag (a value left out would swallow it)
      HR_CHECK(i + 1 < args.size(), "[args] --", name, " needs a value");
      HR_CHECK(args[i + 1].rfind("--", 0) != 0, "[args] --", name, " needs a value; the next argument is the flag ",
               args[i + 1]);
      value = args[++i];
    }
    it->second(value, out);
  }
  // LLaVA's pretrain.sh: --model_name_or_path names a LlamaForCausalLM (vicuna) when --vision_tower is given.
  bool tower = false;
  for (const std::string& s : out.sets) tower |= s.rfind("model.vision_tower=", 0) == 0;
  if (tower)
    for (std::string& s : out.sets)
      if (s.rfind("model.name_or_path=", 0) == 0) s = "model.language_model=" + s.substr(19);
  return out;
}

}  // namespace hr::train

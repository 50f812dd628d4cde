// LLaVA's command line (scripts/v1_5/finetune.sh: Hugging Face TrainingArguments plus LLaVA's ModelArguments,
// DataArguments and TrainingArguments) onto headroom's config keys, so that porting a launcher changes the
// program name only. Flags headroom cannot honour are errors that say why.
#pragma once

#include <string>
#include <vector>

namespace hr::train {

struct LlavaArgs {
  std::vector<std::string> sets;          // key=value overrides, in the order given
  std::vector<std::string> rest;          // the arguments that are not LLaVA flags, for the usual parser
  std::vector<std::string> not_acted_on;  // flags accepted that change nothing here (--tf32, --lazy_preprocess ...)
};

// Splits `args`: `--flag value` and `--flag=value` of LLaVA's and TrainingArguments' flags become overrides;
// Python booleans (True/False) are read as such.
LlavaArgs translate_llava_args(const std::vector<std::string>& args);

}  // namespace hr::train

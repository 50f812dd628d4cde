// The sub-commands of the headroom tool; each returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace hr::train {

int cmd_info(const std::vector<std::string>& args);
int cmd_demo(const std::vector<std::string>& args);
int cmd_model(const std::vector<std::string>& args);
int cmd_debug(const std::vector<std::string>& args);
int cmd_train(const std::vector<std::string>& args);
int cmd_data(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_ckpt(const std::vector<std::string>& args);
int cmd_lora(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);

}  // namespace hr::train

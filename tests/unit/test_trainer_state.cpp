// trainer_state.json is read as untrusted input: every value of its type and range, or an error naming the file and
// the key (a negative epoch segfaulted the loader, a huge offset threw bad_alloc out of a loader thread, and
// "step": 1e30 resumed at step -9.2e18).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train/checkpoint.h"

using namespace hr;
using namespace hr::train;
using json = nlohmann::json;

namespace {

json good_state() {
  return json::parse(R"({"step": 8, "optimizer_steps": 7, "loader": {"epoch": 1, "offset": 16},
    "loss_scaler": {"scale": 65536.0, "iter": 8, "last_overflow": 3, "hysteresis_left": 2},
    "skipped_steps": 1, "world_size": 2, "zero_stage": 3})");
}

std::string error_of(const json& j) {
  try {
    parse_trainer_state(j.dump(), "ckpt/trainer_state.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainerState, AGoodStateReadsBack) {
  const TrainerState st = parse_trainer_state(good_state().dump(), "x");
  EXPECT_EQ(st.step, 8);
  EXPECT_EQ(st.optimizer_steps, 7);
  EXPECT_EQ(st.loader.epoch, 1);
  EXPECT_EQ(st.loader.offset, 16);
  EXPECT_EQ(st.scaler.scale, 65536.f);
  EXPECT_EQ(st.scaler.last_overflow, 3);
  EXPECT_EQ(st.world_size, 2);
  EXPECT_EQ(st.zero_stage, 3);
}

TEST(TrainerState, EveryBadValueIsNamedWithTheFile) {
  struct Case {
    std::vector<std::string> path;
    json value;
    std::string key;
  };
  const std::vector<Case> cases = {
      {{"step"}, 1e30, "step"},
      {{"step"}, -1, "step"},
      {{"step"}, 2.5, "step"},
      {{"step"}, "8", "step"},
      {{"optimizer_steps"}, 9, "optimizer_steps"},  // more than the steps
      {{"loader", "epoch"}, -1, "loader.epoch"},
      {{"loader", "offset"}, 1e18, "loader.offset"},
      {{"loader", "offset"}, -3, "loader.offset"},
      {{"loss_scaler", "scale"}, 0, "loss_scaler.scale"},
      {{"loss_scaler", "scale"}, 1e300, "loss_scaler.scale"},
      {{"loss_scaler", "iter"}, -2, "loss_scaler.iter"},
      {{"loss_scaler", "hysteresis_left"}, 1e10, "loss_scaler.hysteresis_left"},
      {{"skipped_steps"}, 100, "skipped_steps"},
      {{"world_size"}, 0, "world_size"},
      {{"zero_stage"}, 4, "zero_stage"},
  };
  for (const Case& c : cases) {
    json j = good_state();
    json* at = &j;
    for (std::size_t i = 0; i + 1 < c.path.size(); ++i) at = &(*at)[c.path[i]];
    (*at)[c.path.back()] = c.value;
    const std::string e = error_of(j);
    EXPECT_NE(e.find("[checkpoint] ckpt/trainer_state.json: " + c.key + " "), std::string::npos)
        << c.key << " = " << c.value.dump() << ": " << e;
  }
  json missing = good_state();
  missing["loader"].erase("offset");
  EXPECT_NE(error_of(missing).find("loader.offset is missing"), std::string::npos) << error_of(missing);
  EXPECT_NE(error_of(json::array()).find("not a JSON object"), std::string::npos);
  try {
    parse_trainer_state("{\"step\": ", "ckpt/trainer_state.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/trainer_state.json: not valid JSON"), std::string::npos) << e.what();
  }
}

// The position is checked against the run's data set, whose size the file cannot know.
TEST(TrainerState, TheLoaderPositionMustLieInsideTheRunsData) {
  TrainerState st = parse_trainer_state(good_state().dump(), "x");
  EXPECT_NO_THROW(check_loader_position(st, "ckpt", 64, "train.json"));
  try {
    check_loader_position(st, "ckpt", 16, "train.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("ckpt/trainer_state.json: loader.offset 16 is past the end of train.json's 16"),
        std::string::npos)
        << e.what();
  }
  st.loader.epoch = int64_t(1) << 61;
  EXPECT_THROW(check_loader_position(st, "ckpt", 64, "train.json"), Error);
}

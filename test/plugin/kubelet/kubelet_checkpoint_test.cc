#include "plugin/kubelet/kubelet_checkpoint.h"

#include <google/protobuf/util/message_differencer.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/escaping.h"
#include "test/plugin/guard_fakes.h"

using efa::plugin::CheckpointEntry;
using efa::plugin::ParseCheckpoint;
using efa::plugin::ReadCheckpoint;
using efa::testing::EfaAllocResp;
using efa::testing::FakeCheckpointEntry;
using efa::testing::FakeCheckpointJson;
using efa::testing::NvidiaAllocResp;
using google::protobuf::util::MessageDifferencer;

namespace {

constexpr char kSource[] = "/k/device-plugins/kubelet_internal_checkpoint";
constexpr char kPod[] = "0c5f1b9e-3d4a-4f43-9a51-7e1c1f2b9d10";

std::vector<FakeCheckpointEntry> TwoEntries() {
  return {
      {kPod,
       "train",
       "nvidia.com/gpu",
       {{0, {"GPU-aaaa"}}, {1, {"GPU-bbbb", "GPU-cccc"}}},
       NvidiaAllocResp({"GPU-aaaa", "GPU-bbbb", "GPU-cccc"}, true, false)},
      {kPod, "train", "vpc.amazonaws.com/efa", {{0, {"rdmap79s0"}}}, EfaAllocResp("rdmap79s0", 0)},
  };
}

}  // namespace

TEST_CASE("ParseCheckpoint reads every entry, its devices and its Allocate answer",
          "[checkpoint]") {
  const auto entries = TwoEntries();
  auto checkpoint = ParseCheckpoint(
      FakeCheckpointJson(entries, {{"nvidia.com/gpu", {"GPU-aaaa", "GPU-bbbb"}}}), kSource);
  REQUIRE(checkpoint.ok());
  REQUIRE(checkpoint->entries.size() == 2);
  const CheckpointEntry& gpu = checkpoint->entries[0];
  CHECK(gpu.pod_uid == kPod);
  CHECK(gpu.container_name == "train");
  CHECK(gpu.resource_name == "nvidia.com/gpu");
  CHECK(gpu.device_ids == std::vector<std::string>{"GPU-aaaa", "GPU-bbbb", "GPU-cccc"});
  CHECK(gpu.device_ids_by_numa.at(1) == std::vector<std::string>{"GPU-bbbb", "GPU-cccc"});
  CHECK(MessageDifferencer::Equals(gpu.alloc_resp, entries[0].alloc_resp));
  CHECK(gpu.alloc_resp.envs().at("NVIDIA_MOFED") == "enabled");
  const CheckpointEntry& efa = checkpoint->entries[1];
  CHECK(efa.resource_name == "vpc.amazonaws.com/efa");
  CHECK(MessageDifferencer::Equals(efa.alloc_resp, entries[1].alloc_resp));
  CHECK(checkpoint->registered_devices.at("nvidia.com/gpu") ==
        std::vector<std::string>{"GPU-aaaa", "GPU-bbbb"});
}

TEST_CASE("ParseCheckpoint orders NUMA nodes numerically, not as Go's sorted strings",
          "[checkpoint]") {
  // Go writes map keys sorted as strings: "-1", "10", "2".
  auto checkpoint = ParseCheckpoint(
      R"({"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r",)"
      R"("DeviceIDs":{"-1":["z"],"10":["b"],"2":["a"]},"AllocResp":null}]},"Checksum":1})",
      kSource);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->entries[0].device_ids == std::vector<std::string>{"z", "a", "b"});
}

TEST_CASE("ParseCheckpoint accepts the plain device list of kubelets before 1.20", "[checkpoint]") {
  auto entries = TwoEntries();
  entries[0].plain_device_list = true;
  auto checkpoint = ParseCheckpoint(FakeCheckpointJson(entries), kSource);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->entries[0].device_ids ==
        std::vector<std::string>{"GPU-aaaa", "GPU-bbbb", "GPU-cccc"});
  CHECK(checkpoint->entries[0].device_ids_by_numa.empty());
}

TEST_CASE("ParseCheckpoint takes null lists and a null AllocResp as empty", "[checkpoint]") {
  auto empty = ParseCheckpoint(
      R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0})", kSource);
  REQUIRE(empty.ok());
  CHECK(empty->entries.empty());
  CHECK(empty->registered_devices.empty());

  auto entries = TwoEntries();
  entries[1].null_alloc_resp = true;
  auto checkpoint = ParseCheckpoint(FakeCheckpointJson(entries), kSource);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->entries[1].alloc_resp.ByteSizeLong() == 0);
}

TEST_CASE("ParseCheckpoint names the file and the position of truncated JSON", "[checkpoint]") {
  const std::string json = FakeCheckpointJson(TwoEntries());
  const std::string cut = json.substr(0, json.size() - 1);  // the final '}'
  auto checkpoint = ParseCheckpoint(cut, kSource);
  REQUIRE_FALSE(checkpoint.ok());
  CHECK(checkpoint.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(checkpoint.status().message() ==
        std::string(kSource) + ":1:" + std::to_string(json.size()) +
            ": truncated JSON: syntax error while parsing object - unexpected end of input; "
            "expected '}'");
}

TEST_CASE("ParseCheckpoint gives the line and column of a syntax error", "[checkpoint]") {
  auto checkpoint = ParseCheckpoint("{\n  \"Data\": {\n    \"PodDeviceEntries\": [,]\n", kSource);
  REQUIRE_FALSE(checkpoint.ok());
  CHECK(checkpoint.status().message() ==
        std::string(kSource) +
            ":3:26: invalid JSON: syntax error while parsing value - unexpected ','; expected "
            "'[', '{', or a literal");
}

TEST_CASE("ParseCheckpoint names the pod and container of an AllocResp that is not base64",
          "[checkpoint]") {
  auto entries = TwoEntries();
  std::string json = FakeCheckpointJson(entries);
  const std::string good = absl::Base64Escape(entries[0].alloc_resp.SerializeAsString());
  json.replace(json.find(good), good.size(), "not*base64!");
  auto checkpoint = ParseCheckpoint(json, kSource);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->skipped ==
        std::vector<std::string>{std::string(kSource) + ": Data.PodDeviceEntries[0] (pod " + kPod +
                                 ", container \"train\", nvidia.com/gpu): AllocResp is not valid "
                                 "base64"});
  REQUIRE(checkpoint->entries.size() == 1);  // the other entry is read
  CHECK(checkpoint->entries[0].resource_name == "vpc.amazonaws.com/efa");
}

TEST_CASE("ParseCheckpoint rejects an AllocResp that is not a ContainerAllocateResponse",
          "[checkpoint]") {
  auto entries = TwoEntries();
  std::string json = FakeCheckpointJson(entries);
  const std::string good = absl::Base64Escape(entries[1].alloc_resp.SerializeAsString());
  // Field 1 with wire type 7, which does not exist.
  json.replace(json.find(good), good.size(), absl::Base64Escape(std::string("\x0f\x01", 2)));
  auto checkpoint = ParseCheckpoint(json, kSource);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->skipped ==
        std::vector<std::string>{std::string(kSource) + ": Data.PodDeviceEntries[1] (pod " + kPod +
                                 ", container \"train\", vpc.amazonaws.com/efa): AllocResp is "
                                 "not a serialized v1beta1.ContainerAllocateResponse"});
  REQUIRE(checkpoint->entries.size() == 1);
  CHECK(checkpoint->entries[0].resource_name == "nvidia.com/gpu");
}

TEST_CASE("ParseCheckpoint names the field of a value of the wrong type", "[checkpoint]") {
  struct Case {
    const char* json;
    const char* message;
    bool entry = false;  // one entry skipped, not the whole file refused
  };
  const Case cases[] = {
      {R"([])", ": the checkpoint: expected an object, got array"},
      {R"({"Checksum":1})", ": Data: missing"},
      {R"({"Data":[]})", ": Data: expected an object, got array"},
      {R"({"Data":{"PodDeviceEntries":{}}})",
       ": Data.PodDeviceEntries: expected a list, got object"},
      {.json = R"({"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":7}]}})",
       .message = ": Data.PodDeviceEntries[0].ContainerName: expected a string, got number",
       .entry = true},
      {.json = R"({"Data":{"PodDeviceEntries":[{"DeviceIDs":"x"}]}})",
       .message = ": Data.PodDeviceEntries[0].DeviceIDs: expected an object or a list, got string",
       .entry = true},
      {.json = R"({"Data":{"PodDeviceEntries":[{"DeviceIDs":{"zero":["a"]}}]}})",
       .message = ": Data.PodDeviceEntries[0].DeviceIDs: NUMA node \"zero\" is not an integer",
       .entry = true},
      {.json = R"({"Data":{"PodDeviceEntries":[{"DeviceIDs":{"0":["a",1]}}]}})",
       .message = ": Data.PodDeviceEntries[0].DeviceIDs[\"0\"][1]: expected a string, got number",
       .entry = true},
      {.json = R"({"Data":{"RegisteredDevices":{"nvidia.com/gpu":true}}})",
       .message =
           ": Data.RegisteredDevices[\"nvidia.com/gpu\"]: expected a list of strings, got boolean",
       .entry = true},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    auto checkpoint = ParseCheckpoint(c.json, kSource);
    if (c.entry) {
      REQUIRE(checkpoint.ok());
      CHECK(checkpoint->entries.empty());
      CHECK(checkpoint->skipped == std::vector<std::string>{std::string(kSource) + c.message});
    } else {
      REQUIRE_FALSE(checkpoint.ok());
      CHECK(checkpoint.status().message() == std::string(kSource) + c.message);
    }
  }
}

TEST_CASE("ReadCheckpoint reads the file and names a missing one", "[checkpoint]") {
  efa::testing::TempDir dir;
  const auto path = dir.path() / "kubelet_internal_checkpoint";
  auto missing = ReadCheckpoint(path);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message() == path.string() + ": No such file or directory");

  efa::testing::WriteFileAtomically(path, FakeCheckpointJson(TwoEntries()));
  auto checkpoint = ReadCheckpoint(path);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->entries.size() == 2);

  efa::testing::WriteFileAtomically(path, "{\"Data\":");
  auto truncated = ReadCheckpoint(path);
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.status().message() ==
        path.string() +
            ":1:9: truncated JSON: syntax error while parsing value - unexpected end of input; "
            "expected '[', '{', or a literal");
}

TEST_CASE("ParseCheckpoint reads a checkpoint of a thousand containers", "[checkpoint]") {
  std::vector<FakeCheckpointEntry> entries;
  for (int i = 0; i < 1000; ++i) {
    entries.push_back({"pod-" + std::to_string(i),
                       "c",
                       "nvidia.com/gpu",
                       {{i % 2, {"GPU-" + std::to_string(i)}}},
                       NvidiaAllocResp({"GPU-" + std::to_string(i)}, false, false)});
  }
  auto checkpoint = ParseCheckpoint(FakeCheckpointJson(entries), kSource);
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->entries.size() == 1000);
  CHECK(checkpoint->entries[999].device_ids == std::vector<std::string>{"GPU-999"});
}

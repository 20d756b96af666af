// `vortex serve` run as a user runs it: a child process on a free port, driven over HTTP. A served
// job's latents are the bits `vortex generate` writes for the same request (synthetic text states
// and uploaded ones); bad requests are 4xx answers naming the field, and nothing is queued for
// them; a full queue is a 429; jobs are cancelled queued or running; SIGTERM ends the server with
// exit code 0.
#if defined(VORTEX_HAVE_SERVICE)
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "models/h3/generate.h"
#include "safetensors_test_util.h"
#include "serve_process.h"

namespace vortex {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_util::expect_bad_request;
using test_util::json_of;
using test_util::post_json;
using test_util::ServeProcess;
using test_util::TempDir;
using test_util::wait_for_state;
using test_util::write_lora;

constexpr const char* kSmallRequest = R"({"height": 64, "width": 64, "frames": 22, "steps": 3, "seed": 5, "text_tokens": 4})";
// ~0.3 s per step on the test preset: long enough to be cancelled or to hold the queue.
constexpr const char* kSlowRequest = R"({"height": 768, "width": 1344, "frames": 22, "steps": 10000, "text_tokens": 4})";

// `vortex generate` with the same request; its summary JSON.
nlohmann::json generate(const TempDir& dir, const std::string& flags) {
  const std::string prefix = dir.file("generated");
  const std::string command = std::string(VORTEX_CLI_PATH) + " generate --synthetic test --height 64 --width 64 " +
                              "--frames 22 --steps 3 --seed 5 " + flags + " --out " + prefix + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return nlohmann::json::parse(test_util::read_bytes(prefix + ".json"));
}

TEST(CliServe, ServedJobsAreTheBitsGenerateWrites) {
  ServeProcess server;
  httplib::Client c = server.client();
  const nlohmann::json health = json_of(c.Get("/healthz"));
  EXPECT_EQ(health.value("status", ""), "ok") << health.dump();

  // Synthetic text states, JSON body.
  const httplib::Result submitted = post_json(c, kSmallRequest);
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  const std::string id = json_of(submitted).at("id");
  EXPECT_EQ(submitted->get_header_value("Location"), "/v1/jobs/" + id);
  const nlohmann::json done = wait_for_state(c, id, "succeeded");
  const nlohmann::json want = generate(server.dir(), "--text-tokens 4");
  EXPECT_EQ(done["result"]["checksums"], want["checksums"]);
  EXPECT_EQ(done["progress"]["step"], 2);
  const httplib::Result latents = c.Get("/v1/jobs/" + id + "/latents");
  ASSERT_TRUE(latents);
  ASSERT_EQ(latents->status, 200);
  EXPECT_EQ(latents->body, test_util::read_bytes(server.results() + "/" + id + ".safetensors"));
  EXPECT_TRUE(fs::exists(server.results() + "/" + id + ".json"));

  // Uploaded text states (multipart), against generate --text on the same file.
  const std::string text_file = server.dir().file("text.safetensors");
  const Tensor text = h3::seeded_normal({5, 8}, 11, 0);  // the test preset: text_dim 8
  ASSERT_TRUE(write_safetensors(text_file, {{"prompt_embeds", text}}).ok());
  const httplib::MultipartFormDataItems parts = {
      {"request", R"({"height": 64, "width": 64, "frames": 22, "steps": 3, "seed": 5})", "", "application/json"},
      {"text", test_util::read_bytes(text_file), "text.safetensors", "application/octet-stream"}};
  const httplib::Result uploaded = c.Post("/v1/jobs", parts);
  ASSERT_TRUE(uploaded);
  ASSERT_EQ(uploaded->status, 202) << uploaded->body;
  const nlohmann::json uploaded_done = wait_for_state(c, json_of(uploaded).at("id"), "succeeded");
  EXPECT_EQ(uploaded_done["result"]["checksums"], generate(server.dir(), "--text " + text_file)["checksums"]);

  const std::string metrics = c.Get("/metrics")->body;
  EXPECT_NE(metrics.find("vortex_jobs{state=\"succeeded\"} 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("vortex_steps_total 4"), std::string::npos) << metrics;
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(CliServe, BadRequestsAre4xxNamingTheFieldAndQueueNothing) {
  ServeProcess server({"--max-upload-mb", "1"});
  httplib::Client c = server.client();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"height": 48, "width": 64, "frames": 22})", "height 48 must be a positive multiple of 32"},
      {R"({"heigth": 64})", "unknown field 'heigth'"},
      {R"({"hei\ngth\u00e9": 64})", "unknown field 'hei\\x0Agth\u00e9'"},  // escaped, and the é kept
      {R"({"reference_image_1\t": 1})", "'reference_image_1\\x09': a picture comes as the multipart part"},
      {R"({"attention": "int8fp8", "exact_blocks": [4294967299], "height": 64, "width": 64, "frames": 22})",
       "exact_blocks: 4294967299 is not a block index"},
      {R"({"steps": "12"})", "steps: an integer is expected"},
      {R"({"steps": 1, "height": 64, "width": 64, "frames": 22})", "steps must be >= 2"},
      {R"({"seed": -1})", "seed: a non-negative integer"},
      {R"({"attention": "fast"})", "attention: \"exact\" or \"int8fp8\""},
      {R"({"attention": "int8fp8", "exact_blocks": [7], "height": 64, "width": 64, "frames": 22})", "exact_blocks"},
      {R"({"text_tokens": 0, "height": 64, "width": 64, "frames": 22})", "text_tokens must be >= 1"},
      {R"({"text_key": "x"})", "text_key: names a tensor of the 'text' part"},
      {R"([1, 2])", "a JSON object is expected"},
      {R"({"steps": )", "request body: not JSON"},
  };
  for (const auto& [body, needle] : cases) expect_bad_request(c, body, needle);
  // A long value is shown cut short.
  std::string long_array = "[";
  for (int i = 0; i < 4000; ++i) long_array += "1,";
  const httplib::Result long_value = post_json(c, R"({"steps": )" + long_array + "1]}");
  ASSERT_TRUE(long_value);
  EXPECT_EQ(long_value->status, 400);
  const std::string long_error = json_of(long_value).value("error", "");
  EXPECT_NE(long_error.find("steps: an integer is expected, got [1,1,1"), std::string::npos) << long_error;
  EXPECT_NE(long_error.find("... (8003 characters)"), std::string::npos) << long_error;
  EXPECT_LT(long_error.size(), 200u) << long_error;
  // An upload that is not safetensors: the error names the saved file, which is removed again.
  const httplib::MultipartFormDataItems bad_text = {{"text", "not a safetensors file", "t.safetensors", ""}};
  const httplib::Result r = c.Post("/v1/jobs", bad_text);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  // A text_key naming no tensor of the uploaded states is named escaped.
  const std::string text_file = server.dir().file("text.safetensors");
  ASSERT_TRUE(write_safetensors(text_file, {{"prompt_embeds", h3::seeded_normal({5, 8}, 11, 0)}}).ok());
  const httplib::MultipartFormDataItems wrong_key = {
      {"request", R"({"height": 64, "width": 64, "frames": 22, "text_key": "a\nb"})", "", "application/json"},
      {"text", test_util::read_bytes(text_file), "text.safetensors", "application/octet-stream"}};
  const httplib::Result no_tensor = c.Post("/v1/jobs", wrong_key);
  ASSERT_TRUE(no_tensor);
  EXPECT_EQ(no_tensor->status, 400) << no_tensor->body;
  EXPECT_NE(json_of(no_tensor).value("error", "").find("no tensor 'a\\x0Ab'"), std::string::npos) << no_tensor->body;
  const httplib::Result too_large = post_json(c, std::string(2 << 20, ' ') + "{}");
  ASSERT_TRUE(too_large);
  EXPECT_EQ(too_large->status, 413);
  EXPECT_NE(json_of(too_large).value("error", "").find("exceeds"), std::string::npos) << too_large->body;
  const httplib::Result wrong_type = c.Post("/v1/jobs", "height=64", "application/x-www-form-urlencoded");
  EXPECT_EQ(wrong_type->status, 415);
  EXPECT_EQ(c.Get("/v1/jobs/nope")->status, 404);
  // A job id that is not UTF-8 is named escaped (the JSON error could not hold its bytes raw).
  const httplib::Result odd_id = c.Get("/v1/jobs/%FF%0A");
  ASSERT_TRUE(odd_id);
  EXPECT_EQ(odd_id->status, 404);
  EXPECT_EQ(json_of(odd_id).value("error", ""), "no job '\\xFF\\x0A'") << odd_id->body;
  EXPECT_EQ(c.Delete("/v1/jobs/nope")->status, 404);
  EXPECT_EQ(c.Get("/v1/jobs/nope/latents")->status, 404);
  EXPECT_EQ(c.Get("/v2/anything")->status, 404);
  EXPECT_EQ(json_of(c.Get("/v1/jobs")).at("jobs").size(), 0u);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(server.results())) left.push_back(entry.path().string());
  EXPECT_TRUE(left.empty()) << left[0];
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(CliServe, AFullQueueIs429AndJobsCancelQueuedOrRunning) {
  ServeProcess server({"--max-queue", "1"});
  httplib::Client c = server.client();
  const std::string running = json_of(post_json(c, kSlowRequest)).at("id");
  const nlohmann::json started = wait_for_state(c, running, "running");
  const std::string queued = json_of(post_json(c, kSmallRequest)).at("id");
  const httplib::Result full = post_json(c, kSmallRequest);
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 429) << full->body;
  EXPECT_EQ(full->get_header_value("Retry-After"), "60");
  EXPECT_EQ(json_of(c.Get("/v1/jobs/" + queued)).value("queue_position", 0), 1);
  EXPECT_EQ(c.Get("/v1/jobs/" + queued + "/latents")->status, 409);

  const httplib::Result cancel_queued = c.Delete("/v1/jobs/" + queued);
  EXPECT_EQ(json_of(cancel_queued).value("state", ""), "cancelled");
  EXPECT_EQ(c.Delete("/v1/jobs/" + queued)->status, 409) << "already cancelled";
  ASSERT_EQ(c.Delete("/v1/jobs/" + running)->status, 200);
  const nlohmann::json stopped = wait_for_state(c, running, "cancelled");
  EXPECT_NE(stopped.value("error", "").find("stopped before step"), std::string::npos) << stopped.dump();
  EXPECT_FALSE(fs::exists(server.results() + "/" + running + ".safetensors")) << "a cancelled job writes nothing";

  // The queue takes work again, and SIGTERM with a job running stops it at its next step.
  const std::string again = json_of(post_json(c, kSlowRequest)).at("id");
  wait_for_state(c, again, "running");
  EXPECT_EQ(server.stop(), 0) << server.log();
  EXPECT_NE(server.log().find("stopping"), std::string::npos) << server.log();
}

// A server started on another's folder lists its finished jobs and runs what it left queued or running.
TEST(CliServe, ARestartRunsWhatWasQueuedOrRunning) {
  TempDir tmp;
  const std::string results = (tmp.path() / "results").string();
  std::string finished, interrupted, waiting;
  {
    ServeProcess first({}, "test", results);
    httplib::Client c = first.client();
    finished = json_of(post_json(c, kSmallRequest)).at("id");
    wait_for_state(c, finished, "succeeded");
    interrupted = json_of(post_json(c, kSlowRequest)).at("id");
    wait_for_state(c, interrupted, "running");
    waiting = json_of(post_json(c, kSmallRequest)).at("id");
    EXPECT_EQ(first.stop(), 0) << first.log();
  }
  // Records edited or broken since: one that is not a record is skipped; one whose request lost a
  // field fails when its turn comes (first: it was submitted earliest), and the others run on.
  test_util::write_bytes(results + "/broken.job.json", "{ not json");
  const nlohmann::json edited = {{"id", "edited"}, {"state", "queued"}, {"submitted_at", 1.0},
                                 {"request", {{"width", 64}}}};
  test_util::write_bytes(results + "/edited.job.json", edited.dump());
  ServeProcess second({}, "test", results);
  httplib::Client c = second.client();
  EXPECT_NE(second.log().find("4 jobs recorded in " + results + ", 3 of them queued again"), std::string::npos)
      << second.log();
  EXPECT_NE(second.log().find("skipping " + results + "/broken.job.json"), std::string::npos) << second.log();
  const nlohmann::json failed = wait_for_state(c, "edited", "failed");
  EXPECT_NE(failed.value("error", "").find("the job's request"), std::string::npos) << failed.dump();
  const nlohmann::json listed = json_of(c.Get("/v1/jobs"));
  ASSERT_EQ(listed.at("jobs").size(), 4u) << listed.dump();
  EXPECT_EQ(listed["jobs"][1]["id"], finished);
  EXPECT_EQ(listed["jobs"][1]["state"], "succeeded");
  EXPECT_EQ(c.Get("/v1/jobs/" + finished + "/latents")->status, 200);
  wait_for_state(c, interrupted, "running");
  ASSERT_EQ(c.Delete("/v1/jobs/" + interrupted)->status, 200);
  const nlohmann::json done = wait_for_state(c, waiting, "succeeded");
  EXPECT_EQ(done["result"]["checksums"], json_of(c.Get("/v1/jobs/" + finished))["result"]["checksums"])
      << "the same request, run after the restart";
  EXPECT_EQ(second.stop(), 0) << second.log();
}

// --media: each job's WAV (or MP4) is the very file `generate --media` writes for the request.
TEST(CliServe, MediaIsTheFileGenerateMediaWrites) {
  struct Case {
    std::string kind;
    std::vector<std::string> vaes;
  };
  std::vector<Case> cases = {{"wav", {"--synthetic-audio-vae", "small"}}};
#if defined(VORTEX_HAVE_MEDIA)
  cases.push_back({"mp4", {"--synthetic-audio-vae", "h3", "--synthetic-video-vae", "test"}});
#endif
  for (const Case& c : cases) {
    SCOPED_TRACE(c.kind);
    std::vector<std::string> extra = {"--weights-seed", "3", "--media", c.kind};
    extra.insert(extra.end(), c.vaes.begin(), c.vaes.end());
    ServeProcess server(extra, "small");
    httplib::Client client = server.client();
    const httplib::Result r =
        post_json(client, R"({"height": 128, "width": 192, "frames": 22, "steps": 2, "text_tokens": 4})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 202) << r->body;
    const std::string id = json_of(r).at("id");
    const nlohmann::json done = wait_for_state(client, id, "succeeded");
    EXPECT_EQ(done["result"].value("media", ""), "/v1/jobs/" + id + "/media") << done.dump();
    const httplib::Result media = client.Get("/v1/jobs/" + id + "/media");
    ASSERT_TRUE(media);
    ASSERT_EQ(media->status, 200);
    EXPECT_EQ(media->get_header_value("Content-Type"), c.kind == "wav" ? "audio/wav" : "video/mp4");

    const std::string out = server.dir().file("g"), file = out + "." + c.kind;
    std::string command = std::string(VORTEX_CLI_PATH) + " generate --synthetic small --height 128 --width 192 " +
                          "--frames 22 --steps 2 --text-tokens 4 --weights-seed 3 --out " + out + " --media " + file;
    for (const std::string& v : c.vaes) command += " " + v;
    ASSERT_EQ(std::system((command + " >/dev/null 2>&1").c_str()), 0) << command;
    EXPECT_EQ(media->body, test_util::read_bytes(file));
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
  // A server without --media has no media route; VAE options without --media are refused at start.
  ServeProcess plain;
  httplib::Client client = plain.client();
  const httplib::Result none = client.Get("/v1/jobs/x/media");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
  EXPECT_NE(json_of(none).value("error", "").find("start it with --media"), std::string::npos) << none->body;
  TempDir tmp;
  const std::string refused = std::string(VORTEX_CLI_PATH) + " serve --synthetic test --results " + tmp.file("r") +
                              " --synthetic-audio-vae small 2>" + tmp.file("err");
  const int status = std::system(refused.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 2);
  EXPECT_NE(test_util::read_bytes(tmp.file("err")).find("which is not given"), std::string::npos);
}

// serve --lora merges the adapter once, at load: /healthz names it, and a served job is the bits
// generate --lora writes.
TEST(CliServe, LoraAdaptersAreMergedAsGenerateMergesThem) {
  TempDir tmp;
  // Block 0's to_q of the test preset (hidden 24, inner 32), rank 2.
  std::vector<float> down(2 * 24), up(32 * 2);
  for (size_t i = 0; i < down.size(); ++i) down[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
  for (size_t i = 0; i < up.size(); ++i) up[i] = 0.03f * static_cast<float>(i % 5) - 0.05f;
  const std::string lora = tmp.file("lora.safetensors");
  ASSERT_TRUE(write_safetensors(lora, {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight",
                                        Tensor::from_f32(down, {2, 24})},
                                       {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight",
                                        Tensor::from_f32(up, {32, 2})}})
                  .ok());
  ServeProcess server({"--lora", lora + ":0.7"});
  httplib::Client c = server.client();
  const nlohmann::json health = json_of(c.Get("/healthz"));
  ASSERT_EQ(health["loras"].size(), 1u) << health.dump();
  EXPECT_EQ(health["loras"][0]["path"], lora);
  EXPECT_EQ(health["loras"][0]["strength"], 0.7);
  const httplib::Result submitted = post_json(c, kSmallRequest);
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  const nlohmann::json done = wait_for_state(c, json_of(submitted).at("id"), "succeeded");
  const nlohmann::json with = generate(server.dir(), "--text-tokens 4 --lora " + lora + ":0.7");
  EXPECT_EQ(done["result"]["checksums"], with["checksums"]);
  EXPECT_NE(done["result"]["checksums"], generate(server.dir(), "--text-tokens 4")["checksums"]);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

std::string small_request_with(const std::string& loras) {
  std::string body = kSmallRequest;
  body.insert(body.size() - 1, ", \"loras\": " + loras);
  return body;
}

// serve --lora-dir: each job merges the adapters it names after the server's --lora ones, and its
// latents are the bits generate computes with the same adapters; switching between jobs (and back
// to none) leaves nothing of the previous job's adapters behind.
TEST(CliServe, RequestAdaptersAreMergedPerJobAsGenerateMergesThem) {
  TempDir tmp;
  const std::string folder = tmp.file("loras");
  fs::create_directories(folder + "/styles");
  const std::string server_lora = tmp.file("server.safetensors");
  write_lora(server_lora, {{"transformer_blocks.0.attn.to_q", 32, 24}}, 0.1f);
  // a overlaps the server's adapter (merged after it); b touches a refiner block and the time MLP.
  write_lora(folder + "/a.safetensors", {{"transformer_blocks.0.attn.to_q", 32, 24}, {"transformer_blocks.1.ff.net.2", 24, 32}},
             0.2f);
  write_lora(folder + "/styles/b.safetensors",
             {{"token_refiner.refiner_blocks.0.attn.to_k", 32, 24}, {"time_embedder.linear_2", 16, 24}}, -0.15f);
  std::ofstream(folder + "/notes.txt") << "not an adapter\n";

  ServeProcess server({"--lora", server_lora + ":0.7", "--lora-dir", folder});
  httplib::Client c = server.client();
  EXPECT_EQ(json_of(c.Get("/healthz"))["request_loras"], true);
  const nlohmann::json listed = json_of(c.Get("/v1/loras"));
  ASSERT_EQ(listed["loras"].size(), 2u) << listed.dump();
  EXPECT_EQ(listed["loras"][0]["name"], "a.safetensors");
  EXPECT_EQ(listed["loras"][1]["name"], "styles/b.safetensors");

  const std::string a = folder + "/a.safetensors", b = folder + "/styles/b.safetensors";
  const std::string server_flag = " --lora " + server_lora + ":0.7";
  const std::vector<std::pair<std::string, std::string>> jobs = {
      {R"([{"name": "a.safetensors", "strength": 0.5}])", server_flag + " --lora " + a + ":0.5"},
      {"[]", server_flag},
      {R"([{"name": "styles/b.safetensors"}, {"name": "a.safetensors", "strength": -1}])",
       server_flag + " --lora " + b + " --lora " + a + ":-1"},
      {R"([{"name": "a.safetensors", "strength": 0.5}])", server_flag + " --lora " + a + ":0.5"},
      {R"([{"name": "a.safetensors", "strength": 0.5}])", server_flag + " --lora " + a + ":0.5"}};
  std::vector<nlohmann::json> checksums;
  for (const auto& [loras, flags] : jobs) {
    SCOPED_TRACE(loras);
    const httplib::Result submitted = post_json(c, small_request_with(loras));
    ASSERT_TRUE(submitted);
    ASSERT_EQ(submitted->status, 202) << submitted->body;
    const nlohmann::json done = wait_for_state(c, json_of(submitted).at("id"), "succeeded");
    EXPECT_EQ(done["result"]["checksums"], generate(server.dir(), "--text-tokens 4" + flags)["checksums"]);
    checksums.push_back(done["result"]["checksums"]);
    const nlohmann::json& summary = done["result"]["loras"];
    ASSERT_GE(summary.size(), 1u);
    EXPECT_EQ(summary[0]["path"], server_lora);
    if (summary.size() > 1) EXPECT_FALSE(summary[1].contains("path")) << summary.dump();  // the name, not the server's path
    // Each job but the last switched sets; the last found its adapters in place.
    const double switched = done["result"].value("adapter_switch_seconds", -1.0);
    if (checksums.size() < jobs.size()) {
      EXPECT_GT(switched, 0.0);
    } else {
      EXPECT_EQ(switched, 0.0);
    }
  }
  EXPECT_EQ(checksums[3], checksums[0]);
  EXPECT_EQ(checksums[4], checksums[0]);
  EXPECT_NE(checksums[1], checksums[0]);
  EXPECT_NE(checksums[2], checksums[1]);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(CliServe, BadRequestAdaptersAreRefusedByName) {
  TempDir tmp;
  const std::string folder = tmp.file("loras");
  fs::create_directories(folder);
  write_lora(folder + "/wide.safetensors", {{"transformer_blocks.0.attn.to_q", 32, 40}}, 0.1f);  // 40 inputs: not this model's
  write_lora(tmp.file("outside.safetensors"), {{"transformer_blocks.0.attn.to_q", 32, 24}}, 0.1f);
  {
    ServeProcess server({"--lora-dir", folder});
    httplib::Client c = server.client();
    expect_bad_request(c, small_request_with(R"("a.safetensors")"), "loras: an array");
    expect_bad_request(c, small_request_with(R"(["a.safetensors"])"), "loras[0]: an object");
    expect_bad_request(c, small_request_with(R"([{"strength": 1}])"), "loras[0].name: missing");
    expect_bad_request(c, small_request_with(R"([{"name": "wide.safetensors", "strength": "1"}])"),
                       "loras[0].strength: a finite number");
    expect_bad_request(c, small_request_with(R"([{"name": "wide.safetensors", "weight": 1}])"),
                       "loras[0].weight: unknown field");
    expect_bad_request(c, small_request_with(R"([{"name": "../outside.safetensors"}])"),
                       "not a file name inside the server's LoRA folder");
    expect_bad_request(c, small_request_with("[{\"name\": \"" + tmp.file("outside.safetensors") + "\"}]"),
                       "not a file name inside the server's LoRA folder");
    expect_bad_request(c, small_request_with(R"([{"name": "missing.safetensors"}])"),
                       "loras[0].name: no adapter 'missing.safetensors'");
    // A file that does not fit the model: named as the request named it, not by the server's path.
    const httplib::Result wide = post_json(c, small_request_with(R"([{"name": "wide.safetensors"}])"));
    ASSERT_TRUE(wide);
    EXPECT_EQ(wide->status, 400);
    const std::string error = json_of(wide).value("error", "");
    EXPECT_NE(error.find("loras[0].name: LoRA wide.safetensors: module"), std::string::npos) << error;
    EXPECT_EQ(error.find(folder), std::string::npos) << error;
    EXPECT_TRUE(json_of(c.Get("/v1/jobs"))["jobs"].empty());  // nothing was queued
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
  {
    ServeProcess server;
    httplib::Client c = server.client();
    expect_bad_request(c, small_request_with(R"([{"name": "wide.safetensors"}])"), "start it with --lora-dir");
    EXPECT_NE(json_of(c.Get("/v1/loras")).value("error", "").find("--lora-dir"), std::string::npos);
    EXPECT_EQ(server.stop(), 0) << server.log();
  }
  const std::string command = std::string(VORTEX_CLI_PATH) + " serve --synthetic test --results " + tmp.file("r") +
                              " --lora-dir " + tmp.file("nowhere") + " >" + tmp.file("out") + " 2>" + tmp.file("err");
  EXPECT_NE(std::system(command.c_str()), 0);
  EXPECT_NE(test_util::read_bytes(tmp.file("err")).find("--lora-dir"), std::string::npos);
}

}  // namespace
}  // namespace vortex
#endif  // VORTEX_HAVE_SERVICE

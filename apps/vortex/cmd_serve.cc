// vortex serve: the model loaded once, requests over HTTP (service/http_server.h lists the routes),
// run one at a time in submission order; each job writes RESULTS/<id>.safetensors and
// RESULTS/<id>.json exactly as `vortex generate --out RESULTS/<id>` would, and with --media wav|mp4
// also RESULTS/<id>.wav|.mp4 as `generate --media` would (the VAEs loaded once too). A server with a
// text encoder and a video VAE takes fl2va requests: the keyframes come as multipart PNG parts
// first_frame / last_frame and are encoded by the video VAE encoder, loaded once; and ref2va
// requests with references in the order the model reads them: position k is the PNG part
// reference_image_<k>, the video part reference_video_<k> (MP4, MOV, MKV or WebM: libav reads the
// container from its bytes) or, on a server that also has an audio VAE, the WAV part
// reference_audio_<k> (a soundtrack, encoded by the audio VAE's encoder, loaded once; a video's
// soundtrack likewise).
//
// With --lora-dir a request may name LoRA adapters of that folder ("loras"); they are merged into
// the loaded model's weights before its job runs (lora_switch.h).
//
// Every job's state is kept in RESULTS/<id>.job.json; a server started on the same folder lists the
// finished jobs again and runs what was queued or running when the last one stopped (a restart
// loses nothing that was accepted).
//
// A request is checked in full when it is submitted (fields, geometry, step count, attention plan,
// uploaded text states and keyframes, rows against the device arena), so a bad one is a 400
// naming the field and never occupies the queue. SIGINT / SIGTERM stop accepting, stop the
// running job at its next step (it and the waiting ones stay recorded, to run when a server
// restarts on the folder) and exit 0.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/json_int.h"
#include "core/quote.h"
#include "decode_media.h"
#include "formats/safetensors.h"
#include "generate_common.h"
#include "lora_switch.h"
#include "service/http_server.h"
#include "service/job_queue.h"

namespace vortex::cli {

namespace {

struct ServeArgs {
  ModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string results;
  int max_queue = 16;
  int64_t max_rows = 0;  // 0: the canonical request's rows with 512 text tokens
  int64_t max_upload_mb = 256;
  std::string media_kind;  // "wav" or "mp4": decode every job's latents; empty: latents only
  MediaRequest media;      // the VAEs (media.out is set from the results folder)
  std::string lora_dir;    // where requests' LoRA adapters are (empty: requests name none)
};

// A served request's JSON keys are the generate flags' names with '_' for '-'.
std::string json_field(const std::string& flag) {
  std::string f = flag;
  for (char& c : f) c = c == '-' ? '_' : c;
  return f;
}

// ref2va's reference parts: reading position k (from 0) is reference_<kind>_<k+1>, one numbering for
// every kind, since the model reads them interleaved (h3::kMaxReferences positions in all). The
// extension a part is saved under is what marks its kind (reference_kind_of).
struct ReferencePart {
  h3::ReferenceKind reference;
  const char* kind;       // "image", "video", "audio": in the part's name
  const char* extension;  // the saved upload's
  const char* what;       // for the error that finds it sent as a field
};
constexpr ReferencePart kReferenceParts[] = {
    {h3::ReferenceKind::kImage, "image", ".png", "a picture comes as the multipart part % (a PNG)"},
    {h3::ReferenceKind::kVideo, "video", ".mp4", "a video comes as the multipart part % (MP4, MOV, MKV or WebM)"},
    {h3::ReferenceKind::kAudio, "audio", ".wav", "a soundtrack comes as the multipart part % (a WAV)"}};
std::string reference_part(const ReferencePart& part, int k) {
  return std::string("reference_") + part.kind + "_" + std::to_string(k + 1);
}
// The part name of reading position k's saved upload (an image's unless its extension says otherwise).
std::string reference_part_of(const std::string& path, int k) {
  const h3::ReferenceKind kind = reference_kind_of(path).value_or(h3::ReferenceKind::kImage);
  for (const ReferencePart& part : kReferenceParts) {
    if (part.reference == kind) return reference_part(part, k);
  }
  return reference_part(kReferenceParts[0], k);
}

// The reference part kind a body field is named like (a file sent as a field), or null.
const ReferencePart* sent_as_field(const std::string& key) {
  for (const ReferencePart& part : kReferenceParts) {
    if (key.starts_with(std::string("reference_") + part.kind)) return &part;
  }
  return nullptr;
}

// A check's error with each saved upload's path replaced by the part it came as: the client never
// saw the server's file names. A video's soundtrack without an audio VAE reads as the server's to fix.
Status name_reference_parts(const Status& error, const std::vector<std::string>& uploads) {
  std::string message = error.message();
  for (size_t k = 0; k < uploads.size(); ++k) {
    const std::string part = reference_part_of(uploads[k], static_cast<int>(k));
    for (size_t at = message.find(uploads[k]); at != std::string::npos; at = message.find(uploads[k], at + part.size())) {
      message.replace(at, uploads[k].size(), part);
    }
  }
  const std::string flags = "(give --audio-vae or --synthetic-audio-vae)";
  if (const size_t at = message.find(flags); at != std::string::npos) {
    message.replace(at, flags.size(), "(this server encodes no soundtracks: start it with --audio-vae or "
                                      "--synthetic-audio-vae too)");
  }
  return Status(error.code(), message);
}

// The multipart file parts a submission may carry, with the extension each is saved under.
const std::map<std::string, std::string>& upload_parts() {
  static const std::map<std::string, std::string> parts = [] {
    std::map<std::string, std::string> p = {{"text", ".safetensors"}, {"first_frame", ".png"}, {"last_frame", ".png"}};
    for (int k = 0; k < h3::kMaxReferences; ++k) {
      for (const ReferencePart& part : kReferenceParts) p[reference_part(part, k)] = part.extension;
    }
    return p;
  }();
  return parts;
}

// The keyframe parts (and the recorded request's keys) in request order, with their anchors.
constexpr std::pair<const char*, h3::KeyframeAnchor> kKeyframeParts[] = {
    {"first_frame", h3::KeyframeAnchor::kFirst}, {"last_frame", h3::KeyframeAnchor::kLast}};

// The JSON body and the saved file parts → RequestOptions, every field type- and name-checked (a
// typo is an error, not a default).
Result<RequestOptions> parse_request(const nlohmann::json& body, const service::Uploads& uploads) {
  RequestOptions r;
  r.field_name = json_field;
  const auto integer = [&](const char* key, auto& out, int64_t lo, int64_t hi) -> Status {
    const nlohmann::json& v = body.at(key);
    if (!v.is_number_integer()) return invalid_argument(std::string(key) + ": an integer is expected, got " + shown_value(v));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      return invalid_argument(std::string(key) + ": " + std::to_string(x) + " is outside [" + std::to_string(lo) +
                              ", " + std::to_string(hi) + "]");
    }
    out = static_cast<std::remove_reference_t<decltype(out)>>(x);
    return ok_status();
  };
  for (const auto& [key, value] : body.items()) {
    if (key == "height") {
      VORTEX_RETURN_IF_ERROR(integer("height", r.height, 1, 1 << 16));
    } else if (key == "width") {
      VORTEX_RETURN_IF_ERROR(integer("width", r.width, 1, 1 << 16));
    } else if (key == "frames") {
      VORTEX_RETURN_IF_ERROR(integer("frames", r.frames, 1, 1 << 16));
    } else if (key == "steps") {
      VORTEX_RETURN_IF_ERROR(integer("steps", r.steps, 0, 10000));
    } else if (key == "text_tokens") {
      VORTEX_RETURN_IF_ERROR(integer("text_tokens", r.text_tokens, 0, 1 << 20));
    } else if (key == "seed") {
      if (!value.is_number_unsigned()) return invalid_argument("seed: a non-negative integer is expected, got " + shown_value(value));
      r.seed = value.get<uint64_t>();
    } else if (key == "attention") {
      if (!value.is_string() || (value != "exact" && value != "int8fp8")) {
        return invalid_argument("attention: \"exact\" or \"int8fp8\" is expected, got " + shown_value(value));
      }
      r.attention = value.get<std::string>();
    } else if (key == "exact_blocks") {
      if (!value.is_array()) return invalid_argument("exact_blocks: an array of block indices is expected, got " + shown_value(value));
      for (const nlohmann::json& b : value) {
        const std::optional<int> block = json_int(b);  // the plan checks the range
        if (!block) return invalid_argument("exact_blocks: " + shown_value(b) + " is not a block index");
        r.exact_blocks.push_back(*block);
      }
    } else if (key == "text_key") {
      if (!value.is_string()) return invalid_argument("text_key: a string is expected, got " + shown_value(value));
      r.text_key = value.get<std::string>();
    } else if (key == "prompt") {
      if (!value.is_string()) return invalid_argument("prompt: a string is expected, got " + shown_value(value));
      r.prompt = value.get<std::string>();
      if (r.prompt.empty()) return invalid_argument("prompt: empty (H3 needs at least one text token)");
    } else if (key == "reference_short_edge") {
      VORTEX_RETURN_IF_ERROR(integer("reference_short_edge", r.reference_short_edge, 1, 1 << 16));
    } else if (key == "loras") {
      continue;  // the LoRA folder's check (LoraSwitcher) reads it
    } else if (key == "first_frame" || key == "last_frame") {
      return invalid_argument(key + ": a picture comes as the multipart part '" + key + "' (a PNG), not a field");
    } else if (const ReferencePart* part = sent_as_field(key)) {
      std::string what = part->what;
      what.replace(what.find('%'), 1, quote(key));
      return invalid_argument(quote(key) + ": " + what + ", not a field");
    } else {
      return invalid_argument("unknown field " + quote(key) +
                              " (fields: prompt, height, width, frames, steps, seed, attention, exact_blocks, "
                              "text_tokens, text_key, reference_short_edge, loras; text states, keyframes and "
                              "references come as the multipart parts 'text', 'first_frame', 'last_frame' and "
                              "'reference_image_<k>', 'reference_video_<k>' or 'reference_audio_<k>' for k = 1, 2, ...)");
    }
  }
  const auto upload = [&uploads](const char* part) {
    const auto it = uploads.find(part);
    return it == uploads.end() ? std::string() : it->second;
  };
  const std::string text_upload = upload("text");
  for (const auto& [part, anchor] : kKeyframeParts) {
    if (const std::string path = upload(part); !path.empty()) r.keyframes.push_back({path, anchor});
  }
  // The references in reading order: one part per position, numbered from 1 without gaps.
  const auto position_part = [&](int k) -> Result<std::string> {
    std::string path, first;
    for (const ReferencePart& part : kReferenceParts) {
      const std::string name = reference_part(part, k), got = upload(name.c_str());
      if (got.empty()) continue;
      if (!path.empty()) return invalid_argument(name + ": came beside " + first + " (one reference per position)");
      path = got;
      first = name;
    }
    return path;
  };
  for (int k = 0; k < h3::kMaxReferences; ++k) {
    VORTEX_ASSIGN_OR_RETURN(const std::string path, position_part(k));
    if (path.empty()) {
      for (int later = k + 1; later < h3::kMaxReferences; ++later) {
        VORTEX_ASSIGN_OR_RETURN(const std::string after, position_part(later));
        if (!after.empty()) {
          return invalid_argument(reference_part_of(after, later) + ": came without a reference " +
                                  std::to_string(k + 1) + " ('reference_<image|video|audio>_" + std::to_string(k + 1) +
                                  "'; references are numbered from 1 without gaps)");
        }
      }
      break;
    }
    r.references.push_back(path);
  }
  if (body.contains("reference_short_edge") && r.references.empty()) {
    return invalid_argument("reference_short_edge: sizes reference images, and no 'reference_image_<k>' part came");
  }
  r.size_given = body.contains("height") || body.contains("width");
  if (!r.keyframes.empty() && body.contains("height") != body.contains("width")) {
    return invalid_argument("height / width: with keyframes give both (the canvas) or neither (the first keyframe's canvas)");
  }
  if (body.contains("prompt") && body.contains("text_tokens")) {
    return invalid_argument("text_tokens: synthetic text states, but a prompt came too");
  }
  if (!text_upload.empty()) {
    if (body.contains("text_tokens")) return invalid_argument("text_tokens: synthetic text states, but a 'text' part came too");
    r.text_path = text_upload;
  } else if (body.contains("text_key")) {
    return invalid_argument("text_key: names a tensor of the 'text' part, which did not come");
  }
  return r;
}

nlohmann::json request_json(const RequestOptions& r) {
  nlohmann::json j = {{"height", r.height}, {"width", r.width},         {"frames", r.frames},
                      {"steps", r.steps},   {"seed", r.seed},           {"attention", r.attention},
                      {"exact_blocks", r.exact_blocks}};
  if (!r.prompt.empty()) {
    j["prompt"] = r.prompt;
  } else if (r.text_path.empty()) {
    j["text_tokens"] = r.text_tokens;
  } else {
    j["text"] = r.text_path;
    if (!r.text_key.empty()) j["text_key"] = r.text_key;
  }
  for (const KeyframeInput& k : r.keyframes) {
    for (const auto& [part, anchor] : kKeyframeParts) {
      if (k.anchor == anchor) j[part] = k.path;
    }
  }
  if (!r.references.empty()) {
    j["references"] = r.references;
    j["reference_short_edge"] = r.reference_short_edge;
  }
  return j;
}

// The queued JSON (request_json's) back into options. Written by us, but it may come from a job
// record on disk that was edited since: a field that is missing or of the wrong type is an error.
Result<RequestOptions> request_options(const nlohmann::json& j) try {
  RequestOptions r;
  r.field_name = json_field;
  r.height = j.at("height");
  r.width = j.at("width");
  r.frames = j.at("frames");
  r.steps = j.at("steps");
  r.seed = j.at("seed");
  r.attention = j.at("attention");
  r.exact_blocks = j.at("exact_blocks").get<std::vector<int>>();
  if (j.contains("prompt")) {
    r.prompt = j.at("prompt");
  } else if (j.contains("text")) {
    r.text_path = j.at("text");
    r.text_key = j.value("text_key", "");
  } else {
    r.text_tokens = j.at("text_tokens");
  }
  for (const auto& [part, anchor] : kKeyframeParts) {
    if (j.contains(part)) r.keyframes.push_back({j.at(part).get<std::string>(), anchor});
  }
  if (j.contains("references")) {
    r.references = j.at("references").get<std::vector<std::string>>();
    r.reference_short_edge = j.at("reference_short_edge");
  }
  return r;
} catch (const nlohmann::json::exception& e) {
  return corrupt_data(std::string("the job's request: ") + e.what());
}

// The write end of run_serve's signal pipe (a signal handler can reach nothing else).
int g_signal_pipe = -1;

void write_signal_to_pipe(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t written = write(g_signal_pipe, &byte, 1);
}

Status prepare_results_folder(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (folder.empty()) return invalid_argument("--results: a folder is required");
  if (fs::exists(folder, ec) && !fs::is_directory(folder, ec)) {
    return invalid_argument("--results " + folder + ": exists and is not a folder");
  }
  fs::create_directories(folder, ec);
  if (ec) return invalid_argument("--results " + folder + ": cannot be created: " + ec.message());
  if (::access(folder.c_str(), W_OK) != 0) return invalid_argument("--results " + folder + ": not writable");
  return ok_status();
}

// Whether the server encodes ref2va references: it shows them to a text encoder, and its video VAE
// encodes the images (a soundtrack comes beside an image).
bool encodes_references(const ServeArgs& args, bool has_text_encoder) {
  return has_text_encoder && (!args.media.video_vae_path.empty() || !args.media.synthetic_video_vae.empty());
}

// With --media, the decoders, loaded once; their checks name --media as generate's name its flag.
// A video VAE without --media mp4 only encodes keyframes and images (load_keyframe_encoder_once),
// an audio VAE without --media only soundtracks (load_soundtrack_encoder_once).
Result<std::optional<MediaDecoder>> load_media(const ServeArgs& args, bool has_text_encoder) {
  MediaRequest m = args.media;
  if (args.media_kind != "mp4") {
    m.video_vae_path.clear();
    m.synthetic_video_vae.clear();
  }
  if (args.media_kind.empty() && encodes_references(args, has_text_encoder)) {
    m.audio_vae_path.clear();
    m.synthetic_audio_vae.clear();
  }
  if (args.media_kind.empty()) {
    if (any_vae_option(m)) {
      return invalid_argument("the audio VAE options decode each job's latents into --media wav|mp4, which is not "
                              "given, or encode soundtrack references beside --text-encoder and a video VAE");
    }
    return std::optional<MediaDecoder>();
  }
  m.out = (std::filesystem::path(args.results) / ("job." + args.media_kind)).string();
  m.out_flag = "--media";
  m.weights_seed = args.model.weights_seed;
  m.device = args.model.device;  // the decoders run where the transformer runs
  VORTEX_ASSIGN_OR_RETURN(MediaDecoder decoder, MediaDecoder::load(m));
  return std::optional<MediaDecoder>(std::move(decoder));
}

// The keyframes' video VAE encoder when a video VAE is named and prompts can be encoded; none
// otherwise (keyframe requests are then refused by name). A video VAE that could only encode
// keyframes, on a server without a text encoder, is refused at start.
Result<std::optional<KeyframeEncoder>> load_keyframe_encoder_once(const ServeArgs& args, bool has_text_encoder) {
  const MediaRequest& m = args.media;
  if (m.video_vae_path.empty() && m.synthetic_video_vae.empty()) return std::optional<KeyframeEncoder>();
  if (!has_text_encoder) {
    if (args.media_kind == "mp4") return std::optional<KeyframeEncoder>();
    return invalid_argument("--video-vae / --synthetic-video-vae without --media mp4 encode keyframes, which are "
                            "shown to the text encoder: give --text-encoder too");
  }
  VORTEX_ASSIGN_OR_RETURN(KeyframeEncoder encoder,
                          KeyframeEncoder::load(m.video_vae_path, m.synthetic_video_vae, args.model.weights_seed,
                                                args.model.device, args.model.vae_encode_precision));
  return std::optional<KeyframeEncoder>(std::move(encoder));
}

// The audio VAE's encoder for soundtrack references, on a server that encodes references and
// names an audio VAE (the decoder's, with --media); none otherwise (soundtracks are then refused
// by name).
Result<std::optional<SoundtrackEncoder>> load_soundtrack_encoder_once(const ServeArgs& args, bool has_text_encoder) {
  if (!encodes_references(args, has_text_encoder)) return std::optional<SoundtrackEncoder>();
  MediaRequest m = args.media;
  m.weights_seed = args.model.weights_seed;
  return SoundtrackEncoder::load(m, args.model.device);
}

std::string job_record_path(const std::filesystem::path& results, const std::string& id) {
  return (results / (id + ".job.json")).string();
}

// The job records an earlier server left in the folder; an unreadable one is reported and skipped.
std::vector<service::JobSnapshot> read_job_records(const std::filesystem::path& results) {
  std::vector<service::JobSnapshot> records;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(results, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".job.json")) continue;
    std::ifstream file(entry.path());
    const nlohmann::json j = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
    Result<service::JobSnapshot> record = service::JobSnapshot::from_json(j);
    if (!record.ok()) {
      std::fprintf(stderr, "vortex serve: skipping %s: %s\n", entry.path().c_str(), record.status().to_string().c_str());
      continue;
    }
    records.push_back(std::move(*record));
  }
  return records;
}

int run_serve(const ServeArgs& args) {
  if (Status s = prepare_results_folder(args.results); !s.ok()) return report_error(s);
  if (args.max_queue < 1) return report_error(invalid_argument("--max-queue must be >= 1"));
  if (Status precision = check_vae_encode_precision(args.model.vae_encode_precision, args.model.device);
      !precision.ok()) {
    return report_error(precision);
  }
  const auto load_start = std::chrono::steady_clock::now();
  auto config = model_config(args.model);
  if (!config.ok()) return report_error(config.status());
  int64_t max_rows = args.max_rows;
  if (max_rows == 0) {
    RequestOptions canonical;
    canonical.text_tokens = 512;
    auto rows = check_request(canonical, *config);
    if (!rows.ok()) return report_error(rows.status().with_context("the canonical request"));
    max_rows = rows->rows;
  }
  ModelOptions model_options = args.model;
  if (!args.lora_dir.empty()) {
    std::error_code error;
    if (!std::filesystem::is_directory(args.lora_dir, error)) {
      return report_error(invalid_argument("--lora-dir " + quote(args.lora_dir) + ": not a folder"));
    }
    model_options.keep_base_weights = true;
  }
  // Requests may ask for int8fp8 when the device model reserved its workspace (head dim 128 only).
  model_options.int8fp8_workspace = args.model.device == "cuda" && config->attention_head_dim == 128;
  auto text = load_text_conditioner(args.model, *config);
  if (!text.ok()) return report_error(text.status());
  const bool has_text_encoder = text->get() != nullptr;
  auto media = load_media(args, has_text_encoder);
  if (!media.ok()) return report_error(media.status());
  auto keyframe_encoder = load_keyframe_encoder_once(args, has_text_encoder);
  if (!keyframe_encoder.ok()) return report_error(keyframe_encoder.status());
  auto soundtrack_encoder = load_soundtrack_encoder_once(args, has_text_encoder);
  if (!soundtrack_encoder.ok()) return report_error(soundtrack_encoder.status());
  const SoundtrackEncoder* soundtracks = *soundtrack_encoder ? &**soundtrack_encoder : nullptr;
  if (*text && args.model.device == "cuda") {
    std::fprintf(stderr, "vortex serve: loading the text encoder onto the device...\n");
    if (Status prepared = (*text)->prepare(); !prepared.ok()) return report_error(prepared);
  }
  std::fprintf(stderr, "vortex serve: loading the model...\n");
  auto model = load_step_model(model_options, max_rows);
  if (!model.ok()) return report_error(model.status());
  std::optional<LoraSwitcher> loras;
  if (!args.lora_dir.empty()) {
    auto switcher = LoraSwitcher::create(args.lora_dir, args.model.loras, *model);
    if (!switcher.ok()) return report_error(switcher.status());
    loras.emplace(std::move(*switcher));
  }
  // A request's "loras" field: adapters in the LoRA folder, each read against the model at submit.
  const auto request_loras = [&](const nlohmann::json& body) -> Result<std::vector<RequestLora>> {
    if (!body.contains("loras")) return std::vector<RequestLora>();
    VORTEX_ASSIGN_OR_RETURN(std::vector<RequestLora> named, parse_request_loras(body.at("loras")));
    if (!named.empty() && !loras) {
      return invalid_argument("loras: this server takes no per-request LoRA adapters (start it with --lora-dir)");
    }
    return named;
  };
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const std::filesystem::path results(args.results);

  const bool int8fp8_served = model_options.int8fp8_workspace || args.model.device == "cpu";
  // What this server can run: check_request, then the arena's rows, the attention mode and the
  // VAEs' latent shapes. At submit, and again when a job starts (a restored one was checked by
  // another server).
  const auto check_served = [&](const RequestOptions& r) -> Result<CheckedRequest> {
    if (!r.keyframes.empty() && !*keyframe_encoder) {
      return invalid_argument("first_frame / last_frame: this server encodes no keyframes (start it with --text-encoder "
                              "and --video-vae or --synthetic-video-vae)");
    }
    if (!r.references.empty() && !*keyframe_encoder) {
      return invalid_argument(reference_part_of(r.references[0], 0) +
                              ": this server encodes no references (start it with --text-encoder and --video-vae "
                              "or --synthetic-video-vae)");
    }
    for (size_t k = 0; k < r.references.size() && soundtracks == nullptr; ++k) {
      if (reference_kind_of(r.references[k]) == h3::ReferenceKind::kAudio) {
        return invalid_argument(reference_part_of(r.references[k], static_cast<int>(k)) +
                                ": this server encodes no soundtracks (start it with --audio-vae or "
                                "--synthetic-audio-vae too)");
      }
    }
    auto checked_request = check_request(r, *config, text->get(), soundtracks ? &soundtracks->config() : nullptr);
    if (!checked_request.ok()) return name_reference_parts(checked_request.status(), r.references);
    CheckedRequest checked = std::move(*checked_request);
    if (args.model.device == "cuda" && checked.rows > max_rows) {
      return invalid_argument("the request packs " + std::to_string(checked.rows) + " rows; this server holds " +
                              std::to_string(max_rows) + " (--max-rows)");
    }
    if (checked.attention.uses(h3::AttentionMode::kInt8Fp8) && !int8fp8_served) {
      return invalid_argument("attention: int8fp8 needs head dim 128 on --device cuda");
    }
    if (*media) VORTEX_RETURN_IF_ERROR(check_decoder_takes(**media, checked, *config, "media"));
    return checked;
  };

  // One job at a time on the loaded model; progress to the queue and one line per step to stderr.
  service::JobQueue jobs(
      [&](const std::string& id, const nlohmann::json& request, service::JobContext& context) -> Result<nlohmann::json> {
        VORTEX_ASSIGN_OR_RETURN(const RequestOptions r, request_options(request));
        VORTEX_ASSIGN_OR_RETURN(CheckedRequest checked, check_served(r));
        VORTEX_ASSIGN_OR_RETURN(const std::vector<RequestLora> adapters, request_loras(request));
        const auto progress = [&](const h3::StepProgress& p) {
          context.report(p.step, p.total, p.elapsed_seconds);
          std::fprintf(stderr, "job %s: step %d/%d  %.3f s\n", id.c_str(), p.step, p.total, p.step_seconds);
        };
        std::fprintf(stderr, "job %s: started, %lld rows\n", id.c_str(), static_cast<long long>(checked.rows));
        std::optional<double> switch_seconds;
        if (loras) {
          context.set_phase("adapters");
          VORTEX_ASSIGN_OR_RETURN(switch_seconds, loras->use(adapters, *model, "job " + id + ": "));
        }
        if (!r.prompt.empty()) {
          context.set_phase("encode");
          VORTEX_RETURN_IF_ERROR(encode_prompt(checked, text->get()));
          if (checked.fl2va() || checked.ref2va()) {
            VORTEX_RETURN_IF_ERROR(encode_request_images(checked, **keyframe_encoder, soundtracks));
          }
        }
        context.set_phase("denoise");
        const std::string latents = (results / (id + ".safetensors")).string();
        auto run = run_request(*model, model_options, r, checked, (results / id).string(), progress,
                               [&] { return context.cancel_requested(); }, load_seconds);
        Status decoded = run.status();
        if (run.ok() && *media) {
          context.set_phase("decode");
          decoded = (*media)->decode(&run->result.video_latents, run->result.audio_latents, latents,
                                     (results / (id + "." + args.media_kind)).string());
          if (!decoded.ok()) decoded = decoded.with_context("decoding " + latents + " (kept)");
        }
        if (!decoded.ok()) {
          std::fprintf(stderr, "job %s: %s\n", id.c_str(), decoded.to_string().c_str());
          return decoded;
        }
        std::fprintf(stderr, "job %s: done in %.2f s\n", id.c_str(), run->result.run.seconds);
        nlohmann::json summary = run->summary;
        summary["latents"] = "/v1/jobs/" + id + "/latents";
        if (switch_seconds) summary["adapter_switch_seconds"] = *switch_seconds;
        if (*media) summary["media"] = "/v1/jobs/" + id + "/media";
        return summary;
      },
      args.max_queue, /*max_finished=*/1000,
      // Every change of state on disk, for the next server on this folder.
      [&results](const service::JobSnapshot& job) {
        const Status written = write_file_atomically(job_record_path(results, job.id), job.to_json().dump(2) + "\n");
        if (!written.ok()) std::fprintf(stderr, "job %s: %s\n", job.id.c_str(), written.to_string().c_str());
      });
  const std::vector<service::JobSnapshot> records = read_job_records(results);
  if (!records.empty()) {
    const int requeued = jobs.restore(records);
    std::fprintf(stderr, "vortex serve: %zu jobs recorded in %s, %d of them queued again\n", records.size(),
                 args.results.c_str(), requeued);
  }

  service::ServerHooks hooks;
  hooks.upload_dir = args.results;
  hooks.upload_parts = upload_parts();
  hooks.latents_path = [results](const std::string& id) { return (results / (id + ".safetensors")).string(); };
  if (*media) {
    hooks.media_path = [results, kind = args.media_kind](const std::string& id) {
      return (results / (id + "." + kind)).string();
    };
    hooks.media_content_type = args.media_kind == "wav" ? "audio/wav" : "video/mp4";
  }
  hooks.info = {{"model", model->source}, {"loras", model->loras}, {"device", args.model.device}, {"recipe", args.model.recipe},
                {"max_rows", max_rows}, {"int8fp8", int8fp8_served},
                {"keyframes", keyframe_encoder->has_value()}, {"references", keyframe_encoder->has_value()},
                {"video_references", keyframe_encoder->has_value()}, {"soundtrack_references", soundtracks != nullptr},
                {"vae_encode_precision", args.model.vae_encode_precision}, {"request_loras", loras.has_value()}};
  if (loras) hooks.loras = [&loras] { return loras->list(); };
  hooks.check = [&](const nlohmann::json& body, const service::Uploads& uploads) -> Result<nlohmann::json> {
    VORTEX_ASSIGN_OR_RETURN(RequestOptions r, parse_request(body, uploads));
    VORTEX_ASSIGN_OR_RETURN(const CheckedRequest checked, check_served(r));
    VORTEX_ASSIGN_OR_RETURN(const std::vector<RequestLora> adapters, request_loras(body));
    if (!adapters.empty()) VORTEX_RETURN_IF_ERROR(loras->check(adapters, *config));
    // The canvas a keyframe request resolved is recorded with it: the job (here, or after a
    // restart) puts the keyframes on the same canvas without deriving it again.
    r.height = checked.video.height;
    r.width = checked.video.width;
    r.size_given = true;
    nlohmann::json queued = request_json(r);
    if (!adapters.empty()) queued["loras"] = request_loras_json(adapters);
    return queued;
  };

  service::HttpServer server(jobs, hooks, args.max_upload_mb << 20);
  auto port = server.bind(args.host, args.port);
  if (!port.ok()) return report_error(port.status());
  std::printf("vortex serve: listening on http://%s:%d (model %s on %s; results in %s)\n", args.host.c_str(), *port,
              model->source.c_str(), args.model.device.c_str(), args.results.c_str());
  std::fflush(stdout);
  // SIGINT / SIGTERM: the handler (in whichever thread the kernel picks: OpenBLAS starts its own
  // before main) only writes the signal's number into a pipe; this thread reads it and stops the
  // server. A 0 written after serve() returns ends the thread when no signal came.
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return report_error(io_error("serve: cannot create the signal pipe"));
  g_signal_pipe = pipe_fds[1];
  struct sigaction on_stop = {};
  on_stop.sa_handler = write_signal_to_pipe;
  sigemptyset(&on_stop.sa_mask);
  sigaction(SIGINT, &on_stop, nullptr);
  sigaction(SIGTERM, &on_stop, nullptr);
  std::thread signal_thread([&] {
    unsigned char signal = 0;
    if (read(pipe_fds[0], &signal, 1) == 1 && signal != 0) {
      std::fprintf(stderr, "vortex serve: signal %d: stopping (the running job at its next step; it and the waiting ones run again "
                   "when a server restarts on this folder)\n",
                   signal);
      server.stop();
    }
  });
  const Status served = server.serve();
  const unsigned char none = 0;
  if (write(pipe_fds[1], &none, 1) != 1) std::fprintf(stderr, "vortex serve: cannot wake the signal thread\n");
  signal_thread.join();
  jobs.shutdown();
  if (!served.ok()) return report_error(served);
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, Action& action) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve generate requests over HTTP with the model loaded once");
  const auto check_model_given = add_model_options(cmd, args->model);
  cmd->add_option("--host", args->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "Port to listen on (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--results", args->results, "Folder for the jobs' latents, summaries and uploaded files")
      ->required();
  cmd->add_option("--max-queue", args->max_queue, "Jobs that may wait; more are refused with 429")->capture_default_str();
  cmd->add_option("--max-rows", args->max_rows,
                  "--device cuda: packed rows the activation arena holds (default: the canonical request with 512 "
                  "text tokens)");
  cmd->add_option("--max-upload-mb", args->max_upload_mb, "Largest request body (text states, keyframes) in MiB")
      ->capture_default_str();
  cmd->add_option("--media", args->media_kind,
                  "Also decode each job's latents to a WAV (soundtrack) or an MP4 (picture and sound), as generate --media")
      ->check(CLI::IsMember({"wav", "mp4"}));
  add_vae_options(cmd, args->media);
  cmd->add_option("--lora-dir", args->lora_dir,
                  "A folder of LoRA adapters that requests may name (\"loras\": [{\"name\": FILE, \"strength\": S}]), "
                  "merged after the --lora ones for that job without loading the model again; GET /v1/loras lists them");
  cmd->callback([args, &action, check_model_given] {
    check_model_given();
    action = [args] { return run_serve(*args); };
  });
}

}  // namespace vortex::cli

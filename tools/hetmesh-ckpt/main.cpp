// SPDX-License-Identifier: Apache-2.0
// hetmesh-ckpt: a training checkpoint's summary and its verification (docs/checkpoint.md).
//   hetmesh-ckpt info DIR     the manifest's summary: step, layout, library version, tensors, files
//   hetmesh-ckpt verify DIR   every manifest field, every file's size, header and checksum
// DIR is a checkpoint root (its `latest` is followed) or a step directory. Exit 0: fine; 1: the checkpoint
// is damaged (one line on stderr naming the file and the field); 2: misuse (bad arguments, no DIR).
#include <sys/stat.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hetmesh/train/checkpoint_store.hpp>
#include <hetmesh_tools/args.hpp>
#include <hetmesh_tools/subcommand_main.hpp>

namespace {

constexpr const char* usage_text =
    "usage:\n"
    "  hetmesh-ckpt info DIR     print the checkpoint's manifest summary\n"
    "  hetmesh-ckpt verify DIR   verify every field, size and checksum (exit 1 on damage)\n"
    "DIR: a checkpoint root (follows `latest`) or a step directory\n";

void print_info(const hetmesh::train::checkpoint_manifest& m, const std::string& dir) {
  std::int64_t elements = 0;
  for (const auto& t : m.tensors) elements += t.full;
  fmt::print("checkpoint {}\n", dir);
  fmt::print("  step      {}\n  id        {:016x}\n  library   {}\n  format    {} version {}\n", m.step, m.id,
             m.library, hetmesh::train::checkpoint_format, m.version);
  fmt::print("  dtype     {}\n  ranks     {}\n  layout    {}\n", m.dtype, m.ranks,
             m.layout.empty() ? "-" : m.layout);
  fmt::print("  tensors   {} ({} elements per field, in all)\n", m.tensors.size(), elements);
  for (const auto& t : m.tensors)
    fmt::print("    {:>6}  {:>12}  {}\n", t.id, t.full, fmt::join(t.fields, ","));
  fmt::print("  pieces    {}\n  counters  {}\n", m.pieces.size(), m.counters.size());
  for (const auto& [k, v] : m.counters) fmt::print("    {} = {}\n", k, v);
  fmt::print("  blobs     {}\n", m.blobs.size());
  for (const auto& b : m.blobs) fmt::print("    {} ({} bytes)\n", b.name, b.bytes);
  fmt::print("  files     {}\n", m.files.size());
  for (const auto& f : m.files)
    fmt::print("    {}  {:>12} bytes  checksum {:016x}\n", f.name, f.bytes, f.checksum);
}

int run(const std::string& cmd, const std::vector<std::string>& rest) {
  namespace tl = hetmesh::tools;
  static constexpr std::string_view dir_name[] = {"DIR"};
  if (cmd != "info" && cmd != "verify")
    hetmesh::throw_error<tl::usage_error>("unknown command '{}'; expected info or verify", cmd);
  const auto a = tl::parse_args(rest, {}, dir_name);
  const std::string& dir = a.positionals()[0];
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    hetmesh::throw_error<tl::usage_error>(
        "DIR '{}' is not a directory; expected a checkpoint root or step directory", dir);
  const bool step_named =
      hetmesh::train::checkpoint_step_of(std::filesystem::path(dir).filename().string()) >= 0;
  if (!std::filesystem::exists(dir + "/manifest.json") && !std::filesystem::exists(dir + "/latest")) {
    if (step_named) {  // a step directory that lost its manifest is damage, not misuse
      std::cerr << "hetmesh-ckpt: damaged: '" << dir
                << "/manifest.json' is missing; expected a step directory's "
                << "manifest\n";
      return 1;
    }
    hetmesh::throw_error<tl::usage_error>(
        "DIR '{}' holds neither manifest.json nor latest; expected a checkpoint "
        "root or step directory",
        dir);
  }
  try {
    if (cmd == "info") {
      const std::string step_dir = hetmesh::train::checkpoint_step_dir(dir);
      print_info(hetmesh::train::read_checkpoint_manifest(step_dir), step_dir);
    } else {
      const hetmesh::train::checkpoint_reader r(dir);
      std::int64_t bytes = 0;
      for (const auto& f : r.manifest().files) bytes += f.bytes;
      fmt::print("ok: {}: step {}, {} files, {} bytes, {} pieces; every field, size and checksum verified\n",
                 r.directory(), r.manifest().step, r.manifest().files.size(), bytes,
                 r.manifest().pieces.size());
    }
  } catch (const hetmesh::data_error& e) {
    std::cerr << "hetmesh-ckpt: damaged: " << e.what() << '\n';
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return hetmesh::tools::subcommand_main(argc, argv, "hetmesh-ckpt", usage_text, run);
}

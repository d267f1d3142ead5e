// SPDX-License-Identifier: Apache-2.0
// hetmesh-plan cp: the context-parallel partition of one sequence (zigzag, as Megatron-LM) or of a
// packed stream (thd, as TransformerEngine), as the token indices each rank holds.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hetmesh/seq/cp.hpp>
#include <hetmesh/seq/partition.hpp>

#include "commands.hpp"
#include "output.hpp"

namespace hetmesh_plan {
namespace {

// --scheme names -> the partition families (seq::cp_zigzag, cp_thd, cp_contiguous).
constexpr std::string_view schemes[] = {"zigzag", "thd", "contiguous"};
constexpr output_format cp_formats[] = {output_format::json, output_format::table};
// The output lists every token index (about 70 bytes of memory and 1 us each, measured): 2^22 tokens stay
// under 300 MiB and a few seconds; a 2^40-token sequence would need 70 TiB.
constexpr std::int64_t max_listed_tokens = std::int64_t{1} << 22;

void check_listed(std::int64_t tokens, std::string_view option) {
  if (tokens > max_listed_tokens)
    usage_fail(
        "option --{}: {} tokens; the partition lists every token index, about {:.1f} GiB for this input; "
        "expected at most {} tokens",
        option, tokens, static_cast<double>(tokens) * 70 / (1 << 30), max_listed_tokens);
}

// "0-3,12-15": consecutive indices folded into ranges, so a table row stays readable.
std::string ranges_of(const std::vector<std::int64_t>& idx) {
  std::string out;
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j + 1 < idx.size() && idx[j + 1] == idx[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += i == j ? fmt::format("{}", idx[i]) : fmt::format("{}-{}", idx[i], idx[j]);
    i = j + 1;
  }
  return out;
}

std::vector<std::int64_t> lengths_from_cu(const std::vector<std::int64_t>& cu) {
  if (cu.size() < 2)
    usage_fail("--cu-seqlens has {} entries; expected at least two (0 and the total)", cu.size());
  if (cu.front() != 0) usage_fail("--cu-seqlens starts at {}; expected it to start at 0", cu.front());
  std::vector<std::int64_t> lens;
  for (std::size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      usage_fail("--cu-seqlens decreases at entry {} ({} after {}); expected non-decreasing offsets", i,
                 cu[i], cu[i - 1]);
    }
    lens.push_back(cu[i] - cu[i - 1]);
  }
  return lens;
}

// The planners' message speaks of `pad = true`; on the command line that is --pad.
template <class F>
hetmesh::seq::cp_partition with_pad_hint(bool pad, F&& plan) {
  try {
    return plan();
  } catch (const hetmesh::invalid_argument& e) {
    if (pad || std::string_view(e.what()).find("multiple of 2*cp") == std::string_view::npos) throw;
    throw hetmesh::invalid_argument(std::string(e.what()) + " (hetmesh-plan: pass --pad)");
  }
}

void run_cp(const parsed& args, std::ostream& out) {
  const auto format = format_of(args, cp_formats);
  const std::string scheme = args.choice("scheme", schemes);
  const int cp = args.int32("cp", 1, 1 << 16);  // each rank is an object of the output
  const bool pad = args.flag("pad");
  const bool position_ids = args.flag("position-ids");
  if (position_ids && scheme != "thd")
    usage_fail("cp --position-ids prints TransformerEngine's THD position ids; it applies to --scheme thd");
  hetmesh::seq::cp_partition p;
  json doc;
  doc["scheme"] = scheme;
  doc["cp"] = cp;
  if (scheme == "zigzag") {
    if (args.has("cu-seqlens"))
      usage_fail("cp --scheme zigzag splits one sequence: give --seqlen, not --cu-seqlens");
    const auto seqlen = args.integer("seqlen", 1, std::int64_t{1} << 40);
    check_listed(pad ? (seqlen + 2 * cp - 1) / (2 * cp) * (2 * cp) : seqlen, "seqlen");
    p = with_pad_hint(pad, [&] { return hetmesh::seq::cp_zigzag{.cp = cp, .pad = pad}.plan(seqlen); });
    doc["seqlen"] = seqlen;
  } else {
    if (args.has("seqlen")) {
      usage_fail("cp --scheme {} partitions a packed stream: give --cu-seqlens 0,a,b,..., not --seqlen",
                 scheme);
    }
    const auto lens = lengths_from_cu(args.integer_list("cu-seqlens"));
    check_listed(args.integer_list("cu-seqlens").back(), "cu-seqlens");
    if (pad) {
      std::int64_t padded = 0;  // <= 2^24 + docs x 2^21: no overflow
      for (const auto l : lens) padded += (l + 2 * cp - 1) / (2 * cp) * (2 * cp);
      check_listed(padded, "cu-seqlens");
    }
    if (scheme == "thd") {
      p = with_pad_hint(pad, [&] { return hetmesh::seq::cp_thd{.cp = cp, .pad = pad}.plan(lens); });
    } else {
      if (pad) usage_fail("cp --scheme contiguous never pads; --pad applies to zigzag and thd");
      p = hetmesh::seq::cp_contiguous{.cp = cp}.plan(lens);
    }
    doc["cu_seqlens"] = p.cu_seqlens;
  }
  doc["pad"] = pad;
  if (pad) doc["cu_seqlens_padded"] = p.cu_seqlens_padded;
  doc["tokens"] = p.padded_tokens();
  json ranks = json::array();
  table t{{"rank", "tokens", "causal_work", "indices"}, {}};
  if (position_ids) t.header.push_back("position_ids");
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const auto& sh = p.ranks[r];
    const auto work = hetmesh::seq::causal_work(sh);
    ranks.push_back(
        {{"rank", r}, {"tokens", sh.tokens()}, {"causal_work", work}, {"indices", sh.token_index}});
    t.rows.push_back(
        {std::to_string(r), std::to_string(sh.tokens()), std::to_string(work), ranges_of(sh.token_index)});
    // TransformerEngine's THD position ids: each token's position in its (padded) document, pads
    // continuing the count (generate_positional_ids_for_cp, then get_batch_on_this_cp_rank's slices).
    if (position_ids) {
      ranks.back()["position_ids"] = sh.position_ids;
      t.rows.back().push_back(ranges_of(sh.position_ids));
    }
  }
  doc["ranks"] = std::move(ranks);
  if (format == output_format::json) {
    print_json(out, doc);
  } else {
    out << fmt::format("{} over cp={} ({} tokens{})\n", scheme, cp, p.padded_tokens(),
                       pad ? fmt::format(", padded cu_seqlens {}", p.cu_seqlens_padded) : "");
    t.print(out);
  }
}

}  // namespace

std::vector<subcommand> cp_commands() {
  command_spec spec(
      "cp", "Context-parallel partition: the token indices each of cp ranks holds, in its local order.");
  spec.required("scheme", "NAME",
                "zigzag (one sequence, Megatron-LM), thd (packed, TransformerEngine) or contiguous")
      .required("cp", "N", "context-parallel degree")
      .option("seqlen", "S", "zigzag: the sequence length")
      .option("cu-seqlens", "0,a,b,...", "thd, contiguous: document boundaries of the packed stream")
      .flag("pad", "pad each document at its end to a multiple of 2*cp first (TransformerEngine's rule)")
      .flag("position-ids",
            "thd: also print each rank's position ids, TransformerEngine's (position in the document)")
      .option("format", "FMT", "json or table", "json")
      .epilog(
          "zigzag cuts the sequence into 2*cp chunks; rank r holds chunks r and 2*cp-1-r, in that order.\n"
          "thd does the same per document of a packed stream; indices point into the packed buffer (the\n"
          "padded buffer with --pad, and \"cu_seqlens_padded\" is printed). Without --pad, a length that\n"
          "2*cp does not divide is an error (exit 2).\n\n"
          "output (json):\n"
          "  {\"scheme\": \"zigzag\", \"cp\": 2, \"seqlen\": 8, \"pad\": false, \"tokens\": 8,\n"
          "   \"ranks\": [{\"rank\": 0, \"tokens\": 4, \"causal_work\": 18, \"indices\": [0, 1, 6, 7]}, "
          "...]}\n"
          "  causal_work: (query, key) pairs the rank's queries compute under the causal mask.\n"
          "  position_ids (thd, --position-ids): per index, its position within its document, as\n"
          "  TransformerEngine's get_batch_on_this_cp_rank slices generate_positional_ids_for_cp's ids\n"
          "  (padding tokens continue their document's count).\n\n"
          "example:\n"
          "  hetmesh-plan cp --scheme thd --cp 2 --cu-seqlens 0,5,12 --pad\n");
  return {{std::move(spec), run_cp}};
}

}  // namespace hetmesh_plan

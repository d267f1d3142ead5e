// SPDX-License-Identifier: Apache-2.0
// hetmesh::model: building a micro-batch run by run, for planners that lay out a micro-batch's tokens as
// runs of document positions (train::step_layout's planned micro-batches): append each run, then close the
// attention intervals by segments, or set the plan's own (padded THD intervals).
#pragma once

#include <cstdint>

#include "../seq/types.hpp"
#include "micro_batch.hpp"

namespace hetmesh::model {

/// Appends positions `positions` of document `doc` (its index in `b`) to `mb`: per token its id (padding
/// past the document's length: b.pad_token), position, document id, stream index (from `s`, the whole
/// step's summary; -1 for padding), target and loss weight (target_counts' rule), one segment, and the
/// landings of the document's encoder items that intersect the run (a piece continuing the previous one is
/// merged). Pre: doc indexes `b` and `s`. O(run + log items).
inline void append_tokens(micro_batch& mb, const step_batch& b, const step_summary& s, std::int64_t doc,
                          seq::token_range positions) {
  detail::append_run(mb, b, s, doc, positions);
}

/// Sets mb.cu_seqlens and mb.seqlen_docs over its segments: one interval per maximal group of consecutive
/// segments of one document. O(segments).
inline void close_by_segments(micro_batch& mb) { detail::close_by_segments(mb); }

}  // namespace hetmesh::model

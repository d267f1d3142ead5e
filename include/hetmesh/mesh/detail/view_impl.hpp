// SPDX-License-Identifier: Apache-2.0
// hetmesh::mesh: the bodies of mesh::view's members (mesh/view.hpp includes this at its end): inline in a
// header-only build, compiled once in <hetmesh/src.hpp>'s translation unit under
// HETMESH_SEPARATE_COMPILATION (config.hpp), absent from every other translation unit then.
#pragma once

#include "../view.hpp"

#if HETMESH_BODIES

namespace hetmesh::mesh {

HETMESH_COMPILED view::view(std::vector<view_mode> modes, std::int64_t offset)
    : modes_(std::move(modes)), offset_(offset) {
  std::int64_t size = 1;
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (modes_[i].name == modes_[j].name) {
        throw_error<invalid_argument>("mesh has dim '{}' twice (dims: {}): expected distinct dims",
                                      modes_[i].name, detail::join_dims(modes_));
      }
    }
    for (const atom& a : modes_[i].atoms) {
      if (a.extent < 1) {
        throw_error<invalid_argument>("dim '{}' has extent {}: expected a positive extent", modes_[i].name,
                                      a.extent);
      }
      size *= a.extent;
      if (size > INT_MAX)
        throw_error<invalid_argument>("mesh has more than {} ranks: expected an int rank", INT_MAX);
    }
  }
  size_ = size;
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    for (std::size_t k = 0; k < modes_[i].atoms.size(); ++k) {
      if (modes_[i].atoms[k].extent > 1) sorted_.push_back({i, k});
    }
  }
  // Largest stride first, for the greedy inverse in coord_of.
  hetmesh::indirect_sort(sorted_.begin(), sorted_.end(),
                         [&](const slot& a, const slot& b) { return atom_at(a).stride > atom_at(b).stride; });
}

HETMESH_COMPILED std::size_t view::index_of(const dim& d) const {
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    if (modes_[i].name == d) return i;
  }
  throw_error<invalid_argument>("mesh {} has no dim '{}': expected one of {}", str(), d,
                                detail::join_dims(modes_));
}

HETMESH_COMPILED std::vector<std::int64_t> view::coord_of(int rank) const {
  std::vector<std::int64_t> c;
  if (!decompose(rank, c)) {
    throw_error<invalid_argument>("rank {} is not in mesh {}: expected one of its {} ranks", rank, str(),
                                  size_);
  }
  return c;
}

HETMESH_COMPILED int view::rank_of(std::span<const std::int64_t> coord) const {
  if (coord.size() != modes_.size()) {
    throw_error<invalid_argument>("coordinate has {} entries for mesh {}: expected {}", coord.size(), str(),
                                  modes_.size());
  }
  std::int64_t r = offset_;
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    if (coord[i] < 0 || coord[i] >= modes_[i].extent()) {
      throw_error<invalid_argument>("coordinate {} along dim '{}' of mesh {}: expected 0 <= coordinate < {}",
                                    coord[i], modes_[i].name, str(), modes_[i].extent());
    }
    r += modes_[i].contribution(coord[i]);
  }
  return static_cast<int>(r);
}

HETMESH_COMPILED int view::rank_of(std::initializer_list<std::int64_t> coord) const {
  return rank_of(std::span<const std::int64_t>(coord.begin(), coord.size()));
}

HETMESH_COMPILED std::vector<int> view::group_of(int rank, std::span<const dim> dims) const {
  const auto c = coord_of(rank);
  const auto picked = pick(dims);
  std::int64_t base = rank;
  std::vector<atom> atoms;
  for (std::size_t i : picked) {
    base -= modes_[i].contribution(c[i]);
    atoms.insert(atoms.end(), modes_[i].atoms.begin(), modes_[i].atoms.end());
  }
  return detail::enumerate_atoms(atoms, base);
}

HETMESH_COMPILED std::vector<std::vector<int>> view::groups(std::span<const dim> dims) const {
  const auto picked = pick(dims);
  std::vector<atom> inside, outside;
  for (std::size_t i : picked) inside.insert(inside.end(), modes_[i].atoms.begin(), modes_[i].atoms.end());
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    if (std::find(picked.begin(), picked.end(), i) == picked.end()) {
      outside.insert(outside.end(), modes_[i].atoms.begin(), modes_[i].atoms.end());
    }
  }
  std::vector<std::vector<int>> out;
  for (int base : detail::enumerate_atoms(outside, offset_))
    out.push_back(detail::enumerate_atoms(inside, base));
  return out;
}

HETMESH_COMPILED view view::flatten(const dim& name, std::span<const dim> dims) const {
  const auto picked = pick(dims);
  if (picked.empty())
    throw_error<invalid_argument>("flatten into '{}' got no dims: expected at least one", name);
  view_mode merged{name, {}};
  for (std::size_t i : picked)
    merged.atoms.insert(merged.atoms.end(), modes_[i].atoms.begin(), modes_[i].atoms.end());
  const std::size_t place = *std::min_element(picked.begin(), picked.end());
  std::vector<view_mode> out;
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    if (i == place)
      out.push_back(merged);
    else if (std::find(picked.begin(), picked.end(), i) == picked.end())
      out.push_back(modes_[i]);
  }
  return view(std::move(out), offset_);
}

HETMESH_COMPILED view view::submesh(std::span<const std::pair<dim, std::int64_t>> fixed) const {
  std::vector<dim> names;
  for (const auto& f : fixed) names.push_back(f.first);
  const auto picked = pick(names);
  std::int64_t offset = offset_;
  for (std::size_t k = 0; k < picked.size(); ++k) {
    const view_mode& m = modes_[picked[k]];
    if (fixed[k].second < 0 || fixed[k].second >= m.extent()) {
      throw_error<invalid_argument>("submesh fixes dim '{}' at {} in mesh {}: expected 0 <= coordinate < {}",
                                    m.name, fixed[k].second, str(), m.extent());
    }
    offset += m.contribution(fixed[k].second);
  }
  std::vector<view_mode> out;
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    if (std::find(picked.begin(), picked.end(), i) == picked.end()) out.push_back(modes_[i]);
  }
  return view(std::move(out), offset);
}

HETMESH_COMPILED view view::submesh(std::initializer_list<std::pair<dim, std::int64_t>> fixed) const {
  return submesh(std::span<const std::pair<dim, std::int64_t>>(fixed.begin(), fixed.size()));
}

HETMESH_COMPILED std::string view::order_string() const {
  std::string s;
  for (const view_mode& m : modes_) {
    if (!s.empty()) s += '-';
    s += m.name.name();
  }
  return s;
}

HETMESH_COMPILED std::string view::str() const {
  std::string e, s;
  for (const view_mode& m : modes_) {
    if (!e.empty()) {
      e += ',';
      s += ',';
    }
    e += hetmesh::format("{}=", m.name.name());
    if (m.atoms.size() == 1) {
      e += hetmesh::format("{}", m.atoms[0].extent);
      s += hetmesh::format("{}", m.atoms[0].stride);
    } else {
      std::vector<std::int64_t> ex, st;
      for (const atom& a : m.atoms) {
        ex.push_back(a.extent);
        st.push_back(a.stride);
      }
      e += hetmesh::format("({})", fmt::join(ex, ","));
      s += hetmesh::format("({})", fmt::join(st, ","));
    }
  }
  std::string out = "(" + e + "):(" + s + ")";
  if (offset_ != 0) out += hetmesh::format("+{}", offset_);
  return out;
}

HETMESH_COMPILED std::vector<atom> view::all_atoms() const {
  std::vector<atom> a;
  for (const view_mode& m : modes_) a.insert(a.end(), m.atoms.begin(), m.atoms.end());
  return a;
}

HETMESH_COMPILED std::vector<std::size_t> view::pick(std::span<const dim> dims) const {
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < dims.size(); ++k) {
    for (std::size_t j = 0; j < k; ++j) {
      if (dims[j] == dims[k]) {
        throw_error<invalid_argument>("dim '{}' is listed twice: expected distinct dims of mesh {}", dims[k],
                                      str());
      }
    }
    out.push_back(index_of(dims[k]));
  }
  return out;
}

HETMESH_COMPILED bool view::decompose(int rank, std::vector<std::int64_t>& coord) const {
  coord.assign(modes_.size(), 0);
  std::int64_t rest = static_cast<std::int64_t>(rank) - offset_;
  if (rest < 0) return false;
  std::vector<std::int64_t> digit(sorted_.size());
  for (std::size_t k = 0; k < sorted_.size(); ++k) {
    const atom& a = atom_at(sorted_[k]);
    digit[k] = rest / a.stride;
    if (digit[k] >= a.extent) return false;
    rest -= digit[k] * a.stride;
  }
  if (rest != 0) return false;
  for (std::size_t i = 0; i < modes_.size(); ++i) {
    std::int64_t c = 0, scale = 1;
    for (std::size_t a = 0; a < modes_[i].atoms.size(); ++a) {
      for (std::size_t k = 0; k < sorted_.size(); ++k) {
        if (sorted_[k].mode == i && sorted_[k].index == a) c += digit[k] * scale;
      }
      scale *= modes_[i].atoms[a].extent;
    }
    coord[i] = c;
  }
  return true;
}

}  // namespace hetmesh::mesh

#endif  // HETMESH_BODIES

// SPDX-License-Identifier: Apache-2.0
// hetmesh::comm: element types on the wire. The enum and its traits are core's (core/dtype.hpp: one
// dtype for the whole library); the communicator vocabulary names them here as comm::dtype,
// comm::element, ... Backends look MPI datatypes and NCCL data types up from dtype values, and a
// communicator checks that every rank of a collective passed the same dtype, so a rank that sends int64
// where its peers send float fails loudly.
#pragma once

#include "../core/dtype.hpp"

namespace hetmesh::comm {

using ::hetmesh::dtype;
using ::hetmesh::dtype_name;
using ::hetmesh::dtype_of;
using ::hetmesh::dtype_of_v;
using ::hetmesh::dtype_size;
using ::hetmesh::element;
using ::hetmesh::host_element;

}  // namespace hetmesh::comm

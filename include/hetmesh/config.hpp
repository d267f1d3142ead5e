// SPDX-License-Identifier: Apache-2.0
// hetmesh: configuration macros. Every HETMESH_ macro lives here; a user may define any of them
// before the first include to override the default (fmt's pattern: user value, else detect, else default).
#pragma once

/// \file
/// Configuration macros: every HETMESH_ macro but the assertions themselves (core/assert.hpp). Define
/// any of them before the first hetmesh include to override its default.

///@{
/// Assertion levels, from cheapest to most expensive. A check runs when its level is at most
/// HETMESH_ASSERTION_LEVEL.
/// - 0 off: no checks at all.
/// - 1 normal: O(1) or O(n) local precondition checks (the default).
/// - 2 collective: checks that communicate (e.g. plan hashes agree across ranks).
/// - 3 heavy: checks that cost more than the operation they guard (e.g. re-verifying a plan).
#define HETMESH_ASSERTION_LEVEL_OFF 0
#define HETMESH_ASSERTION_LEVEL_NORMAL 1
#define HETMESH_ASSERTION_LEVEL_COLLECTIVE 2
#define HETMESH_ASSERTION_LEVEL_HEAVY 3
///@}

/// The assertion level compiled in: checks of a higher level are not even evaluated. Default: normal (1).
#ifndef HETMESH_ASSERTION_LEVEL
#define HETMESH_ASSERTION_LEVEL HETMESH_ASSERTION_LEVEL_NORMAL
#endif

/// Default timeout of a collective, in milliseconds, after which it raises `timeout_error`
/// instead of waiting forever. Communicators take a run-time value; this is only the default.
#ifndef HETMESH_DEFAULT_TIMEOUT_MS
#define HETMESH_DEFAULT_TIMEOUT_MS 60000
#endif

/// Whether `throw_error` and `HETMESH_ASSERT` check their format strings at compile time (fmt's consteval
/// checker). Off by default because every checked call site costs compile time (about 3 ms each, over
/// a thousand sites in the umbrella); the arguments are still checked for being formattable, and a
/// bad string throws fmt::format_error when the error is raised. The ASan CI build turns it on.
#ifndef HETMESH_CHECK_FORMAT_STRINGS
#define HETMESH_CHECK_FORMAT_STRINGS 0
#endif

/// Whether the MPI backend is available (set by the hetmesh::mpi CMake target).
#ifndef HETMESH_HAS_MPI
#define HETMESH_HAS_MPI 0
#endif

/// Whether the NCCL backend is available (set by the hetmesh::nccl CMake target).
#ifndef HETMESH_HAS_NCCL
#define HETMESH_HAS_NCCL 0
#endif

/// Separate compilation (off by default: the library is header-only). Defined to 1 in every translation
/// unit of a program, it makes the library's largest non-template functions (the planners, the plan
/// builders, the pipeline lowering; marked HETMESH_COMPILED) plain declarations, compiled once in the one
/// source file that includes <hetmesh/src.hpp> instead of in every translation unit that calls them. A
/// trainer's translation unit then generates about a quarter less code (docs/compile-time.md). All
/// translation units of a program must agree on it, and on HETMESH_ASSERTION_LEVEL.
#ifndef HETMESH_SEPARATE_COMPILATION
#define HETMESH_SEPARATE_COMPILATION 0
#endif

///@{
/// How a HETMESH_COMPILED function is emitted: header-only, `inline` with its body (HETMESH_BODIES 1);
/// under HETMESH_SEPARATE_COMPILATION, a declaration (HETMESH_BODIES 0), except in the translation unit
/// of <hetmesh/src.hpp> (HETMESH_SOURCE), which defines each once.
#if HETMESH_SEPARATE_COMPILATION && !defined(HETMESH_SOURCE)
#define HETMESH_COMPILED
#define HETMESH_BODIES 0
#elif HETMESH_SEPARATE_COMPILATION
#define HETMESH_COMPILED
#define HETMESH_BODIES 1
#else
#define HETMESH_COMPILED inline
#define HETMESH_BODIES 1
#endif
///@}

/// How the runtime's common template instantiations are emitted under HETMESH_SEPARATE_COMPILATION (e.g.
/// run::execute_pipeline_erased over the loopback communicator and host memory): `extern template` (an
/// instantiation declaration: the translation unit generates no body) everywhere but in the translation
/// unit of <hetmesh/src.hpp>, where it is `template` (the one definition). Unused without
/// HETMESH_SEPARATE_COMPILATION (header-only: instantiated where used).
#if HETMESH_SEPARATE_COMPILATION && !defined(HETMESH_SOURCE)
#define HETMESH_INSTANTIATE extern template
#else
#define HETMESH_INSTANTIATE template
#endif

/// Under HETMESH_SEPARATE_COMPILATION, whether the runtime's instantiations over the MPI communicator
/// (comm::mpi::communicator) are compiled once in <hetmesh/src.hpp>'s translation unit too (default 0:
/// each translation unit that uses them instantiates its own). Set to 1 only where every translation unit
/// of the program, src.hpp's included, is built with HETMESH_HAS_MPI=1 and MPI's headers.
#ifndef HETMESH_COMPILED_MPI
#define HETMESH_COMPILED_MPI 0
#endif

/// Function annotation for code callable on host and device.
#ifndef HETMESH_HOST_DEVICE
#if defined(__CUDACC__)
#define HETMESH_HOST_DEVICE __host__ __device__
#else
#define HETMESH_HOST_DEVICE
#endif
#endif

///@{
/// hetmesh's version (major.minor.patch), the same as the CMake package's.
#define HETMESH_VERSION_MAJOR 0
#define HETMESH_VERSION_MINOR 1
#define HETMESH_VERSION_PATCH 0
///@}

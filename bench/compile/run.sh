#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compile-time benchmark: see run.py. Exits non-zero when hetmesh.hpp parses in more than 5 s.
exec python3 "$(dirname "$0")/run.py" "$@"

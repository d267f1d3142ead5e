#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""hetmesh-plan cp --scheme zigzag against megatron-core's get_batch_on_this_cp_rank, on the CPU.

For cp = 1..8 and sequence lengths up to 64*cp (any length at cp = 1, where Megatron passes the batch
through unchanged; multiples of 2cp otherwise), Megatron's function slices a batch of token ids 0..L-1
for every cp rank (its cp world size and rank are set through parallel_state's getters); hetmesh-plan's
per-rank indices must be identical. Exit 0 when all agree, or with a line when megatron-core is absent.
TransformerEngine's THD split and its position ids are compared by thd_vs_te.py (its package needs CUDA
to import; that script also runs TE's functions from their sources).
"""

import argparse
import json
import os
import subprocess
import sys
import warnings


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default=os.path.join(root, "build/default/tools/hetmesh-plan/hetmesh-plan"))
    ap.add_argument("--max-cp", type=int, default=8)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    try:
        import torch
        import megatron.core
        from megatron.core import parallel_state, utils
    except Exception as e:
        print(f"cp_vs_megatron: skipped: megatron-core is not importable ({type(e).__name__}: {e})")
        return 0
    if not os.access(args.plan, os.X_OK):
        print(f"cp_vs_megatron: {args.plan} is not built; build the hetmesh-plan target first")
        return 1

    state = {}
    parallel_state.get_context_parallel_world_size = lambda: state["cp"]
    parallel_state.get_context_parallel_rank = lambda: state["rank"]
    cases = mismatches = 0
    for cp in range(1, args.max_cp + 1):
        lengths = range(1, 65) if cp == 1 else range(2 * cp, 64 * cp + 1, 2 * cp)
        for length in lengths:
            out = subprocess.run([args.plan, "cp", "--scheme", "zigzag", "--cp", str(cp), "--seqlen", str(length)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(f"MISMATCH: cp={cp} L={length}: hetmesh-plan refuses: {out.stderr.strip()}")
                mismatches += 1
                continue
            ours = {r["rank"]: r["indices"] for r in json.loads(out.stdout)["ranks"]}
            for rank in range(cp):
                state.update(cp=cp, rank=rank)
                batch = utils.get_batch_on_this_cp_rank({"tokens": torch.arange(length).view(1, length)})
                theirs = batch["tokens"].view(-1).tolist()
                cases += 1
                if ours.get(rank) != theirs:
                    mismatches += 1
                    if mismatches <= 10:
                        print(f"MISMATCH: cp={cp} L={length} rank {rank}: Megatron {theirs[:12]}, hetmesh "
                              f"{(ours.get(rank) or [])[:12]}")
    print(f"cp_vs_megatron: megatron-core {megatron.core.__version__} get_batch_on_this_cp_rank, cp 1..{args.max_cp}: "
          f"{cases} (cp, length, rank) cases, odd lengths at cp = 1 included; {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""hetmesh-plan cp --scheme thd --position-ids against TransformerEngine's THD functions, on the CPU.

For cp = 1..max-cp and a set of packed streams (document lengths, with and without --pad), TransformerEngine
pads the stream (`pad_thd_sequences_for_cp`, divisibility factor 2*cp), makes its position ids
(`generate_positional_ids_for_cp`) and slices them for every cp rank (`get_batch_on_this_cp_rank`, qvk_format
"thd", its per-document dual-chunk split, whose CPU path needs no CUDA kernel). hetmesh-plan's per-rank
`position_ids` must equal TE's, and its `indices` (into the padded buffer) must equal TE's slice of
arange(padded tokens); its `cu_seqlens_padded` must equal TE's.

Where the peer comes from:
  * `import transformer_engine` works (TE installed with its CUDA libraries): its functions are used, with
    torch.distributed's world size and rank set per case;
  * otherwise `--te-source DIR` names an unpacked TransformerEngine wheel or checkout (for example
    `pip download transformer_engine --no-deps` and unzip it): the three functions (and the
    CPLoadBalancingStrategy enum they take) are read from its transformer_engine/pytorch sources and run as
    they are, over torch, with nothing else of TE imported (its package needs CUDA to import);
  * neither (or no torch): the script says why and exits 0, nothing to compare against.
Exit 0 when all agree, 1 on a mismatch.

usage: scripts/peers/thd_vs_te.py [--plan build/default/tools/hetmesh-plan/hetmesh-plan] [--max-cp 8]
                                  [--te-source DIR]
"""

import argparse
import ast
import enum
import json
import os
import random
import subprocess
import sys
import types
import typing
import warnings

TE_FUNCS = ("pad_thd_sequences_for_cp", "generate_positional_ids_for_cp", "get_batch_on_this_cp_rank")
CP_FILE = "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py"
CONST_FILE = "transformer_engine/pytorch/constants.py"


class Dist(types.SimpleNamespace):
    """torch.distributed as the peer's function sees it: the cp world size and rank of the current case."""

    def __init__(self, real):
        super().__init__(ProcessGroup=getattr(real, "ProcessGroup", object), world=1, rank=0)

    def get_world_size(self, group=None):
        return self.world

    def get_rank(self, group=None):
        return self.rank


def definitions(path, names):
    """The top-level function and class definitions `names` of a Python file, as a module AST."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    found = {n.name for n in body}
    missing = set(names) - found
    if missing:
        raise ImportError(f"{path} has no {', '.join(sorted(missing))}")
    return ast.Module(body=body, type_ignores=[])


def te_from_source(root, torch):
    """TE's THD functions read from its sources under `root`, run over torch with a stand-in
    torch.distributed. Returns (namespace, Dist, version)."""
    dist = Dist(torch.distributed)
    shim = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    shim.distributed = dist
    ns = {"torch": shim, "enum": enum, "Tuple": typing.Tuple, "List": typing.List, "Union": typing.Union,
          "Optional": typing.Optional}
    exec(compile(definitions(os.path.join(root, CONST_FILE), ["CPLoadBalancingStrategy"]), CONST_FILE, "exec"), ns)
    exec(compile(definitions(os.path.join(root, CP_FILE), TE_FUNCS), CP_FILE, "exec"), ns)
    version = "source"
    for meta in os.listdir(root):
        if meta.startswith("transformer_engine-") and meta.endswith(".dist-info"):
            version = meta[len("transformer_engine-"):-len(".dist-info")] + " (source)"
    return ns, dist, version


def te_installed(torch):
    import transformer_engine
    from transformer_engine.pytorch.attention.dot_product_attention import context_parallel as cp

    dist = Dist(torch.distributed)
    torch.distributed.get_world_size = dist.get_world_size
    torch.distributed.get_rank = dist.get_rank
    return {k: getattr(cp, k) for k in TE_FUNCS}, dist, transformer_engine.__version__


def cases(max_cp, seed=37):
    """(cp, document lengths, pad) of the grid: fixed shapes and a few random streams per cp."""
    rnd = random.Random(seed)
    for cp in range(1, max_cp + 1):
        d = 2 * cp
        yield cp, [d], False
        yield cp, [d, 3 * d, 2 * d], False
        yield cp, [5 * d, d, d, 4 * d], False
        yield cp, [1], True
        yield cp, [5, 7], True
        yield cp, [d - 1, d + 1, 3 * d], True
        for _ in range(4):
            lens = [rnd.randint(1, 12 * d) for _ in range(rnd.randint(1, 6))]
            yield cp, lens, True
            yield cp, [(x + d - 1) // d * d for x in lens], False


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default=os.path.join(root, "build/default/tools/hetmesh-plan/hetmesh-plan"))
    ap.add_argument("--max-cp", type=int, default=8)
    ap.add_argument("--te-source", help="an unpacked TransformerEngine wheel or checkout (no CUDA needed)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"thd_vs_te: skipped: torch is not importable ({type(e).__name__}: {e})")
        return 0
    try:
        te, dist, version = te_installed(torch)
    except Exception as e:  # noqa: BLE001 - TE absent or without CUDA
        if not args.te_source:
            print(f"thd_vs_te: skipped: TransformerEngine is not importable ({type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}) and no --te-source was given")
            return 0
        te, dist, version = te_from_source(args.te_source, torch)
    if not os.access(args.plan, os.X_OK):
        print(f"thd_vs_te: {args.plan} is not built; build the hetmesh-plan target first")
        return 1

    count = ranks = mismatches = 0
    for cp, lens, pad in cases(args.max_cp):
        count += 1
        cu = [0]
        for x in lens:
            cu.append(cu[-1] + x)
        cmd = [args.plan, "cp", "--scheme", "thd", "--cp", str(cp), "--cu-seqlens", ",".join(map(str, cu)),
               "--position-ids"] + (["--pad"] if pad else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        what = f"cp={cp} cu_seqlens={cu}{' --pad' if pad else ''}"
        if out.returncode != 0:
            mismatches += 1
            print(f"MISMATCH: {what}: hetmesh-plan exits {out.returncode}: {out.stderr.strip()}")
            continue
        doc = json.loads(out.stdout)
        cu_t = torch.tensor(cu, dtype=torch.long)
        tokens = torch.arange(cu[-1], dtype=torch.long)
        _, _, cu_padded = te["pad_thd_sequences_for_cp"](tokens, tokens, cu_t, 2 * cp)
        positions = te["generate_positional_ids_for_cp"](cu_t, 2 * cp)
        padded_index = torch.arange(int(cu_padded[-1]), dtype=torch.long)
        ours_cu = doc.get("cu_seqlens_padded", doc.get("cu_seqlens"))
        if ours_cu != cu_padded.tolist():
            mismatches += 1
            print(f"MISMATCH: {what}: cu_seqlens_padded {ours_cu} vs TE {cu_padded.tolist()}")
            continue
        for r in range(cp):
            dist.world, dist.rank = cp, r
            idx, _, pos = te["get_batch_on_this_cp_rank"](cu_padded, padded_index, padded_index.clone(),
                                                           positions.clone(), qvk_format="thd")
            ours = doc["ranks"][r]
            ranks += 1
            if ours["position_ids"] != pos.tolist() or ours["indices"] != idx.tolist():
                mismatches += 1
                if mismatches <= 10:
                    print(f"MISMATCH: {what} rank {r}: position ids {ours['position_ids'][:12]} vs TE "
                          f"{pos.tolist()[:12]}; indices {ours['indices'][:12]} vs TE {idx.tolist()[:12]}")
    print(f"thd_vs_te: TransformerEngine {version} get_batch_on_this_cp_rank (thd) with "
          f"generate_positional_ids_for_cp, cp 1..{args.max_cp}: {count} packed streams, {ranks} (stream, rank) "
          f"position-id lists compared; {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

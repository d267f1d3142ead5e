#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares `hetmesh-plan pipeline --schedule dualpipev` with PyTorch's ScheduleDualPipeV.

For every (pp, micro-batches) of a grid, the script builds PyTorch's schedule (torch.distributed.pipelining,
no process group needed: the stages are stand-ins that carry only the fields the schedule's constructor
reads) and runs hetmesh-plan, then checks that
  - both accept or both refuse the configuration (hetmesh-plan: exit 2 and one line on stderr);
  - where both accept, every rank's compute order is identical, action by action, in PyTorch's text
    (`0F3`, `3I0`, `(0F3;3B1)OVERLAP_F_B`), and hetmesh-plan's `--format csv` equals the CSV that
    PyTorch's `_dump_csv(format="compute_only")` writes;
  - the stage-to-rank map equals PyTorch's ("v" style);
  - the lowered schedule (`--lowered --format csv`, the "compute_comms" CSV) is loaded by PyTorch's
    `_PipelineScheduleRuntime._load_csv(format="compute_comms")`, places every WAIT_SEND_F/B where
    PyTorch's `_add_wait_send` places it (hetmesh's rows without their waits, given back to
    `_add_wait_send`, come back unchanged), and equals PyTorch's own lowering passes (`_add_reduce_grad`,
    `_add_send_recv`, `_add_wait_send`) over PyTorch's order, WAIT_REDUCE_GRAD aside (see
    pipeline_vs_pytorch.py).
It prints one line per disagreement and a summary, and exits 0 when everything agrees, 1 otherwise.
Without torch it prints why and exits 0 (nothing to compare against).

Usage: dualpipev_vs_pytorch.py [--plan PATH/TO/hetmesh-plan] [--max-pp 8] [--extra 10]
"""

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types


def find_plan(explicit):
    if explicit:
        return explicit
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for preset in ("default", "release", "debug"):
        p = os.path.join(root, "build", preset, "tools", "hetmesh-plan", "hetmesh-plan")
        if os.path.exists(p):
            return p
    return shutil.which("hetmesh-plan")


def torch_schedule(pp, m):
    """PyTorch's ScheduleDualPipeV for (pp, m): (orders per rank as text, stage map), or the refusal."""
    from torch.distributed.pipelining.schedules import ScheduleDualPipeV

    # The two stages rank 0 would hold; the constructor computes every rank's order from them.
    stages = [
        types.SimpleNamespace(group_size=pp, group_rank=0, num_stages=2 * pp, submod=None, stage_index=i)
        for i in (0, 2 * pp - 1)
    ]
    try:
        s = ScheduleDualPipeV(stages, m)
    except (ValueError, RuntimeError, AssertionError) as e:
        return None, None, str(e)
    orders = [[str(a) for a in s.pipeline_order[r] if a is not None] for r in range(pp)]
    stage_map = [s.stage_index_to_group_rank[i] for i in range(2 * pp)]
    return orders, stage_map, None


def torch_csv(orders):
    buf = io.StringIO()
    w = csv.writer(buf)  # as _dump_csv: one row per rank, str() of each action
    for row in orders:
        w.writerow(row)
    return buf.getvalue()


def check_lowered(exe, pp, m, orders, stage_map, tmp):
    """(loaded, waits placed as PyTorch, equal to PyTorch's lowering, problems) of hetmesh's lowered CSV."""
    from torch.distributed.pipelining import schedules as S

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from pipeline_vs_pytorch import Stage, pytorch_lowering, wait_placement_problems

    r = subprocess.run(
        [exe, "pipeline", "--schedule", "dualpipev", "--pp", str(pp), "--microbatches", str(m), "--lowered",
         "--format", "csv"],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        return False, False, False, [f"--lowered exits {r.returncode}: {r.stderr.strip()}"]
    path = os.path.join(tmp, "lowered.csv")
    with open(path, "w", newline="") as f:
        f.write(r.stdout)
    with open(path, newline="") as f:
        rows = [[a for a in row if a] for row in csv.reader(f)]
    problems = []
    n = 2 * pp
    loaded = True
    try:
        rt = S._PipelineScheduleRuntime([Stage(s, n, pp, 0) for s in range(n) if stage_map[s] == 0], m)
        rt._load_csv(path, format="compute_comms")
        if {k: [str(a) for a in v] for k, v in rt.pipeline_order_with_comms.items()} != dict(enumerate(rows)):
            loaded = False
            problems.append("_load_csv read a different schedule")
    except Exception as e:  # noqa: BLE001 - any refusal of PyTorch's is the finding
        loaded = False
        problems.append(f"_load_csv: {type(e).__name__}: {str(e).splitlines()[0]}")
    placement = wait_placement_problems(S, rows)
    problems += placement
    ours = {k: [a for a in acts if "WAIT_REDUCE_GRAD" not in a] for k, acts in enumerate(rows)}
    equal = False
    for turn in (True, False):
        theirs = pytorch_lowering(S, dict(enumerate(orders)), pp, stage_map, n, m, reduce_wait_turn=turn)
        equal = equal or ours == {k: [a for a in acts if "WAIT_REDUCE_GRAD" not in a] for k, acts in theirs.items()}
    if not equal:
        problems.append("differs from PyTorch's lowering passes")
    return loaded, not placement, equal, problems


def plan(exe, pp, m, fmt):
    r = subprocess.run(
        [exe, "pipeline", "--schedule", "dualpipev", "--pp", str(pp), "--microbatches", str(m), "--format", fmt],
        capture_output=True,
        check=False,
    )
    # bytes, decoded without newline translation: the CSV's "\r\n" line ends are compared as written
    r.stdout, r.stderr = r.stdout.decode(), r.stderr.decode()
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", help="the hetmesh-plan executable (default: build/<preset>/tools/... or PATH)")
    ap.add_argument("--max-pp", type=int, default=8, help="largest pipeline size of the grid")
    ap.add_argument("--extra", type=int, default=10, help="micro-batch counts 1 .. 2*pp + extra per pp")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        from torch.distributed.pipelining.schedules import ScheduleDualPipeV  # noqa: F401
    except Exception as e:  # torch absent or without pipelining: nothing to compare against
        print(f"dualpipev_vs_pytorch: skipped, torch.distributed.pipelining is not importable ({e})")
        return 0
    exe = find_plan(args.plan)
    if not exe or not os.path.exists(exe):
        print("dualpipev_vs_pytorch: hetmesh-plan not found; build it or pass --plan", file=sys.stderr)
        return 2
    import torch

    configs = accepted = refused = bad = 0
    lowered = loaded = waits = equal = 0
    tmp = tempfile.mkdtemp(prefix="dualpipev_vs_pytorch.")
    for pp in range(1, args.max_pp + 1):
        for m in range(1, 2 * pp + args.extra + 1):
            configs += 1
            orders, stage_map, why = torch_schedule(pp, m)
            r = plan(exe, pp, m, "json")
            where = f"pp={pp} m={m}"
            if orders is None:
                if r.returncode == 2 and not r.stdout and len(r.stderr.strip().splitlines()) == 1:
                    refused += 1
                else:
                    bad += 1
                    print(f"{where}: PyTorch refuses ({why}) but hetmesh-plan exits {r.returncode}")
                continue
            if r.returncode != 0:
                bad += 1
                print(f"{where}: PyTorch accepts but hetmesh-plan exits {r.returncode}: {r.stderr.strip()}")
                continue
            doc = json.loads(r.stdout)
            ok = doc["ranks"] == orders and doc["stage_to_rank"] == stage_map
            c = plan(exe, pp, m, "csv")
            ok = ok and c.returncode == 0 and c.stdout == torch_csv(orders)
            lowered += 1
            lo, wa, eq, problems = check_lowered(exe, pp, m, orders, stage_map, tmp)
            loaded, waits, equal = loaded + lo, waits + wa, equal + eq
            for p in problems:
                print(f"{where} --lowered: {p}")
            ok = ok and not problems
            if ok:
                accepted += 1
            else:
                bad += 1
                for rank in range(pp):
                    got = doc["ranks"][rank] if rank < len(doc["ranks"]) else []
                    if got != orders[rank]:
                        k = next((i for i, (a, b) in enumerate(zip(got, orders[rank])) if a != b), None)
                        print(f"{where} rank {rank}: differs at action {k}: hetmesh {got[k:k + 3] if k is not None else got}"
                              f" vs PyTorch {orders[rank][k:k + 3] if k is not None else orders[rank]}")
                if doc["stage_to_rank"] != stage_map:
                    print(f"{where}: stage map {doc['stage_to_rank']} vs PyTorch {stage_map}")
                if c.stdout != torch_csv(orders):
                    print(f"{where}: --format csv differs from PyTorch's _dump_csv")
    print(
        f"dualpipev vs torch {torch.__version__} ScheduleDualPipeV: {configs} configurations "
        f"(pp 1..{args.max_pp}, micro-batches 1..2*pp+{args.extra}): {accepted} identical (orders, CSV, stage map, lowering), "
        f"{refused} refused by both, {bad} disagreements"
    )
    print(
        f"lowered (--lowered --format csv): {lowered} CSVs, {loaded} loaded by _load_csv(compute_comms), "
        f"{waits} place WAIT_SEND as _add_wait_send, {equal} equal PyTorch's lowering passes"
    )
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

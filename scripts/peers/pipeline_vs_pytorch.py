#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compare `hetmesh-plan pipeline` with PyTorch's torch.distributed.pipelining schedules, side by side.

For every schedule that shares a name with PyTorch's (gpipe, 1f1b, interleaved-1f1b, looped-bfs,
interleaved-zero-bubble, zero-bubble = ScheduleInterleavedZeroBubble with one stage per rank, zbv) and every
configuration of a grid (pp, micro-batches, stages per rank where the schedule takes them):

  * orders: PyTorch's per-rank compute order next to hetmesh's; a configuration PyTorch refuses must be
    refused by hetmesh-plan with exit 2, one PyTorch accepts must print the identical order. The one
    documented exception: 1F1B with fewer micro-batches than stages, which Megatron-LM and hetmesh accept
    and PyTorch's Schedule1F1B refuses.
  * lowering: `hetmesh-plan pipeline --lowered --format csv` is loaded by PyTorch's
    `_PipelineScheduleRuntime._load_csv(..., format="compute_comms")` (which validates the schedule and its
    send waits), dry-run by PyTorch's simulator `_simulate_comms_compute`, executed rank by rank by
    PyTorch's runtime loop `_step_microbatches` over recording stages (no process group: each compute finds
    its RECV posted, each send its wait), checked to place every WAIT_SEND_F/B where PyTorch's
    `_add_wait_send` places it (given hetmesh's other actions), and compared with PyTorch's own lowering passes
    (`_add_reduce_grad`, `_add_send_recv`, `_add_wait_send`; FSDP's UNSHARD/RESHARD left out).

No process group is needed: schedules are built over stand-in stage objects that carry only what the
schedule constructors read, and the orders are what PyTorch's schedules hold (`pipeline_order`) or, for the
single-stage schedules GPipe and 1F1B, what their runtime loop runs (recorded by the stand-in stage, because
Schedule1F1B's `pipeline_order` numbers the last rank's forwards from 1).

Exits 0 with "skipped: torch not installed" when torch is absent, 0 when everything agrees, 1 otherwise.

usage: scripts/peers/pipeline_vs_pytorch.py [--plan build/default/tools/hetmesh-plan/hetmesh-plan]
                                            [--max-pp 8] [--max-mb 16] [--max-virtual 4] [--no-lowered]
                                            [--schedules gpipe,1f1b,...]
"""

import argparse
import csv
import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings


def load_torch():
    try:
        warnings.filterwarnings("ignore")
        import torch  # noqa: F401
        from torch.distributed.pipelining import schedules as S
    except ImportError:
        return None, None
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.CRITICAL)
    return torch, S


class Stage:
    """A stand-in for a PipelineStage: what the schedule constructors read, and the calls the runtime loops
    make, recorded. No tensors, no communication (every send/recv batch is empty)."""

    def __init__(self, index, num_stages, pp, rank):
        self.stage_index = index
        self.num_stages = num_stages
        self.group_size = pp
        self.group_rank = rank
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.submod = None
        self.stage_index_to_group_rank = None
        self.log = []

    def get_fwd_recv_ops(self, mb):
        return []

    def get_bwd_recv_ops(self, mb):
        return []

    def get_fwd_send_ops(self, mb):
        return []

    def get_bwd_send_ops(self, mb):
        return []

    def release_fwd_send_outputs(self, mb):
        pass

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
        self.log.append(f"{self.stage_index}{'B' if full_backward else 'I'}{mb}")

    def backward_weight_one_chunk(self, mb, last_backward=False):
        self.log.append(f"{self.stage_index}W{mb}")

    def perform_reduce_grad(self, factor):
        self.log.append(f"{self.stage_index}REDUCE_GRAD")

    def set_local_fwd_input(self, output, mb):
        pass

    def set_local_bwd_input(self, grad, mb):
        pass

    def get_local_bwd_output(self, mb):
        return None


def quiet_runtime(sched):
    """Stubs the parts of a schedule's step that need tensors, a loss or a process group."""
    sched._check_inputs = lambda a, k, t, l: (a, k)
    sched._initialize_stage = lambda *a, **k: None
    sched._initialize_stages = lambda *a, **k: None
    sched._maybe_compute_loss = lambda *a, **k: None
    sched._maybe_get_loss = lambda *a, **k: None
    sched._update_losses = lambda *a, **k: None
    sched._has_backward = True


def run_steps(sched, m):
    quiet_runtime(sched)
    sched._step_microbatches(arg_mbs=[()] * m, kwarg_mbs=[{}] * m, target_mbs=None, losses=None)


# ---- PyTorch's side -----------------------------------------------------------------------------------


def pytorch_order(S, name, pp, m, v):
    """{rank: [action text]} of PyTorch's compute order, or the refusal's message (str)."""
    single = {"gpipe": S.ScheduleGPipe, "1f1b": S.Schedule1F1B}
    multi = {
        "interleaved-1f1b": S.ScheduleInterleaved1F1B,
        "looped-bfs": S.ScheduleLoopedBFS,
        "interleaved-zero-bubble": S.ScheduleInterleavedZeroBubble,
        "zero-bubble": S.ScheduleInterleavedZeroBubble,
        "zbv": S.ScheduleZBVZeroBubble,
    }
    try:
        if name in single:
            order = {}
            for r in range(pp):
                st = Stage(r, pp, pp, r)
                sched = single[name](st, m)
                run_steps(sched, m)
                order[r] = [a for a in st.log if not a.endswith("REDUCE_GRAD")]
            return order
        n = pp * v
        if name == "zbv":
            stages = [Stage(0, n, pp, 0), Stage(n - 1, n, pp, 0)]
        else:
            stages = [Stage(c * pp, n, pp, 0) for c in range(v)]
        sched = multi[name](stages, m)
        return {
            r: [str(a) for a in acts if a is not None and a.is_compute_op]
            for r, acts in sorted(sched.pipeline_order.items())
        }
    except (ValueError, AssertionError, RuntimeError, ZeroDivisionError) as e:
        return f"{type(e).__name__}: {e}".splitlines()[0]


def pytorch_lowering(S, order, pp, stage_to_rank, num_stages, m, reduce_wait_turn=True):
    """PyTorch's lowering passes over a compute order ({rank: [text]}), without FSDP's UNSHARD/RESHARD.
    With reduce_wait_turn False, each WAIT_REDUCE_GRAD is taken out before `_add_send_recv` (where it takes
    a turn of its own in PyTorch) and put back right after its REDUCE_GRAD, as hetmesh writes it."""
    compute = {r: [S._Action.from_str(a) for a in acts] for r, acts in order.items()}
    with_reduce = {r: S._add_reduce_grad(acts, m) for r, acts in compute.items()}
    if not reduce_wait_turn:
        with_reduce = {
            r: [a for a in acts if a.computation_type != S.WAIT_REDUCE_GRAD] for r, acts in with_reduce.items()
        }
    comms = S._add_send_recv(with_reduce, stage_to_rank=lambda s: stage_to_rank[s], num_stages=num_stages)
    comms = S._add_wait_send(comms)
    return {r: [str(a) for a in comms[r]] for r in sorted(comms)}


def wait_placement_problems(S, rows):
    """How hetmesh's send waits differ from where PyTorch's `_add_wait_send` puts them (list of str, empty
    when identical): the rows (lists of action text) without their WAIT_SEND_F/B are given back to
    `_add_wait_send`, which must return the rows exactly. This isolates the waits' placement from the
    order of the other actions."""
    stripped = {
        r: [S._Action.from_str(a) for a in acts if "WAIT_SEND_" not in a] for r, acts in enumerate(rows)
    }
    theirs = {r: [str(a) for a in acts] for r, acts in S._add_wait_send(stripped).items()}
    problems = []
    for r, acts in enumerate(rows):
        if theirs[r] != acts:
            k = next((i for i, (a, b) in enumerate(zip(acts, theirs[r])) if a != b), min(len(acts), len(theirs[r])))
            problems.append(
                f"rank {r}: WAIT_SEND placement differs at field {k}: hetmesh {acts[k:k + 3]} vs "
                f"_add_wait_send {theirs[r][k:k + 3]}"
            )
    return problems


# ---- hetmesh's side -----------------------------------------------------------------------------------


def plan_args(name, pp, m, v):
    args = ["pipeline", "--schedule", name, "--pp", str(pp), "--microbatches", str(m)]
    if name in ("interleaved-1f1b", "interleaved-zero-bubble", "looped-bfs"):
        args += ["--virtual", str(v)]
    return args


def hetmesh_order(plan, name, pp, m, v):
    """(exit code, {rank: [text]} or stderr, stage_to_rank)."""
    p = subprocess.run([plan] + plan_args(name, pp, m, v), capture_output=True, text=True)
    if p.returncode != 0:
        return p.returncode, p.stderr.strip(), None
    doc = json.loads(p.stdout)
    return 0, {r: acts for r, acts in enumerate(doc["ranks"])}, doc["stage_to_rank"]


def check_lowered(S, plan, name, pp, m, v, order, stage_to_rank, tmp):
    """The problems (list of str) of hetmesh's lowered CSV under PyTorch's loader, simulator and runtime, and
    whether it equals PyTorch's own lowering exactly."""
    problems = []
    p = subprocess.run(
        [plan] + plan_args(name, pp, m, v) + ["--lowered", "--format", "csv"], capture_output=True, text=True
    )
    if p.returncode != 0:
        return [f"--lowered exit {p.returncode}: {p.stderr.strip()}"], False
    path = os.path.join(tmp, "lowered.csv")
    with open(path, "w", newline="") as f:
        f.write(p.stdout)
    num_stages = len(stage_to_rank)
    with open(path, newline="") as f:
        rows = [[a for a in row if a] for row in csv.reader(f)]
    # 1. PyTorch's loader: validates the compute actions, infers the stage map, checks the send waits.
    local = [s for s in range(num_stages) if stage_to_rank[s] == 0]
    try:
        rt = S._PipelineScheduleRuntime([Stage(s, num_stages, pp, 0) for s in local], m)
        rt._load_csv(path, format="compute_comms")
        loaded = {r: [str(a) for a in acts] for r, acts in rt.pipeline_order_with_comms.items()}
        if loaded != dict(enumerate(rows)):
            problems.append("_load_csv read a different schedule")
        if [rt.stage_index_to_group_rank[s] for s in range(num_stages)] != stage_to_rank:
            problems.append("_load_csv inferred a different stage-to-rank map")
    except Exception as e:  # noqa: BLE001 - any refusal of PyTorch's is the finding
        return [f"_load_csv: {type(e).__name__}: {str(e).splitlines()[0]}"], False
    # 2. PyTorch's simulator (it models compute, send/recv and send waits, not gradient reduction).
    try:
        keep = {
            r: [S._Action.from_str(a) for a in acts if "REDUCE_GRAD" not in a] for r, acts in enumerate(rows)
        }
        S._simulate_comms_compute(keep, lambda s: stage_to_rank[s], num_stages)
    except Exception as e:  # noqa: BLE001
        problems.append(f"_simulate_comms_compute: {type(e).__name__}: {str(e).splitlines()[0]}")
    # 3. PyTorch's runtime loop, each rank over recording stages: RECV before use, one wait per send.
    for r in range(pp):
        stages = [Stage(s, num_stages, pp, r) for s in range(num_stages) if stage_to_rank[s] == r]
        try:
            rt = S._PipelineScheduleRuntime(stages, m)
            rt._load_csv(path, format="compute_comms")
            run_steps(rt, m)
        except Exception as e:  # noqa: BLE001
            problems.append(f"runtime rank {r}: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        ran = sorted(a for st in stages for a in st.log if not a.endswith("REDUCE_GRAD"))
        if ran != sorted(order[r]):
            problems.append(f"runtime rank {r} ran other compute actions")
    # 4. The send waits where PyTorch's `_add_wait_send` places them, given hetmesh's other actions.
    problems += wait_placement_problems(S, rows)
    # 5. PyTorch's own lowering passes over the same compute order: identical, or identical but for the turn
    # PyTorch's WAIT_REDUCE_GRAD takes in `_add_send_recv` (a RECV may then land one action later).
    ours = {r: [a for a in acts if "WAIT_REDUCE_GRAD" not in a] for r, acts in enumerate(rows)}
    exact = True
    for turn in (True, False):
        theirs = pytorch_lowering(S, order, pp, stage_to_rank, num_stages, m, reduce_wait_turn=turn)
        theirs = {r: [a for a in acts if "WAIT_REDUCE_GRAD" not in a] for r, acts in theirs.items()}
        if ours == theirs:
            break
        exact = False
    else:
        problems.append("differs from PyTorch's lowering passes")
    return problems, exact


# ---- the grid -----------------------------------------------------------------------------------------

SCHEDULES = [
    ("gpipe", False),
    ("1f1b", False),
    ("interleaved-1f1b", True),
    ("looped-bfs", True),
    ("interleaved-zero-bubble", True),
    ("zero-bubble", False),
    ("zbv", False),
]


def documented_divergence(name, pp, m):
    return name == "1f1b" and m < pp


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default=os.path.join(root, "build/default/tools/hetmesh-plan/hetmesh-plan"))
    ap.add_argument("--max-pp", type=int, default=8)
    ap.add_argument("--max-mb", type=int, default=16)
    ap.add_argument("--max-virtual", type=int, default=4)
    ap.add_argument("--no-lowered", action="store_true", help="skip the lowered-CSV checks")
    ap.add_argument("--schedules", default=",".join(n for n, _ in SCHEDULES), help="comma-separated names")
    ap.add_argument("--verbose", action="store_true")
    opts = ap.parse_args()

    torch, S = load_torch()
    if S is None:
        print("skipped: torch not installed")
        return 0
    if not os.access(opts.plan, os.X_OK):
        print(f"error: {opts.plan} is not an executable hetmesh-plan; build it or pass --plan", file=sys.stderr)
        return 1

    failures = []
    totals = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, takes_virtual in SCHEDULES:
            if name not in opts.schedules.split(","):
                continue
            t = totals.setdefault(
                name,
                {"configs": 0, "identical": 0, "refused_by_both": 0, "documented": 0, "lowered_ok": 0, "lowered": 0, "lowered_exact": 0},
            )
            for pp in range(1, opts.max_pp + 1):
                for m in range(1, opts.max_mb + 1):
                    for v in range(1, opts.max_virtual + 1) if takes_virtual else [2 if name == "zbv" else 1]:
                        t["configs"] += 1
                        what = f"{name} pp={pp} m={m} v={v}"
                        theirs = pytorch_order(S, name, pp, m, v)
                        code, ours, stage_to_rank = hetmesh_order(opts.plan, name, pp, m, v)
                        if isinstance(theirs, str):
                            if code == 2:
                                t["refused_by_both"] += 1
                            elif code == 0 and documented_divergence(name, pp, m):
                                t["documented"] += 1
                                # PyTorch's runtime still runs hetmesh's lowering of it.
                                if not opts.no_lowered:
                                    t["lowered"] += 1
                                    problems, exact = check_lowered(
                                        S, opts.plan, name, pp, m, v, ours, stage_to_rank, tmp
                                    )
                                    if problems:
                                        failures.append(f"{what} --lowered: " + "; ".join(problems))
                                    else:
                                        t["lowered_ok"] += 1
                                        t["lowered_exact"] += exact
                            else:
                                failures.append(f"{what}: PyTorch refuses ({theirs}), hetmesh-plan exit {code}")
                            continue
                        if code != 0:
                            failures.append(f"{what}: PyTorch accepts, hetmesh-plan exit {code}: {ours}")
                            continue
                        if ours != theirs:
                            first = next(r for r in theirs if theirs[r] != ours.get(r))
                            failures.append(
                                f"{what}: rank {first} differs\n  pytorch: {' '.join(theirs[first])}\n"
                                f"  hetmesh: {' '.join(ours.get(first, []))}"
                            )
                            continue
                        t["identical"] += 1
                        if opts.no_lowered:
                            continue
                        t["lowered"] += 1
                        problems, exact = check_lowered(S, opts.plan, name, pp, m, v, theirs, stage_to_rank, tmp)
                        if problems:
                            failures.append(f"{what} --lowered: " + "; ".join(problems))
                        else:
                            t["lowered_ok"] += 1
                            t["lowered_exact"] += exact
                        if opts.verbose:
                            print(what, "ok", flush=True)

    print(f"hetmesh-plan pipeline vs torch {torch.__version__} torch.distributed.pipelining")
    print(
        f"grid: pp 1..{opts.max_pp}, micro-batches 1..{opts.max_mb}, stages per rank 1..{opts.max_virtual} "
        "(interleaved-1f1b, looped-bfs, interleaved-zero-bubble)"
    )
    cols = [("configs", "configs"), ("identical", "identical"), ("refused_by_both", "refused by both"),
            ("documented", "1F1B M<pp (ours only)")]
    if not opts.no_lowered:
        cols += [("lowered", "lowered CSVs"), ("lowered_ok", "run by PyTorch"), ("lowered_exact", "= PyTorch's lowering")]
    rows = list(totals.items())
    rows.append(("all", {k: sum(t[k] for t in totals.values()) for k, _ in cols}))
    print("| schedule | " + " | ".join(title for _, title in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, t in rows:
        print(f"| {name} | " + " | ".join(str(t[k]) for k, _ in cols) + " |")
    for f in failures[:40]:
        print("MISMATCH", f)
    if len(failures) > 40:
        print(f"... and {len(failures) - 40} more")
    print("result:", "identical" if not failures else f"{len(failures)} mismatches")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

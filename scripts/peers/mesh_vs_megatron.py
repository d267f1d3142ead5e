#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""hetmesh-plan mesh --moe against megatron-core's parallel_state, shape by shape.

For every shape up to --max-world ranks (tp, cp, pp, etp, ep; orders tp-cp-ep-dp-pp and tp-cp-ep-pp-dp)
with tp*cp*pp and etp*ep dividing the world, both sides decide:
  * whether the shape is accepted: megatron-core's own initialize_model_parallel runs on a fake
    process group (torch's "fake" backend) with its create_group replaced, and either refuses the
    shape (RuntimeError / AssertionError) or reaches its first group; hetmesh must refuse the same
    shapes, for the same reason;
  * the groups: for every family hetmesh prints, Megatron's RankGenerator.get_ranks(token) on the
    decoder or expert generator (built with the sizes initialize_model_parallel builds it with) must
    give the same groups in the same order;
  * for a seeded sample of accepted shapes (all of them up to --full-max-world ranks), every group
    initialize_model_parallel creates, by its group_desc, must equal hetmesh's family of that name,
    and hetmesh must print no family Megatron does not create.
Exit 0 when all agree (and, without megatron-core, with a line saying the check was skipped); 1 on
the first disagreements (up to 10 are printed). --write-golden writes the vendored golden file that
the C++ tests read (tests/mesh/data/megatron_moe_groups.json).
"""

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")

# Megatron's refusals, by the start of its message, and the words hetmesh's reason must contain.
REASONS = (
    ("is not divisible by expert_tensor_model_pipeline_parallel", "expert_tensor_model_pipeline_parallel"),
    ("world_size (", "is not divisible by tp*pp*cp"),
    ("When not using pp-last rank ordering", "when not using pp-last rank ordering"),
    ("Pipeline parallel groups are expected to be the same", "pipeline parallel groups are expected"),
    ("but you haven't", "does not list it"),
)

# Shapes of the golden file: cp > 1, both orders, default etp, non-powers of two, and each refusal.
GOLDEN = (
    dict(world=16, tp=2, cp=2, pp=2, ep=4, etp=1, order=ORDERS[0]),
    dict(world=16, tp=2, cp=2, pp=2, ep=4, etp=1, order=ORDERS[1]),
    dict(world=16, tp=2, cp=1, pp=2, ep=2, etp=1, order=ORDERS[1]),
    dict(world=16, tp=2, cp=2, pp=1, ep=4, etp=None, order=ORDERS[0]),
    dict(world=12, tp=2, cp=3, pp=1, ep=3, etp=2, order=ORDERS[0]),
    dict(world=12, tp=1, cp=2, pp=3, ep=2, etp=1, order=ORDERS[1]),
    dict(world=8, tp=1, cp=1, pp=1, ep=8, etp=1, order=ORDERS[0]),
    dict(world=8, tp=2, cp=2, pp=2, ep=2, etp=1, order=ORDERS[0]),
    dict(world=16, tp=4, cp=1, pp=2, ep=2, etp=1, order=ORDERS[1]),
    dict(world=12, tp=2, cp=1, pp=2, ep=2, etp=2, order=ORDERS[0]),
    dict(world=10, tp=4, cp=1, pp=1, ep=1, etp=1, order=ORDERS[0]),
)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def orders_for(world, all_orders_max_world):
    """Megatron's two orders; for small worlds also every other order of the five dims and the legacy
    orders that leave dims out (Megatron appends them with size 1)."""
    if world > all_orders_max_world:
        return ORDERS
    rest = ["-".join(p) for p in itertools.permutations(("tp", "cp", "ep", "dp", "pp")) if "-".join(p) not in ORDERS]
    return ORDERS + tuple(rest) + ("tp-dp-pp", "tp-pp-dp")


def shapes(max_world, refusals_max_world, all_orders_max_world):
    """Both orders of: every shape with tp*cp*pp | world and etp*ep*pp | world (a superset of those
    Megatron accepts); up to refusals_max_world ranks also those with etp*ep | world but not etp*ep*pp,
    and those with tp, cp, pp dividing the world but not their product (refused by divisibility)."""
    for world in range(1, max_world + 1):
        small = world <= refusals_max_world
        for tp in divisors(world):
            for cp in divisors(world):
                for pp in divisors(world):
                    decoder_fits = world % (tp * cp * pp) == 0
                    if not decoder_fits and not small:
                        continue
                    for etp in divisors(world) if decoder_fits else [1]:
                        for ep in divisors(world // etp) if decoder_fits else [1]:
                            if world % (etp * ep * pp) != 0 and not small:
                                continue
                            for order in orders_for(world, all_orders_max_world):
                                yield dict(world=world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, order=order)


class Stop(Exception):
    """Raised from the replaced create_group to stop initialize_model_parallel once it has accepted."""


class Megatron:
    """megatron-core's initialize_model_parallel on a fake process group, recording the groups it makes."""

    def __init__(self):
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        import megatron.core.parallel_state as ps

        self.dist, self.store, self.ps = dist, FakeStore, ps
        self.world = None
        self.record = None
        ps.create_group = self._create_group
        # RankGenerator.get_ranks is a pure function of the generator's sizes, order and token: memoised,
        # the same Megatron code runs once per distinct generator instead of once per shape.
        original, cache = ps.RankGenerator.get_ranks, {}

        def get_ranks(gen, token):
            key = (tuple(gen.ordered_size), gen.order, gen.rank_offset, token)
            if key not in cache:
                cache[key] = original(gen, token)
            return [list(g) for g in cache[key]]

        ps.RankGenerator.get_ranks = get_ranks

    def _create_group(self, ranks=None, *args, group_desc=None, **kwargs):
        if self.record is None:
            raise Stop()
        self.record.append((group_desc, list(ranks)))
        return object()

    def run(self, s, full):
        """('refused', message) or ('accepted', {group_desc: groups} when full, else None)."""
        if self.world != s["world"]:
            if self.dist.is_initialized():
                self.dist.destroy_process_group()
            self.dist.init_process_group(backend="fake", rank=0, world_size=s["world"], store=self.store())
            self.world = s["world"]
        self.ps.destroy_model_parallel()
        self.record = [] if full else None
        try:
            self.ps.initialize_model_parallel(
                tensor_model_parallel_size=s["tp"],
                pipeline_model_parallel_size=s["pp"],
                context_parallel_size=s["cp"],
                expert_model_parallel_size=s["ep"],
                expert_tensor_parallel_size=s["etp"],
                order=s["order"],
            )
        except Stop:
            return "accepted", None
        except (RuntimeError, AssertionError) as e:
            return "refused", str(e)
        groups = {}
        for desc, ranks in self.record:
            groups.setdefault(desc, []).append(ranks)
        for desc in [d for d in groups if d.endswith("_GLOO")]:
            if groups[desc] != groups.get(desc[: -len("_GLOO")]):
                raise SystemExit(f"unexpected: Megatron's {desc} differs from its non-gloo twin for {s}")
            del groups[desc]
        return "accepted", groups


def generator_ranks(kind, world, tp, cp, pp, ep, etp, order, token):
    """RankGenerator.get_ranks(token), with the sizes initialize_model_parallel gives each generator."""
    from megatron.core.parallel_state import RankGenerator

    if kind == "decoder":
        gen = RankGenerator(tp=tp, ep=1, dp=world // (tp * cp * pp), pp=pp, cp=cp, order=order, rank_offset=0)
    else:
        gen = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order, rank_offset=0)
    return gen.get_ranks(token)


EXPECTED = {}
EXPECTED_TEXT = {}


def expected_family(s, fam):
    """Megatron's groups for one family hetmesh prints, from its RankGenerators (memoised: a family of
    the decoder depends on the decoder's sizes only, one of the expert on the expert's)."""
    from megatron.core.parallel_state import default_embedding_ranks, default_position_embedding_ranks

    if fam["generator"] == "decoder":
        key = (fam["name"], fam["token"], s["world"], s["tp"], s["cp"], s["pp"], s["order"])
    else:
        key = (fam["name"], fam["token"], s["world"], s["pp"], s["ep"], s["etp"] or s["tp"], s["order"])
    if key in EXPECTED:
        return EXPECTED[key]
    ranks = generator_ranks(fam["generator"], s["world"], s["tp"], s["cp"], s["pp"], s["ep"], s["etp"] or s["tp"],
                            s["order"], fam["token"])
    if fam["name"] == "EMBEDDING_GROUP":
        ranks = [default_embedding_ranks(g) for g in ranks]
    elif fam["name"] == "POSITION_EMBEDDING_GROUP":
        ranks = [default_position_embedding_ranks(g) for g in ranks]
    elif fam["name"] == "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP":
        ranks = [[r for g in ranks for r in g]]  # one optimizer instance: every tp-ep-pp group
    EXPECTED[key] = ranks
    EXPECTED_TEXT[key] = json.dumps(ranks, separators=(",", ":"))
    return ranks


def expected_text(s, fam):
    """expected_family as the compact JSON text hetmesh-plan prints."""
    if fam["generator"] == "decoder":
        key = (fam["name"], fam["token"], s["world"], s["tp"], s["cp"], s["pp"], s["order"])
    else:
        key = (fam["name"], fam["token"], s["world"], s["pp"], s["ep"], s["etp"] or s["tp"], s["order"])
    if key not in EXPECTED_TEXT:
        expected_family(s, fam)
    return EXPECTED_TEXT[key]


def plan(exe, batch):
    """hetmesh-plan mesh --moe --shapes over `batch`; one JSON line per shape, unparsed."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for s in batch:
            f.write(json.dumps({k: v for k, v in s.items() if v is not None}) + "\n")
        path = f.name
    try:
        out = subprocess.run([exe, "mesh", "--moe", "--shapes", path], check=True, capture_output=True, text=True)
    finally:
        os.unlink(path)
    lines = out.stdout.splitlines()
    if len(lines) != len(batch):
        raise SystemExit(f"hetmesh-plan printed {len(lines)} lines for {len(batch)} shapes")
    return lines


def families_text(line):
    """The families of one compact JSON line as (name, generator, token, groups as JSON text): reading
    the text instead of parsing it keeps 200,000 shapes of up to 128 ranks within minutes."""
    out = []
    for part in line.split(',"families":[', 1)[1].split('{"name":"')[1:]:
        name, rest = part.split('","generator":"', 1)
        generator, rest = rest.split('","token":"', 1)
        token, rest = rest.split('","dims":"', 1)
        groups = rest.split('","groups":', 1)[1]
        out.append((name, generator, token, groups[: groups.rindex("]]") + 2]))
    return out


def reason_matches(megatron_msg, ours):
    for theirs, words in REASONS:
        if megatron_msg.startswith(theirs) or theirs in megatron_msg[:200]:
            return words in ours
    return False


def write_golden(meg, path):
    cases = []
    for s in GOLDEN:
        verdict, groups = meg.run(s, full=True)
        case = {"shape": {k: v for k, v in s.items() if v is not None}}
        if verdict == "refused":
            case["refused"] = next(words for theirs, words in REASONS if theirs in groups[:200])
            case["megatron_message"] = groups[:160]
        else:
            case["groups"] = groups
        cases.append(case)
    import megatron.core

    doc = {
        "origin": "megatron-core %s, megatron.core.parallel_state.initialize_model_parallel on torch's fake "
        "process group, every create_group call recorded (gloo twins dropped); written by "
        "scripts/peers/mesh_vs_megatron.py --write-golden" % megatron.core.__version__,
        "licence": "group lists are facts computed by megatron-core (Apache-2.0); no Megatron code is included",
        "cases": cases,
    }
    with open(path, "w") as f:
        f.write("{\n")
        f.write('  "origin": %s,\n  "licence": %s,\n  "cases": [\n' % (json.dumps(doc["origin"]), json.dumps(doc["licence"])))
        f.write(",\n".join("    " + json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n  ]\n}\n")
    print(f"wrote {path}: {len(cases)} shapes")


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default=os.path.join(root, "build/default/tools/hetmesh-plan/hetmesh-plan"))
    ap.add_argument("--max-world", type=int, default=128)
    ap.add_argument("--full-max-world", type=int, default=16, help="every group of every accepted shape up to here")
    ap.add_argument("--all-orders-max-world", type=int, default=6, help="every order of the five dims up to here")
    ap.add_argument("--refusals-max-world", type=int, default=32, help="also shapes refused by divisibility up to here")
    ap.add_argument("--full-sample", type=int, default=300, help="and of this many larger accepted shapes")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--write-golden", metavar="PATH")
    args = ap.parse_args()

    warnings.filterwarnings("ignore")
    try:
        import megatron.core  # noqa: F401
        import megatron.core.parallel_state  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except Exception as e:  # ImportError, or a dependency of megatron-core that is missing
        print(f"mesh_vs_megatron: skipped: megatron-core is not importable ({type(e).__name__}: {e})")
        return 0
    import megatron.core

    meg = Megatron()
    if args.write_golden:
        write_golden(meg, args.write_golden)
        return 0
    if not os.access(args.plan, os.X_OK):
        print(f"mesh_vs_megatron: {args.plan} is not built; build the hetmesh-plan target first")
        return 1

    rng = random.Random(args.seed)
    t0 = time.time()
    counts = dict(shapes=0, accepted=0, refused=0, families=0, full=0, worlds=0)
    refused_by = {}
    errors = []

    def fail(msg):
        errors.append(msg)
        if len(errors) <= 10:
            print("MISMATCH:", msg)

    batch = []
    all_shapes = list(shapes(args.max_world, args.refusals_max_world, args.all_orders_max_world))
    large_accepted_slots = set(rng.sample(range(len(all_shapes)), min(len(all_shapes), args.full_sample * 4)))
    full_left = args.full_sample

    def flush():
        nonlocal full_left
        if not batch:
            return
        lines = plan(args.plan, [s for s, _ in batch])
        for (s, slot), line in zip(batch, lines):
            counts["shapes"] += 1
            full = s["world"] <= args.full_max_world or (slot in large_accepted_slots and full_left > 0)
            verdict, detail = meg.run(s, full=full)
            refused = line.startswith('{"shape"')
            if verdict == "refused":
                counts["refused"] += 1
                kind = next((w for t, w in REASONS if t in detail[:200]), "other")
                refused_by[kind] = refused_by.get(kind, 0) + 1
                if not refused:
                    fail(f"{s}: Megatron refuses ({detail[:120]}), hetmesh accepts")
                elif not reason_matches(detail, json.loads(line)["refused"]):
                    fail(f"{s}: reasons differ: Megatron '{detail[:120]}', hetmesh '{json.loads(line)['refused']}'")
                continue
            counts["accepted"] += 1
            if refused:
                fail(f"{s}: Megatron accepts, hetmesh refuses: {json.loads(line)['refused']}")
                continue
            for name, generator, token, groups in families_text(line):
                counts["families"] += 1
                if groups != expected_text(s, {"name": name, "generator": generator, "token": token}):
                    fail(f"{s}: {name} ({generator} {token}) differs from RankGenerator")
            if detail is not None:
                counts["full"] += 1
                if s["world"] > args.full_max_world:
                    full_left -= 1
                mine = {f["name"]: f["groups"] for f in json.loads(line)["families"]}
                if set(mine) != set(detail):
                    fail(f"{s}: families differ: only hetmesh {sorted(set(mine) - set(detail))}, "
                         f"only Megatron {sorted(set(detail) - set(mine))}")
                for name, groups in detail.items():
                    if mine.get(name) != groups:
                        fail(f"{s}: {name} differs from initialize_model_parallel")
        batch.clear()

    world = 0
    for slot, s in enumerate(all_shapes):
        if s["world"] != world or len(batch) >= 2000:
            flush()
            counts["worlds"] += s["world"] != world
            world = s["world"]
        batch.append((s, slot))
    flush()

    secs = time.time() - t0
    print(f"mesh_vs_megatron: megatron-core {megatron.core.__version__}, worlds 1..{args.max_world}, orders "
          f"{', '.join(ORDERS)} (every order up to {args.all_orders_max_world} ranks): {counts['shapes']} shapes, {counts['accepted']} accepted by Megatron "
          f"({counts['families']} group families compared with RankGenerator.get_ranks; {counts['full']} shapes "
          f"compared group by group with initialize_model_parallel), {counts['refused']} refused "
          f"({', '.join(f'{k}: {v}' for k, v in sorted(refused_by.items()))}); {len(errors)} mismatches; "
          f"{secs:.0f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

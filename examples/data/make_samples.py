#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerates the demo workloads in this folder from ../../tests/data/workloads (see README.md).

Deterministic: Python's random.Random(seed) with integer-only draws (randrange, sample), whose
sequences are stable across CPython 3 releases. Run from anywhere:
    python3 examples/data/make_samples.py [WORKLOADS_DIR]   (default: tests/data/workloads)
"""
import json
import os
import random
import sys

SEED = 20250228  # ByteScale v1's arXiv date; any fixed value would do


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "data", "workloads")
    with open(os.path.join(src, "prolong_doc_lengths.txt")) as f:
        lengths = [int(line) for line in f if line.strip()]

    # 2,000 document lengths drawn without replacement, kept in draw order.
    rng = random.Random(SEED)
    picks = rng.sample(range(len(lengths)), 2000)
    with open(os.path.join(here, "prolong_sample.txt"), "w") as f:
        for i in picks:
            f.write(f"{lengths[i]}\n")

    # 256 multimodal samples: text from the same ProLong lengths (capped at 32K, as a multimodal SFT
    # mix would be), images from LLaVA-1.5 (576 tokens) or Qwen2-VL ((H/28)*(W/28) LLM tokens at sides
    # that are multiples of 28), audio from a Whisper-style encoder (25 LLM tokens per second).
    rng = random.Random(SEED + 1)
    with open(os.path.join(here, "multimodal_sample.jsonl"), "w") as f:
        for k in range(256):
            text = min(lengths[rng.randrange(len(lengths))], 32768)
            sample = {"id": f"mm-{k:04d}", "text": text}
            roll = rng.randrange(10)
            if roll < 6:  # 60% carry images
                images = []
                for _ in range(1 + rng.randrange(4)):
                    if rng.randrange(2) == 0:
                        images.append(576)
                    else:
                        h = 28 * (8 + rng.randrange(41))  # 224 .. 1344 px
                        w = 28 * (8 + rng.randrange(41))
                        images.append((h // 28) * (w // 28))
                sample["images"] = images
            if roll >= 8:  # 20% carry audio clips of 5 .. 30 s
                sample["audio"] = [25 * (5 + rng.randrange(26)) for _ in range(1 + rng.randrange(2))]
            f.write(json.dumps(sample, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()

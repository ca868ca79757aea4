#!/usr/bin/env python
"""Writes the tiny random Qwen3-MoE model (2 layers of 8 experts, 2 per token, the tiny
tokenizer; agentrl/models/tiny.py's TINY_MOE_CONFIG) into a folder and prints its path.

    .venv/bin/python scripts/make-tiny-moe.py --out /tmp/tiny-moe
    python train.py --env calc --hf-checkpoint /tmp/tiny-moe ...

Without --out it prints the cached copy's path (~/.cache/agentrl/tiny-qwen3-moe-v1, built on
first use). Its weights are seeded noise: it exists to run every MoE code path in seconds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from agentrl.models import build_tiny_moe_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder to write (must not exist)")
    args = parser.parse_args()
    built = build_tiny_moe_model()
    if args.out is None:
        print(built)
        return 0
    if args.out.exists():
        print(f"make-tiny-moe: --out {args.out} exists; give a new folder", file=sys.stderr)
        return 2
    shutil.copytree(built, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

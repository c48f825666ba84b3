"""Sample generation throughput: kept samples per second, cold and warm.

Generates ``--num_samples`` samples twice in one process with
:func:`sphyr_jax.data.generate.generate_dataset` into throw-away folders: the cold
run pays for compilation, the warm run (another seed, same shapes) mostly
reuses it.  Optimiser settings: the defaults (the strong reference optimum) or
``--quick`` (:data:`sphyr_jax.data.generate.QUICK_OPTIONS`).  The device and the
figures are printed as JSON.

``--dataset_version v2`` times the SPhyR-v2 generator instead
(:func:`sphyr_jax.data.generate_v2.generate_v2_dataset`, ``--quick``:
:data:`sphyr_jax.data.generate_v2.QUICK_V2_OPTIONS`) and adds its solves and
rejections to the figures.

Usage::

    python benchmarks/generate.py [--num_samples 32] [--grid_size 10] [--quick]
        [--dataset_version v1|v2]

Other entry points can ``from benchmarks.generate import run``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(REPO))

import jax  # noqa: E402
from record import write_record  # noqa: E402  (benchmarks/, the script's folder)

import sphyr_jax  # noqa: E402
from sphyr_jax.data import generate, generate_v2  # noqa: E402


def _one(num_samples: int, seed: int, grid_size: int, options, num_devices,
         version: str = "v1") -> dict:
    make = generate.generate_dataset if version == "v1" else generate_v2.generate_v2_dataset
    with tempfile.TemporaryDirectory(prefix="sphyr_bench_generate_") as out:
        summary = make(out, num_samples, seed=seed, grid_size=grid_size,
                       num_devices=num_devices, options=options)
    keys = ("kept", "drawn", "solved", "unused", "batches", "rejected", "seconds",
            "samples_per_second", "seconds_per_solve")
    return {key: summary[key] for key in keys}


def run(num_samples: int = 32, grid_size: int = 10, quick: bool = False, seed: int = 0,
        num_devices: int | None = None, dataset_version: str = "v1") -> dict:
    """Time a cold and a warm generation of ``num_samples`` samples.

    Returns:
        ``{"device", "num_samples", "grid_size", "options", "cold", "warm"}``;
        ``cold``/``warm`` hold the generation summaries' counts and timings.
    """
    sphyr_jax.enable_x64()
    if dataset_version == "v1":
        options = generate.QUICK_OPTIONS if quick else generate.DEFAULT_OPTIONS
    else:
        options = generate_v2.QUICK_V2_OPTIONS if quick else generate_v2.DEFAULT_V2_OPTIONS
    device = jax.devices()[0]
    return {
        "device": f"{device.platform}:{device.device_kind} x{jax.device_count()}",
        "dataset_version": dataset_version,
        "num_samples": num_samples,
        "grid_size": grid_size,
        "options": "quick" if quick else "default",
        "cold": _one(num_samples, seed, grid_size, options, num_devices, dataset_version),
        "warm": _one(num_samples, seed + 1, grid_size, options, num_devices, dataset_version),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_samples", type=int, default=32)
    parser.add_argument("--grid_size", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="cheap optimiser settings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_devices", type=int, default=None)
    parser.add_argument("--dataset_version", choices=("v1", "v2"), default="v1")
    parser.add_argument("--json", default=None, help="also write the run's results file here")
    args = parser.parse_args(argv)
    result = run(args.num_samples, args.grid_size, args.quick, args.seed, args.num_devices,
                 args.dataset_version)
    print(json.dumps(result, indent=2))
    write_record(args.json, "generate", title="Generating samples", figures=result)


if __name__ == "__main__":
    main()

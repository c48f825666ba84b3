"""The wheel carries what the main job needs: built from the checkout and installed
into a fresh virtual environment, ``python -m sphyr_jax validate`` runs from any
folder, on the embedded sets the wheel carries.

Nothing is downloaded: the wheel is built with the setuptools of this
environment (``--no-build-isolation``) and installed without its dependencies,
which the fresh environment reads from this one's site-packages through a path
file (no ``.pth`` of this environment runs there, so an editable install of the
checkout cannot leak in).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile

from conftest import REPO, child_env

from sphyr_jax.data import EMBEDDED_SETS, list_subjects


def _build_wheel(tmp_path) -> str:
    """A wheel of a copy of the checkout (the build leaves nothing in the checkout)."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    shutil.copytree(REPO / "sphyr_jax", source / "sphyr_jax", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    out = tmp_path / "wheel"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--no-index", "-q", "-w", str(out),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("sphyr_jax-*.whl")
    return str(wheel)


def test_a_wheel_in_a_fresh_environment_runs_validate_from_any_folder(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in EMBEDDED_SETS:  # every embedded set, all 16 subjects
        suffix = "_3d" if name.endswith("_3d") else ""
        for subject in list_subjects(3 if suffix else 2):
            assert f"sphyr_jax/data/sets/{name}/{subject}.jsonl" in names, (name, subject)
    assert not any("/raw/" in n or n.endswith(".csv") for n in names)  # sources stay home
    assert os.path.getsize(wheel) < 3_000_000

    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--no-deps", "--no-index", "-q", wheel],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "_dependencies.pth"), "w") as handle:  # numpy, jax, ...
        handle.write(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = child_env()
    env.pop("PYTHONPATH")  # only the installed wheel
    where = subprocess.run([str(python), "-c", "import sphyr_jax; print(sphyr_jax.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(site), where.stdout + where.stderr
    done = subprocess.run([str(python), "-m", "sphyr_jax", "validate", "--samples=2",
                           "--noprogress"], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"samples from {site}" in done.stdout  # the set inside the installed package
    assert "Reference optimiser beaten by the dataset answer on 0/2 samples." in done.stdout
    assert done.stderr == ""

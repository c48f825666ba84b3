"""The README as a newcomer meets it: short, its examples run as pasted, its Quick start
says what it does, its commands (and the documentation's) leave the checkout clean.

Every Python block runs in a fresh process from the repository root, written to
a file on its own, as a reader pastes it (no block sees another's names).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import IN_CI, REPO, child_env

README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = [p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").rglob("*.md"))]
MAX_LINES = 200  # a pitch, the Quick start, one example, the figures, links, a citation

# Packages of the optional extras ([env]): blocks that import them run where the
# extra is installed (always under CI, whose install has every extra).
EXTRA_PACKAGES = ("openenv",)


def _python_blocks() -> list[tuple[int, str]]:
    """(first line, code) of every ```python block of the README."""
    return [(README[: m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", README, re.S | re.M)]


BLOCKS = _python_blocks()


def test_the_readme_fits_on_two_screens_and_has_an_example():
    assert len(README.splitlines()) <= MAX_LINES
    assert len(BLOCKS) >= 1


def test_readme_examples_import_only_public_names():
    """No ``sphyr_jax._x`` or ``sphyr_jax.a._b`` import: examples show the public API."""
    for _, block in BLOCKS:
        for line in re.findall(r"^(?:from|import) (sphyr_jax[\w.]*)", block, re.M):
            assert not any(part.startswith("_") for part in line.split(".")), line


@pytest.mark.parametrize("line, block", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs_as_pasted(line, block, tmp_path):
    needs = [p for p in EXTRA_PACKAGES if re.search(rf"^(from|import) {p}\b", block, re.M)]
    missing = [p for p in needs if importlib.util.find_spec(p) is None]
    if missing and not IN_CI:
        pytest.skip(f"the README block needs an extra that is not installed: {missing}")
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(block, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"README line {line}:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    if "print(" in block:
        assert done.stdout.strip(), f"README line {line} printed nothing"
    # A block whose last print states its output in a comment ("# 0.979 True") prints it.
    claimed = re.search(r"^print\(.*\)\s*#\s*([0-9.]+) (True|False)\b", block, re.M)
    if claimed:
        score, carrying = done.stdout.split()[-2:]
        assert (f"{float(score):.3f}", carrying) == claimed.groups(), done.stdout


def test_the_first_example_states_its_output():
    assert re.search(r"^print\(metrics.*#\s*0\.\d{3} True", BLOCKS[0][1], re.M)


# --- the Quick start --------------------------------------------------------------------------

def _quick_start() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```bash\n(.*?)^```$", section, re.S | re.M).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


PROGRESS_LINE = re.compile(r"^[\w -]+: \d+/\d+ in \d+\.\d s \([^)]*\)$")


def test_quick_start_main_job_prints_its_table_and_nothing_on_stderr():
    """The Quick start's first command, as written, off a terminal: the validate table on
    stdout and not one line on stderr (no JAX backend probes, no warnings, no progress: the
    app draws progress on a terminal, and elsewhere only when --progress asks for it).
    With --progress, one line per stage and nothing else."""
    first = _quick_start()[0]
    job = first.split("&&")[-1].split()
    assert job[:3] == ["python", "-m", "sphyr_jax"]
    done = subprocess.run([sys.executable, *job[1:]], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Reference optimiser beaten by the dataset answer on 0/20 samples." in done.stdout
    assert done.stderr == "", done.stderr
    asked = subprocess.run([sys.executable, *job[1:], "--progress", "--samples=2"],
                           cwd=REPO, env=child_env(), capture_output=True, text=True,
                           timeout=600)
    assert asked.returncode == 0, asked.stderr
    lines = asked.stderr.splitlines()
    assert lines and all(PROGRESS_LINE.match(line) for line in lines), asked.stderr
    stages = [line.split(":")[0] for line in lines]
    assert len(stages) == len(set(stages)), "a stage was reported twice"
    assert {"analysis", "optima"} <= set(stages)


def test_quick_start_says_what_the_shared_data_are_and_the_measured_time():
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert len(_quick_start()) == 2
    assert "`../shared`" in section and "skipped" in section and "CI=true" in section
    assert re.search(r"\d+ min \d+ s", section), "the stated time is a measured one"


# --- the test command explains itself ---------------------------------------------------------

def test_skips_are_summarised_in_one_line_per_reason(tmp_path):
    """A run of the project's pytest options over tests that skip for a missing file prints
    no line per skipped test, and one line counting the skips by reason."""
    addopts = re.search(r'^addopts = "([^"]*)"', (REPO / "pyproject.toml").read_text(), re.M)
    report_chars = [o for o in addopts.group(1).split() if o.startswith("-r")]
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("project_conftest",
                                                      {str(REPO / "tests" / "conftest.py")!r})
        project = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(project)
        pytest_terminal_summary = project.pytest_terminal_summary
    """))
    (tmp_path / "test_demo.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("name", ["a", "b", "c"])
        def test_shared(name):
            pytest.skip(f"reference data not available: /nowhere/shared/{name}.json")

        def test_extra():
            pytest.skip("needs the [env] extra")

        def test_runs():
            assert True
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *report_chars, "-c", str(tmp_path / "pytest.ini"),
                           str(tmp_path)], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not re.search(r"^SKIPPED", done.stdout, re.M), done.stdout
    summary = [line for line in done.stdout.splitlines() if line.startswith("4 skipped:")]
    assert summary == ["4 skipped: 3 reference data not available; 1 needs the [env] extra "
                       "(the parity data of ../shared: see the README's Quick start)"], done.stdout


# --- a clean checkout stays clean -------------------------------------------------------------

FOLDER_FLAGS = ("results_root", "output_dir", "cache_dir", "workdir", "optimum_cache_dir")
FILE_FLAGS = ("output", "output_json")


def _written_paths() -> set[str]:
    """Paths the commands of the README and the documentation write under the checkout
    (placeholders left out); folders end in ``/``."""
    found = set()
    text = "\n".join([README, *DOCS])
    for flag in FOLDER_FLAGS + FILE_FLAGS:
        for value in re.findall(rf"--{flag}=([^\s`\\)\]]+)", text):
            if "..." in value or value.startswith(("<", "../", "/", "data/")) or \
                    re.fullmatch(r"[A-Z_]+(\.\w+)?", value):
                continue
            found.add(value + "/" if flag in FOLDER_FLAGS else value)
    found |= {f"{v}/" for v in re.findall(r'cache_dir="([^"]+)"', text)}
    found.add("plot.png")  # plot's default --output
    return found


def test_readme_outputs_are_ignored_by_git():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = sorted(_written_paths())
    assert {"results/", "paper/", ".sphyr_cache/optima/", "runs/smoke/", "rec.png"} <= set(paths)
    done = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching",
                           *paths], cwd=REPO, capture_output=True, text=True)
    unignored = [line.split("\t")[-1] for line in done.stdout.splitlines()
                 if line.startswith("::")]
    assert not unignored, f"README outputs git would show as untracked: {unignored}"


# --- float64 at the entry points ---------------------------------------------------------------

_ENTRY_SCRIPT = textwrap.dedent("""
    import importlib.util, json, tempfile
    import jax
    import sphyr_jax
    from sphyr_jax import training
    from sphyr_jax.data import embedded
    from sphyr_jax.evaluation.harness import evaluate
    from sphyr_jax.rl import TopologyEnvironment, TopologyReward, run_feedback_experiment

    seen = {"after import": bool(jax.config.jax_enable_x64)}

    def check(name, call):
        jax.config.update("jax_enable_x64", False)
        try:
            call()
        except Exception as exc:
            seen[name + " raised"] = f"{type(exc).__name__}: {exc}"
        seen[name] = bool(jax.config.jax_enable_x64)

    check("TopologyReward", TopologyReward)
    check("TopologyEnvironment", lambda: TopologyEnvironment(embedded("dataset")))
    check("run_feedback_experiment", lambda: run_feedback_experiment(lambda p: "", [], rounds=0))
    with tempfile.TemporaryDirectory() as root:
        # a model spec it refuses: float64 is on before that first check
        check("evaluate", lambda: evaluate("baseline:nope", results_root=root,
                                           dataset=embedded("dataset")))
        seen.pop("evaluate raised")
        check("evaluate_model", lambda: training.evaluate_model(None, [], root))
    if importlib.util.find_spec("openenv") is not None:
        from sphyr_jax.rl.server import create_app
        check("create_app", lambda: create_app(embedded("dataset")))
    print(json.dumps(seen))
""")


def test_entry_points_turn_float64_on_and_imports_do_not():
    """A program whose first call is an entry point needs no enable_x64 of its own (the
    README's RL examples have none); importing them changes nothing."""
    done = subprocess.run([sys.executable, "-c", _ENTRY_SCRIPT], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen.pop("after import") is False
    assert not [k for k in seen if k.endswith("raised")], seen
    assert seen and all(seen.values()), seen

"""The README's and docs/' code blocks, checked: ```python and ```bash run blocks run (in a scratch folder, in
order, each file's Python blocks sharing one namespace); ```bash blocks, too long to run here, must name only
recipes, files, modules and train.py flags that exist; ```python no-run blocks (the Hub's network calls) must
compile and import what exists. A block with any other tag (``text``) is sample output; an untagged block fails."""

import ast
import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mktestdocs import grab_code_blocks

import train

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAGS = {"--config", *("--" + f.name.replace("_", "-") for f in dataclasses.fields(train.Config))}


def blocks(path: Path, tag: str) -> list[str]:
    return grab_code_blocks(path.read_text(encoding="utf-8"), lang=tag)


def missing_names(block: str, root: Path = ROOT) -> list[str]:
    """What a shell block names that does not exist: files under configs/, benchmarks/, iris_timm/ or docs/ and
    train.py, `python -m` modules, and train.py's flags."""
    missing = []
    for path in re.findall(r"(?<![\w/.])((?:configs|benchmarks|iris_timm|docs|\.ci)/[\w./-]+\.(?:yaml|py|md))", block):
        if not (root / path).is_file():
            missing.append(path)
    for module in re.findall(r"python -m ([\w.]+)", block):
        if (
            module.split(".")[0] in ("benchmarks", "iris_timm")
            and not (root / (module.replace(".", "/") + ".py")).is_file()
        ):
            missing.append(module)
        elif importlib.util.find_spec(module.split(".")[0]) is None:
            missing.append(module)
    for command in re.split(r"\n(?!\s)|;|&&|\bdo\b", block.replace("\\\n", " ")):
        if "train.py" in command:
            flags = {w.split("=")[0] for w in shlex.split(command.split("train.py", 1)[1], comments=True)}
            missing += sorted(f for f in flags if f.startswith("--") and f not in FLAGS)
    return missing


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_code_block_is_checked(path):
    known = sum(len(blocks(path, tag)) for tag in ("python", "python no-run", "bash", "bash run", "text"))
    assert known == len(blocks(path, None)), f"{path.name} has a code block with an unchecked tag"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_long_commands_name_what_exists(path):
    for block in blocks(path, "bash"):
        assert not missing_names(block), f"{path.name}: {missing_names(block)} in\n{block}"
    for block in blocks(path, "python no-run"):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                assert importlib.util.find_spec(name.split(".")[0]), name


def test_the_check_fails_on_a_removed_recipe(tmp_path):
    recipes = (ROOT / "configs").glob("*.yaml")
    (tmp_path / "configs").mkdir()
    for recipe in recipes:
        if recipe.name != "cifar10_cpu_iris_local.yaml":
            (tmp_path / "configs" / recipe.name).write_text(recipe.read_text())
    block = "python train.py --config configs/cifar10_cpu_iris_local.yaml --seed 1 --no-such-flag 2"
    assert missing_names(block, tmp_path) == ["configs/cifar10_cpu_iris_local.yaml", "--no-such-flag"]
    assert missing_names("python -m benchmarks.no_such_study --out x") == ["benchmarks.no_such_study"]


@pytest.mark.parametrize(
    "path", [p for p in DOCS if blocks(p, "python") or blocks(p, "bash run")], ids=lambda p: p.name
)
def test_quick_blocks_run(path, tmp_path):
    (tmp_path / "output").mkdir()
    for name in ("train.py", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")
    for block in blocks(path, "bash run"):
        result = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{path.name}:\n{block}\n{result.stderr[-3000:]}"
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in blocks(path, "python"):
            exec(compile(block, str(path), "exec"), namespace)
    finally:
        os.chdir(cwd)

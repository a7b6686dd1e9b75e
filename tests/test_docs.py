"""The README's and docs/' code blocks, checked: ```python and ```bash run blocks run twice in a row (in a scratch
folder, in the order of their file, bash with the virtual environment active, each file's Python blocks in one
session), as a reader who pastes them twice would, and a Python expression whose comment starts with a value (``x.shape
# (1, 10): ...``) must have that value; ```bash blocks, too long to run here, must name only recipes,
files, modules and train.py flags that exist; ```python no-run blocks (the Hub's network calls) must compile and
import what exists. A block with any other tag (``text``) is sample output; an untagged block fails."""

import ast
import dataclasses
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import NamedTuple

import pytest

import train

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAGS = {"--config", *("--" + f.name.replace("_", "-") for f in dataclasses.fields(train.Config))}
TAGS = ("python", "python no-run", "bash", "bash run", "text")
RUNNABLE = ("python", "bash run")


class CodeBlock(NamedTuple):
    tag: str  # what follows the opening ```
    line: int  # the line of the opening ```, from 1
    code: str


def code_blocks(path: Path) -> list[CodeBlock]:
    """The fenced blocks of a Markdown file, in its order."""
    found, opening, lines = [], None, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```") and opening is None:
            opening, lines = (line.strip()[3:].strip(), number), []
        elif line.lstrip().startswith("```"):
            found.append(CodeBlock(*opening, textwrap.dedent("".join(lines))))
            opening = None
        elif opening is not None:
            lines.append(line + "\n")
    return found


def blocks(path: Path, tag: str) -> list[str]:
    return [block.code for block in code_blocks(path) if block.tag == tag]


def shell_commands(block: str) -> list[str]:
    """The commands of a shell block: a line, with the lines its trailing ``\\`` continues it on, split at ``;``,
    ``&&`` and ``do``. The body of a here-document is its command's input, not commands."""
    commands, heredoc_end = [], None
    for line in block.replace("\\\n", " ").splitlines():
        if heredoc_end is not None:  # inside a here-document, up to its closing word
            if line.strip() == heredoc_end:
                heredoc_end = None
            continue
        if heredoc := re.search(r"<<-?\s*(['\"]?)(\w+)\1", line):
            heredoc_end = heredoc.group(2)
        commands += re.split(r";|&&|\bdo\b", line)
    return commands


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
    for command in shell_commands(block):
        if "train.py" in command:
            flags = {w.split("=")[0] for w in shlex.split(command.split("train.py", 1)[1], comments=True)}
            missing += sorted(f for f in flags if f.startswith("--") and f not in FLAGS)
    return missing


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_code_block_is_checked(path):
    unchecked = [f"{path.name}:{block.line}" for block in code_blocks(path) if block.tag not in TAGS]
    assert not unchecked, f"code blocks with an unchecked tag (not one of {TAGS}): {unchecked}"


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


def test_only_a_trailing_backslash_continues_a_command():
    """An indented line is a command of its own, and a here-document (Python's loop here) holds no commands."""
    block = (
        "python - <<'PY'\n"
        "for seed in range(2):\n"
        '    subprocess.run(["python", "train.py", "--seed", str(seed)])\n'
        "PY\n"
        "for seed in 0 1; do\n"
        "    python train.py --seed $seed --no-such-flag 1\n"
        "    python -m benchmarks.study --runs x\n"
        "done\n"
        "python train.py --config configs/smoke.yaml \\\n"
        "    --no-such-flag 2\n"
    )
    assert missing_names(block) == ["--no-such-flag", "--no-such-flag"]


def activated_environment() -> dict[str, str]:
    """The environment of a shell after ``source .venv/bin/activate``: this virtual environment's commands (python,
    accelerate) first on the PATH; one thread, to share this machine with the rest of the suite."""
    bin_dir = Path(sys.executable).parent
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return dict(os.environ, VIRTUAL_ENV=str(bin_dir.parent), PATH=path, OMP_NUM_THREADS="1")


def shown_value(comment: str) -> object:
    """The value a comment starts with (``(1, 10): the logits`` shows ``(1, 10)``), or ``Ellipsis`` if none."""
    try:
        return ast.literal_eval(comment.split(": ")[0])
    except (ValueError, SyntaxError):
        return ...


def plain(value: object) -> object:
    """``value`` with torch.Size and tuples as tuples and lists as lists, to compare with a literal."""
    if isinstance(value, list):
        return [plain(item) for item in value]
    return tuple(plain(item) for item in value) if isinstance(value, tuple) else value


def exec_checking_values(code: str, where: str, namespace: dict) -> list[str]:
    """Run ``code`` a statement at a time in ``namespace``; an expression whose line's comment starts with a value
    must evaluate to it. Returns the comments so checked."""
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(code).readline)
        if token.type == tokenize.COMMENT
    }
    checked = []
    for node in ast.parse(code).body:
        shown = shown_value(comments.get(node.end_lineno, ""))
        if isinstance(node, ast.Expr) and shown is not ...:
            value = plain(eval(compile(ast.Expression(node.value), where, "eval"), namespace))
            assert value == shown, f"{where}:{node.lineno} is {value}, where its comment shows {shown}"
            checked.append(comments[node.end_lineno])
        else:
            exec(compile(ast.Module([node], type_ignores=[]), where, "exec"), namespace)
    return checked


def run_block(block: CodeBlock, folder: Path, namespace: dict, where: str) -> None:
    """Run a ```bash run block in a shell in ``folder``, a ```python block in the session ``namespace``."""
    if block.tag == "bash run":
        result = subprocess.run(
            ["bash", "-e", "-c", block.code],
            cwd=folder,
            env=activated_environment(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, f"{where} ended with exit status {result.returncode}:\n{result.stderr[-3000:]}"
        return
    try:
        exec_checking_values(block.code, where, namespace)
    except Exception as error:
        raise AssertionError(f"{where} raised {error!r}") from error


def paste_twice(path: Path, folder: Path) -> None:
    """Every ```python and ```bash run block of ``path`` in its order, then all of them again, in ``folder``."""
    namespace: dict = {}
    for paste in ("first", "second"):
        for block in code_blocks(path):
            if block.tag in RUNNABLE:
                run_block(block, folder, namespace, f"{path.name}:{block.line} (```{block.tag}, {paste} run)")


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "python") + blocks(p, "bash run")], ids=lambda p: p.name)
def test_runnable_blocks_run_twice_in_a_row(path, tmp_path, monkeypatch):
    (tmp_path / "output").mkdir()
    for name in ("train.py", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    paste_twice(path, tmp_path)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("```bash run\nmkdir made\n```", r"guide\.md:3 \(```bash run, second run\) ended with exit status 1:\n.*made"),
        (
            "```python\nimport os\nos.mkdir('made')\n```",
            r"guide\.md:3 \(```python, second run\) raised FileExistsError",
        ),
    ],
)
def test_a_block_that_cannot_run_twice_fails_naming_its_file_and_line(tmp_path, monkeypatch, block, message):
    (tmp_path / "guide.md").write_text(f"# Guide\n\n{block}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match=message):
        paste_twice(tmp_path / "guide.md", tmp_path)


def test_the_tests_the_docs_name_exist():
    tests = sorted((ROOT / "tests").glob("test_*.py"))
    defined = {name for path in tests for name in re.findall(r"^def (test_\w+)", path.read_text(), re.M)}
    for path in [*DOCS, ROOT / "CHANGELOG.md"]:
        named = set(re.findall(r"\b(test_\w+)", path.read_text())) - {path.stem for path in tests}
        assert named <= defined, f"{path.name} names tests that do not exist: {sorted(named - defined)}"


def test_the_readme_shows_the_layouts_forward_intermediates_returns():
    """NCHW intermediates and an NHWC final map, as timm's MambaOut: the README's comments show both, checked."""
    block = next(block for block in blocks(ROOT / "README.md", "python") if "forward_intermediates(" in block)
    checked = exec_checking_values(block, "README.md", {})
    assert any("NHWC" in comment for comment in checked) and any("NCHW" in comment for comment in checked), checked


def test_a_value_comment_that_is_wrong_fails_naming_its_line():
    code = "import torch\nx = torch.zeros(2, 3)\nx.shape  # (2, 3): right\nx.T.shape  # (2, 3): wrong\n"
    with pytest.raises(AssertionError, match=r"guide\.md:4 is \(3, 2\), where its comment shows \(2, 3\)"):
        exec_checking_values(code, "guide.md", {})


def test_train_py_shows_the_commands_the_readme_gives():
    """The usage lines of train.py's docstring (its --help) are commands of the README, flags and files that exist."""
    usage = [line.split("#")[0].strip() for line in train.__doc__.splitlines()]
    usage = [line for line in usage if line.startswith(("python train.py", "accelerate launch"))]
    readme = {command.strip() for block in blocks(ROOT / "README.md", "bash") for command in shell_commands(block)}
    readme = {command.split("#")[0].strip() for command in readme}
    assert usage and set(usage) <= readme, sorted(set(usage) - readme)
    assert not missing_names("\n".join(usage))

"""Run timm's own model tests (tests/test_models.py) on every registered iris model.

    .venv/bin/python .ci/timm_tests.py            # extra arguments go to pytest, e.g. -x or -k "iris and forward"

The tests come from the sdist of the installed timm version, so they match the code they test. Only the tests
are unpacked: the installed timm is the one under test. Two things make timm's suite see the iris models:
``-p iris_timm`` imports the package (which registers the models) before the tests are collected, and the
module that defines them is added to ``FEAT_INTER_FILTERS``, timm's list of modules whose models implement
``forward_intermediates`` and the ``features_only`` wrapper, so those tests cover them too.
"""

import re
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

import timm

import iris_timm  # noqa: F401  (registers the iris_* models)

FILTER_LIST = "FEAT_INTER_FILTERS = [\n"


def fetch_tests(timm_version: str, folder: Path) -> Path:
    """Download the timm sdist of ``timm_version`` and unpack its tests and pytest configuration into ``folder``."""
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet"]
    subprocess.run([*pip, f"timm=={timm_version}", "--dest", str(folder)], check=True)
    (sdist,) = folder.glob(f"timm-{timm_version}.tar.gz")
    root = f"timm-{timm_version}"
    with tarfile.open(sdist) as archive:
        wanted = [m for m in archive.getmembers() if m.name.startswith(f"{root}/tests/")]
        wanted.append(archive.getmember(f"{root}/pyproject.toml"))  # the test markers
        archive.extractall(folder, members=wanted, filter="data")
    return folder / root


def iris_modules() -> list[str]:
    """The names timm files the iris models under (its ``module=`` filter), e.g. ``pdessm``."""
    return sorted({timm.models.model_entrypoint(name).__module__.rsplit(".", 1)[-1] for name in iris_models()})


def iris_models() -> list[str]:
    return timm.list_models("iris_*")


def add_to_feature_tests(test_file: Path, modules: list[str]) -> None:
    text = test_file.read_text()
    if text.count(FILTER_LIST) != 1:
        raise SystemExit(f"{test_file} no longer defines {FILTER_LIST.strip()!r}: update .ci/timm_tests.py.")
    names = "".join(f"    {name!r},\n" for name in modules)
    test_file.write_text(text.replace(FILTER_LIST, FILTER_LIST + names))


def tested_models(report: Path) -> set[str]:
    """The iris model names in the ids of the tests pytest ran (``test_x[1-iris_pdessm_t]``)."""
    names = [case.get("name", "") for case in ET.parse(report).iter("testcase")]
    return {model for name in names for model in re.findall(r"[\[-](iris_\w+?)(?=[-\]])", name)}


def main(pytest_args: list[str]) -> int:
    timm_version = version("timm")
    with tempfile.TemporaryDirectory(prefix="timm-tests-") as tmp:
        start = time.perf_counter()
        source = fetch_tests(timm_version, Path(tmp))
        add_to_feature_tests(source / "tests" / "test_models.py", iris_modules())
        report = Path(tmp) / "report.xml"
        command = [sys.executable, "-m", "pytest", "tests/test_models.py", "-k", "iris", "-p", "iris_timm"]
        command += ["-p", "no:cacheprovider", "-q", "-W", "ignore::pytest.PytestUnknownMarkWarning", "-n", "2"]
        result = subprocess.run([*command, f"--junitxml={report}", *pytest_args], cwd=source, check=False)
        untested = sorted(set(iris_models()) - tested_models(report)) if report.is_file() else iris_models()
        print(f"timm {timm_version} model tests on {iris_models()}: {time.perf_counter() - start:.0f} s")
    if untested and not pytest_args:  # a full run must reach every model; a narrowed one need not
        print(f"No timm test ran on {untested}.")
        return result.returncode or 1
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

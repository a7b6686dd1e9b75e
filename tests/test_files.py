"""Atomic writes, and the permissions the umask gives: to what ``apply_umask`` is handed, and to what each writer that
uses it writes (a Hub folder, a training run's folder)."""

import contextlib
import os
import stat
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_model
from safetensors.torch import save_file

import iris_timm
import train
from iris_timm.files import apply_umask, atomic_write, write_text


def test_a_failed_write_leaves_the_previous_file_and_no_partial(tmp_path):
    path = tmp_path / "results.md"
    write_text(path, "before")
    with pytest.raises(RuntimeError, match="disk full"), atomic_write(path) as partial:
        partial.write_text("half of it")
        raise RuntimeError("disk full")
    assert path.read_text() == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]


def test_the_partial_file_keeps_the_suffix_and_replaces_the_target(tmp_path):
    path = tmp_path / "picture.png"
    with atomic_write(path) as partial:
        assert partial.parent == tmp_path and partial.suffix == ".png" and partial != path
        partial.write_bytes(b"\x89PNG")
        assert not path.exists()  # nothing is visible under the final name before the block ends
    assert path.read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["picture.png"]


def owner_only_folder_with_umask_applied(folder: Path) -> None:
    """Files and a subfolder readable by the owner alone (as safetensors writes them), then ``apply_umask``."""
    (folder / "random_states").mkdir(parents=True, mode=0o700)
    save_file({"w": torch.zeros(2)}, folder / "model.safetensors")
    (folder / "random_states" / "rng.pkl").write_bytes(b"")
    apply_umask(folder)


def saved_model(folder: Path) -> None:
    iris_timm.save_pretrained(tiny_model(num_classes=3), folder)


def training_run(folder: Path) -> None:
    """Two steps of the smoke recipe, a checkpoint and the best weights included."""
    recipe = str(ROOT / "configs" / "smoke.yaml")
    train.main(train.parse_config(["--config", recipe, "--max-steps", "2", "--output-dir", str(folder)]))


@contextlib.contextmanager
def umask_set_to(umask: int):
    previous = os.umask(umask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=lambda umask: f"umask {umask:03o}")
@pytest.mark.parametrize("write", [owner_only_folder_with_umask_applied, saved_model, training_run])
def test_written_files_and_folders_get_the_umasks_permissions(tmp_path, write, umask):
    folder = tmp_path / "written"
    with umask_set_to(umask):
        write(folder)
    paths = [folder, *folder.rglob("*")]
    assert any(path.suffix == ".safetensors" for path in paths)
    modes = {path.relative_to(folder).as_posix(): stat.S_IMODE(path.stat().st_mode) for path in paths}
    expected = {name: 0o777 & ~umask if (folder / name).is_dir() else 0o666 & ~umask for name in modes}
    assert modes == expected

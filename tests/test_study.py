"""The study report: the table from run folders, the kernels the pictures show, and the pictures themselves."""

import math
from pathlib import Path

import numpy
import pytest
import torch
from conftest import run_summary, tiny_model

import iris_timm
from benchmarks.study import (
    effective_kernels,
    load_runs,
    main,
    pde_operators,
    resolution_results,
    resolution_table,
    results_table,
    summarize,
    top1_at_sizes,
)
from iris_timm.layers import ConvectionDiffusionReaction2d, create_cdr
from iris_timm.training.run_folder import Evaluation, TrainingLog, append_metrics, write_summary, write_train_config


def write_run(folder: Path, model: str, top1: float, curve: list[tuple[float, float]], **summary) -> None:
    """A finished run folder as train.py leaves it, evaluated after each (seconds of training, top-1) of ``curve``."""
    folder.mkdir(parents=True)
    write_train_config(folder, {"model": model, "model_kwargs": {"stem_stride": 2}})
    append_metrics(folder, TrainingLog(step=10, epoch=0, loss=2.0, lr=1e-3))
    for i, (seconds, accuracy) in enumerate(curve):
        append_metrics(
            folder, Evaluation(step=10 * (i + 1), epoch=i, accuracy={"top1": accuracy}, train_time_s=seconds)
        )
    write_summary(folder, run_summary(top1=top1, **summary))


def test_table_gives_mean_and_sample_spread_per_configuration_best_first(tmp_path, capsys):
    write_run(tmp_path / "resnet" / "seed0", "resnet10t", 50.0, [(100.0, 30.0), (300.0, 50.0)], steps=90)
    write_run(tmp_path / "resnet" / "seed1", "resnet10t", 53.0, [(300.0, 53.0)], steps=110)
    write_run(tmp_path / "iris" / "seed0", "iris_pdessm_t", 60.0, [(300.0, 60.0)], threads=1)
    (tmp_path / "iris" / "seed1").mkdir()  # unfinished: no summary.json

    runs = load_runs(tmp_path)
    assert "skipped " + str(tmp_path / "iris" / "seed1") in capsys.readouterr().out
    assert [(r.configuration, r.seed) for r in runs] == [("iris", "seed0"), ("resnet", "seed0"), ("resnet", "seed1")]
    write_run(tmp_path / "resnet" / "seed10", "resnet10t", 50.0, [(300.0, 50.0)])
    write_run(tmp_path / "resnet" / "seed2", "resnet10t", 50.0, [(300.0, 50.0)])
    assert [r.seed for r in load_runs(tmp_path)][1:] == ["seed0", "seed1", "seed2", "seed10"]
    assert runs[1].curve == [(100.0, 30.0), (300.0, 50.0)]
    rows = summarize(runs)
    assert [r["configuration"] for r in rows] == ["iris", "resnet"]
    assert rows[1]["top1"] == 51.5 and rows[1]["top1_std"] == pytest.approx(math.sqrt(4.5)) and rows[1]["steps"] == 100
    assert rows[0]["top1_std"] is None  # one seed has no spread
    table = results_table(rows)
    assert "| train s (min–max) | val top-1 after 200 s (%) | final val top-1 (%) |" in table
    assert (
        "| resnet | resnet10t | stem_stride=2 | 2.50M | 2 | 100 | 50 | 300 (300–300) | 51.50 ± 2.12 | 51.50 ± 2.12 |"
        in table
    )
    assert "| iris | iris_pdessm_t | stem_stride=2 | 2.50M | 1 | 100 | 50 | 300 (300–300) | 60.00 | 60.00 |" in table
    at_100 = results_table(summarize(runs, at_s=100.0))  # resnet seed0 reached 30 % after 100 s, seed1 53 % at 300 s
    assert "| val top-1 after 100 s (%) |" in at_100 and "| 41.50 ± 16.26 | 51.50 ± 2.12 |" in at_100
    assert "| - | 51.50 ± 2.12 |" in results_table(summarize(runs, at_s=400.0))  # no run trained that long


def test_a_run_without_evaluations_is_an_error(tmp_path):
    write_run(tmp_path / "iris" / "seed0", "iris_pdessm_t", 60.0, [])
    with pytest.raises(SystemExit, match=r"iris/seed0/metrics\.jsonl has no evaluation"):
        load_runs(tmp_path)


def test_no_finished_run_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match=r"No finished runs under .*: expected .*/<configuration>/<seed>/summary"):
        load_runs(tmp_path)


@pytest.mark.parametrize("size", [32, 33])
def test_effective_kernel_is_the_shifted_gaussian_the_coefficients_describe(size):
    # The periodic operator with every mode: its kernel keeps all its mass and its peak on the grid.
    operator = create_cdr(8, num_heads=2, boundary="periodic", modes=0)
    with torch.no_grad():
        operator.log_diffusion.fill_(math.log(1e-4))  # blur width sqrt(2 t D) = 0.014: under one cell
        operator.velocity.copy_(torch.tensor([[0.25, -0.125], [0.0, 0.0]]))
        operator.reaction.copy_(torch.tensor([0.0, 0.5]))
    kernels = effective_kernels(operator, size)  # (heads, size, size)
    assert kernels.shape == (2, size, size)
    # The gain at frequency zero is exp(t r): the kernel's sum.
    torch.testing.assert_close(kernels.sum(dim=(-2, -1)), torch.tensor([1.0, math.exp(0.5)]))
    # Convection moves the kernel's peak by t v of the image: (+size/4 rows, -size/8 columns) from the centre.
    centre = size // 2
    peaks = [divmod(k.argmax().item(), size) for k in kernels]
    assert peaks == [(centre + round(size / 4), centre - round(size / 8)), (centre, centre)]


def test_pde_operators_are_grouped_by_stage():
    model = tiny_model(depths=(1, 2, 1, 1))
    stages = pde_operators(model)
    assert sorted(stages) == [0, 1, 2, 3] and [len(ops) for ops in stages.values()] == [1, 2, 1, 1]
    in_block = [m for m in model.stages[1].blocks[1].modules() if isinstance(m, ConvectionDiffusionReaction2d)]
    assert stages[1][1:] == in_block


def test_report_writes_the_table_and_pictures(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        folder = runs / "iris" / f"seed{seed}"
        write_run(folder, "iris_pdessm_test", 40.0 + seed, [(100.0, 30.0), (200.0, 40.0 + seed)], threads=1)
        iris_timm.save_pretrained(tiny_model(num_classes=10), folder)
    out = tmp_path / "report"
    main(["--runs", str(runs), "--out", str(out), "--eval-sizes", "--at-s", "150"])
    text = (out / "results.md").read_text()
    assert text.startswith("| configuration | model |") and "| iris | iris_pdessm_test |" in text
    rebuild = f"python -m benchmarks.study --runs {runs} --out {out} --eval-sizes --at-s 150"
    assert f"python train.py\npython train.py\n{rebuild}\n```" in text
    assert "on 1 CPU thread per run" in text
    for name in ("accuracy_vs_time.png", "pde_coefficients.png", "pde_kernels.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
    assert not list(out.glob("*.partial*"))


def test_top1_at_sizes_resizes_the_same_images_and_normalises_them_as_the_model_expects():
    model = tiny_model(num_classes=10)
    images = torch.rand(6, 3, 32, 32)
    mean, std = torch.tensor(model.pretrained_cfg["mean"]), torch.tensor(model.pretrained_cfg["std"])

    def predictions(size: int) -> torch.Tensor:
        resized = torch.nn.functional.interpolate(images, size=(size, size), mode="bicubic", antialias=True)
        with torch.no_grad():
            return model((resized.clamp(0, 1) - mean[:, None, None]) / std[:, None, None]).argmax(-1)

    labels = predictions(48)
    labels[:2] = (labels[:2] + 1) % 10  # two wrong at 48
    results = top1_at_sizes(model, images, labels, [32, 48], batch_size=4)
    assert results[48] == pytest.approx(100 * 4 / 6)
    assert results[32] == pytest.approx(100 * (predictions(32) == labels).float().mean().item())


def test_resolution_table_reports_each_size_and_the_change_from_the_training_size(tmp_path):
    runs = []
    for seed, results in enumerate([{24: 40.0, 32: 50.0, 48: 45.0}, {24: 42.0, 32: 52.0, 48: 49.0}]):
        folder = tmp_path / "iris" / f"seed{seed}"
        write_run(folder, "iris_pdessm_test", 50.0 + 2 * seed, [(100.0, 50.0)])
        runs.append((folder, results))
    loaded = load_runs(tmp_path)
    table = resolution_table(loaded, dict(runs), [24, 32, 48], 32)
    assert (
        table.splitlines()[0]
        == "| configuration | seeds | 24² (%) | 32² (%) | 48² (%) | change at 24² | change at 48² |"
    )
    assert (
        table.splitlines()[2]
        == "| iris | 2 | 41.00 ± 1.41 | 51.00 ± 1.41 | 47.00 ± 2.83 | -10.00 ± 0.00 | -4.00 ± 1.41 |"
    )


def test_a_greyscale_run_is_evaluated_on_greyscale_images(tmp_path):
    """A one-channel model reads the validation images as train.py does (PIL ``"L"``), not as RGB."""
    from datasets import Dataset, Features, Image, Value
    from PIL import Image as PILImage

    generator = torch.Generator().manual_seed(0)
    colours = (torch.rand(6, 16, 16, 3, generator=generator) * 255).to(torch.uint8).numpy()
    pictures = [PILImage.fromarray(c) for c in colours]
    data = tmp_path / "data"
    data.mkdir()
    features = Features({"image": Image(), "label": Value("int64")})
    Dataset.from_dict({"image": pictures, "label": [0, 1, 2, 0, 1, 2]}, features=features).to_parquet(
        str(data / "val.parquet")
    )
    folder = tmp_path / "runs" / "iris" / "seed0"
    write_run(folder, "iris_pdessm_test", 50.0, [(100.0, 50.0)])
    write_train_config(folder, {"model": "iris_pdessm_test", "dataset": str(data), "img_size": 16})
    model = tiny_model(in_chans=1, num_classes=3)
    model.pretrained_cfg = dict(model.pretrained_cfg, input_size=(1, 16, 16), mean=(0.5,), std=(0.25,))
    iris_timm.save_pretrained(model, folder)

    grey = torch.stack([torch.from_numpy(numpy.array(p.convert("L"))) for p in pictures])
    with torch.no_grad():
        predictions = model((grey[:, None].float() / 255 - 0.5) / 0.25).argmax(-1)
    expected = 100.0 * (predictions == torch.tensor([0, 1, 2, 0, 1, 2])).float().mean().item()
    results = resolution_results(load_runs(tmp_path / "runs"), [16, 8])
    assert results[folder][16] == pytest.approx(expected)
    assert results[folder][8] is not None  # the model runs at 8x8, on the resized greyscale images

"""The study report: the table from run folders, the kernels the pictures show, and the pictures themselves."""

import json
import math
from pathlib import Path

import pytest
import timm
import torch
import yaml

import iris_timm
from iris_timm.layers import ConvectionDiffusionReaction2d
from iris_timm.study import effective_kernels, load_runs, main, pde_operators, results_table, summarize


def write_run(folder: Path, model: str, top1: float, curve: list[tuple[float, float]], **summary) -> None:
    folder.mkdir(parents=True)
    (folder / "train_config.yaml").write_text(yaml.safe_dump({"model": model, "model_kwargs": {"stem_stride": 2}}))
    lines = [{"step": 10, "train/loss": 2.0}] + [{"step": 10, "val/top1": a, "train_time_s": t} for t, a in curve]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    values = {"params": 2_500_000, "steps": 100, "train_images_per_s": 50.0, "train_time_s": 300.0, **summary}
    (folder / "summary.json").write_text(json.dumps({"top1": top1, "command": "python train.py", **values}))


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


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("size", [32, 33])
def test_effective_kernel_is_the_shifted_gaussian_the_coefficients_describe(size, channels_last):
    operator = ConvectionDiffusionReaction2d(8, num_heads=2, channels_last=channels_last)
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
    model = timm.create_model("iris_pdessm_test", depths=(1, 2, 1, 1))
    stages = pde_operators(model)
    assert sorted(stages) == [0, 1, 2, 3] and [len(ops) for ops in stages.values()] == [1, 2, 1, 1]
    assert stages[1][1] is model.stages[1].blocks[1].mixer.operator


def test_report_writes_the_table_and_pictures(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        folder = runs / "iris" / f"seed{seed}"
        write_run(folder, "iris_pdessm_test", 40.0 + seed, [(100.0, 30.0), (200.0, 40.0 + seed)], threads=1)
        iris_timm.save_pretrained(timm.create_model("iris_pdessm_test", num_classes=10), folder)
    out = tmp_path / "report"
    main(["--runs", str(runs), "--out", str(out)])
    text = (out / "results.md").read_text()
    assert text.startswith("| configuration | model |") and "| iris | iris_pdessm_test |" in text
    assert f"python train.py\npython train.py\npython -m iris_timm.study --runs {runs} --out {out}\n```" in text
    assert "on 1 CPU thread per run" in text
    for name in ("accuracy_vs_time.png", "pde_coefficients.png", "pde_kernels.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
    assert not list(out.glob("*.partial*"))

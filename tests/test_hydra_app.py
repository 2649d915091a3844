"""`stagebench sweep`: config composition and validation, Hydra's flags, jobs, multirun comparisons."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from stagebench.runs._jobs import JOB_STATUS
from stagebench.sweep._app import SweepCallback, _dirname_override, config_dir, loader_sweep_config, main
from stagebench.sweep._multirun import collect_jobs
from stagebench.sweep._schema import (
    LOADER_SCHEMAS,
    AudioLoaderConfig,
    ImageNetLoaderConfig,
    SyntheticLoaderConfig,
    register_configs,
    to_settings,
)

# One point per job, tiny budgets: these tests are about the app, not the loaders.
TINY = [
    "loader=synthetic",
    "loader.num_items=64",
    "loader.sample_shape=[3,8,8]",
    "loader.batch_size=8",
    "sweep.num_workers=[0]",
    "sweep.prefetch_factor=[2]",
    "sweep.persistent_workers=[false]",
    "sweep.budget_s=0.3",
    "sweep.timeout_s=30",
    "sweep.transforms=false",
    "sweep.epoch_stall=false",
    "progress=false",
]


def _compose(*overrides: str, hydra: bool = False):
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("stagebench sweep: error: ")
    return lines[0]


# --------------------------------------------------------------------------- configs (Compose API)


def test_the_hydra_app_runs_from_a_source_checkout():
    """`python -m stagebench sweep` from the repository root runs the tree's own package, whose conf/ sits
    beside it, not inside it (issue 32: it looked in stagebench/conf and stopped with a FileNotFoundError)."""
    import os

    root = Path(__file__).resolve().parent.parent
    # a diagnosis run in this process may have left SPDL_PIPELINE_DIAGNOSTIC_MODE=0, which makes the installed
    # package's .pth import stagebench at start-up, before the working directory is looked at
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGEBENCH_", "SPDL_PIPELINE_DIAGNOSTIC"))}
    env.pop("PYTHONPATH", None)
    where = subprocess.run(
        [sys.executable, "-c", "import stagebench; print(stagebench.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert Path(where.stdout.strip()).is_relative_to(root / "stagebench"), where.stdout
    r = subprocess.run(
        [sys.executable, "-m", "stagebench", "sweep", "loader=synthetic", "--cfg", "job"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "name: synthetic" in r.stdout and "Traceback" not in r.stderr


def test_every_loader_option_composes_into_its_schema():
    for name, cls in LOADER_SCHEMAS.items():
        extra = ["loader.dataset=pkg.mod:make"] if name == "custom" else []
        settings = to_settings(_compose(f"loader={name}", *extra))
        assert type(settings.loader) is cls and settings.loader.name == name
        assert settings.loader.backend.name == "torch"


def test_defaults_of_the_imagenet_loader_and_the_sweep():
    s = to_settings(_compose())
    lc = s.loader
    assert isinstance(lc, ImageNetLoaderConfig)
    assert (lc.root, lc.decoder.name, lc.image_size, lc.batch_size) == (None, "pillow", 224, 32)
    assert s.sweep.strategy.name == "adaptive" and s.sweep.num_workers is None
    lsc = loader_sweep_config(s.sweep)
    assert lsc.strategy == "adaptive" and lsc.budget_s == s.sweep.budget_s and lsc.timeout_s == s.sweep.timeout_s


def test_sweep_lists_map_onto_the_loader_sweep_config():
    s = to_settings(
        _compose(
            "sweep.num_workers=[4,0,2,2]",
            "sweep.prefetch_factor=[4,2]",
            "sweep.persistent_workers=[true]",
            "sweep.max_workers=3",
            "sweep.strategy=grid",
        )
    )
    lsc = loader_sweep_config(s.sweep)
    assert lsc.num_workers == (0, 2, 4) and lsc.prefetch_factors == (2, 4)
    assert lsc.persistent_workers == (True,) and lsc.max_workers == 3 and lsc.strategy == "grid"


def test_overrides_reach_the_typed_config():
    s = to_settings(
        _compose(
            "loader=audio",
            "loader.backend=spdl_pipeline",
            "loader.decoder=wav",
            "loader.crop_seconds=1.5",
            "sweep.target_rate=500",
        )
    )
    assert isinstance(s.loader, AudioLoaderConfig)
    assert (s.loader.backend.name, s.loader.decoder.name, s.loader.crop_seconds) == ("spdl_pipeline", "wav", 1.5)
    assert s.sweep.target_rate == 500.0
    syn = to_settings(_compose("loader=synthetic", "loader.sample_shape=[1,2]")).loader
    assert isinstance(syn, SyntheticLoaderConfig) and list(syn.sample_shape) == [1, 2]


def test_output_layout():
    cfg = _compose("loader.backend=spdl_pytorch", hydra=True)
    assert str(cfg.hydra.run.dir).startswith("reports/sweep-")
    assert str(cfg.hydra.sweep.dir).startswith("reports/multirun-")
    assert cfg.hydra.job.name == "stagebench"
    assert "stagebench.sweep._app.SweepCallback" in str(cfg.hydra.callbacks)


# --------------------------------------------------------------------------- validation (via the CLI function)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["loader.num_wrkers=3"], ["unknown key 'loader.num_wrkers'", "allowed keys in loader:", "batch_size"]),
        (
            ["loader=imagenett"],
            [
                "loader=imagenett: no such option",
                "available: audio, custom, imagenet, synthetic",
                "did you mean imagenet",
            ],
        ),
        (["loader.backend=tf"], ["loader.backend: invalid value 'tf'", "allowed: torch, spdl_pytorch, spdl_pipeline"]),
        (["loader.decoder=cv2"], ["loader.decoder: invalid value 'cv2'", "allowed: pillow, spdl"]),
        (["loader.batch_size=0"], ["loader.batch_size: must be >= 1, got 0"]),
        (["loader.batch_size=abc"], ["loader.batch_size:", "Integer"]),
        (["+loader.foo=1"], ["unknown key 'loader.foo'", "allowed keys in loader"]),
        (
            ["loader=synthetic", "loader.decoder=spdl"],
            ["unknown key 'loader.decoder'", "is a key of the imagenet and audio loaders"],
        ),
        (["sweep.strategy=gird"], ["sweep.strategy: invalid value 'gird'", "allowed: adaptive, grid"]),
        (["sweep.timeout_s=3.1"], ["sweep.timeout_s", "must be larger than"]),
        (["loader=custom"], ["loader.dataset: required"]),
        (["loader.backend=torch,spdl_pytorch"], ["several values sweep only with -m"]),
        (["hydra/launcher=jobilb"], ["hydra/launcher=jobilb: no such option", "joblib"]),
        (["foo=1"], ["unknown key 'foo'", "loader, sweep, progress"]),
    ],
)
def test_bad_configs_fail_with_one_line(overrides, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(overrides) == 2
    line = _error_line(capsys)
    for part in expected:
        assert part in line, line
    assert not (tmp_path / "reports").exists(), "nothing ran"


def test_a_bad_combination_in_a_multirun_names_the_job(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["-m", "loader=imagenet,synthetic", "loader.decoder=pillow,spdl"]) == 2
    line = _error_line(capsys)
    assert "unknown key 'loader.decoder'" in line and "[job overrides: loader=synthetic loader.decoder=pillow]" in line
    assert not (tmp_path / "reports").exists()


def test_user_config_dir(tmp_path, capsys):
    (tmp_path / "loader").mkdir()
    (tmp_path / "loader" / "mine.yaml").write_text("defaults: [imagenet, _self_]\nname: mine\nroot: /data/mine\n")
    (tmp_path / "loader" / "typo.yaml").write_text(
        "defaults: [/schema/loader/imagenet@_here_, _self_]\nname: typo\nbach_size: 8\n"
    )
    (tmp_path / "loader" / "plain.yaml").write_text("name: plain\n")
    assert main(["--config-dir", str(tmp_path), "--cfg", "job", "loader=mine"]) == 0
    out = capsys.readouterr().out
    assert "name: mine" in out and "root: /data/mine" in out and "decoder: pillow" in out
    assert main(["--config-dir", str(tmp_path), "--cfg", "job", "loader=typo"]) == 2
    line = _error_line(capsys)
    assert "unknown key 'loader.bach_size'" in line and "loader/typo.yaml" in line and "batch_size" in line
    assert main(["--config-dir", str(tmp_path), "--cfg", "job", "loader=plain"]) == 2
    assert "must extend one of the schemas" in _error_line(capsys)
    assert main(["--config-dir", str(tmp_path / "nope"), "--cfg", "job"]) == 2
    assert "--config-dir" in _error_line(capsys)


# --------------------------------------------------------------------------- Hydra's own flags


def test_hydra_flags(capsys):
    assert main(["--cfg", "job", "loader=audio"]) == 0
    out = capsys.readouterr().out
    assert "loader:" in out and "name: audio" in out and "sweep:" in out and "hydra:" not in out
    assert main(["--cfg", "hydra"]) == 0
    assert "run:" in capsys.readouterr().out
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "stagebench sweep" in out and "loader: audio, custom, imagenet, synthetic" in out
    assert main(["--info", "defaults"]) == 0
    assert "schema/loader/imagenet" in capsys.readouterr().out
    assert main(["--hydra-help"]) == 0
    assert "Hydra" in capsys.readouterr().out
    assert main(["--no-such-flag"]) == 2


def test_installed_console_script_from_another_directory(tmp_path):
    """The configs must ship with the package: run the console script away from the checkout."""
    script = Path(sys.executable).parent / "stagebench"
    p = subprocess.run(
        [str(script), "sweep", "--cfg", "job", "loader=imagenet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "name: imagenet" in p.stdout and "decoder: pillow" in p.stdout
    p = subprocess.run(
        [str(script), "sweep", "loader=imagenett"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "available: audio, custom, imagenet, synthetic" in p.stderr
    assert not (tmp_path / "reports").exists()


def test_configs_load_as_a_package_when_installed():
    """Installed from a wheel, conf/ is stagebench/conf: other Hydra apps can use pkg://stagebench.conf."""
    import importlib.util

    if importlib.util.find_spec("stagebench.conf") is None:
        pytest.skip("editable install: conf/ sits next to the package (a wheel puts it inside)")
    from hydra import initialize_config_module

    register_configs()
    with initialize_config_module(config_module="stagebench.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["loader=audio"])
    assert to_settings(cfg).loader.name == "audio"
    assert config_dir() == Path(importlib.util.find_spec("stagebench.conf").origin).parent


# --------------------------------------------------------------------------- jobs


def test_one_job_writes_its_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(TINY) == 0
    (run,) = list((tmp_path / "reports").glob("sweep-*"))
    assert f"run directory: {run}" in capsys.readouterr().out
    for name in ("run.json", "results.csv", "summary.json", "report.html", JOB_STATUS, ".hydra", "stagebench.log"):
        assert (run / name).exists(), name
    status = json.loads((run / JOB_STATUS).read_text())
    assert status["status"] == "ok" and status["loader"] == "synthetic" and status["backend"] == "torch"
    assert status["recommended"]["num_workers"] == 0
    meta = json.loads((run / "run.json").read_text())
    assert meta["kind"] == "loader" and meta["hydra"]["overrides"] == TINY
    assert meta["hydra"]["loader_config"]["sample_shape"] == [3, 8, 8]
    assert meta["dataset"]["items"] == 64
    assert json.loads((run / "summary.json").read_text())["kind"] == "loader"


def test_a_failing_job_is_recorded_with_exit_code_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["loader=imagenet", f"loader.root={tmp_path / 'nowhere'}", "progress=false"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "job failed: loader.root: folder" in err
    (run,) = list((tmp_path / "reports").glob("sweep-*"))
    status = json.loads((run / JOB_STATUS).read_text())
    assert status["status"] == "failed" and "does not exist" in status["reason"]
    assert "Traceback" in (run / "stagebench.log").read_text(), "the traceback is kept in the job's log"


@pytest.mark.slow
def test_multirun_compares_jobs_and_keeps_a_failed_one(tmp_path, monkeypatch, capsys):
    from stagebench.sweep._datasets import generate_imagenet

    monkeypatch.chdir(tmp_path)
    data = generate_imagenet(tmp_path / "data", classes=2, per_class=4, log=lambda m: None)
    (tmp_path / "empty").mkdir()
    sweep = tmp_path / "sweep"
    tiny = [o for o in TINY if not o.startswith("loader")]
    from stagebench.sweep import _app

    returned = []  # what Hydra's sweepers read from each job (Optuna maximises it)

    def task(cfg):
        returned.append(real_task(cfg))
        return returned[-1]

    real_task = _app._task
    monkeypatch.setattr(_app, "_task", task)
    code = main(
        [
            "-m",
            "loader=imagenet",
            f"loader.root={data},{tmp_path / 'empty'}",
            "loader.backend=torch,spdl_pipeline",
            "loader.image_size=16",
            "loader.batch_size=4",
            *tiny,
            f"hydra.sweep.dir={sweep}",
        ]
    )
    assert code == 1, "one configuration failed"
    # the ok jobs return their best samples/s, the failed ones None (a failed trial)
    assert sorted(r is None for r in returned) == [False, False, True, True]
    assert all(isinstance(r, float) and r > 0 for r in returned if r is not None)
    jobs = collect_jobs(sweep)
    assert [j["job_num"] for j in jobs] == [0, 1, 2, 3]
    # Folders are named by what differs between jobs (the root is excluded: a path).
    names = sorted(Path(j["run_dir"]).name for j in jobs)
    assert names == [
        "0-loader.backend=torch",
        "1-loader.backend=spdl_pipeline",
        "2-loader.backend=torch",
        "3-loader.backend=spdl_pipeline",
    ]
    by_root = {}
    for j in jobs:
        root = next(o.split("=", 1)[1] for o in j["overrides"] if o.startswith("loader.root="))
        by_root.setdefault(root, []).append(j)
    assert all(j["status"] == "ok" for j in by_root[str(data)])
    failed = by_root[str(tmp_path / "empty")]
    assert all(j["status"] == "failed" and "no images" in j["reason"] for j in failed)
    # The comparison covers every job: the two that ran and the two that failed.
    with open(sweep / "comparison.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["status"] for r in rows) == ["failed", "failed", "ok", "ok"]
    # Each job is labelled by the keys the sweep varies.
    assert {r["label"] for r in rows if r["status"] == "ok"} == {
        f"loader.root={data}, loader.backend=torch",
        f"loader.root={data}, loader.backend=spdl_pipeline",
    }
    assert all(j["label"] == ", ".join(j["overrides"][1:3]) for j in jobs)
    assert (sweep / "comparison.html").is_file()
    out, err = capsys.readouterr()
    assert f"comparison: {sweep / 'comparison.html'}" in out
    assert "2 of 4 jobs failed" in err


def test_collect_jobs_reports_a_job_without_status(tmp_path):
    (tmp_path / "0-a").mkdir()
    (tmp_path / "0-a" / JOB_STATUS).write_text(json.dumps({"status": "ok", "job_num": 0}))
    (tmp_path / "1-b" / ".hydra").mkdir(parents=True)  # started, killed before its status was written
    (tmp_path / "not-a-job").mkdir()
    jobs = collect_jobs(tmp_path)
    assert [(Path(j["run_dir"]).name, j["status"]) for j in jobs] == [("0-a", "ok"), ("1-b", "failed")]
    assert "without a status" in jobs[1]["reason"]


def test_job_folders_are_named_by_what_varies():
    key = "hydra.job.config.override_dirname.exclude_keys"
    assert _dirname_override(["a=1", "b=2,3"], ["a"], ["loader.root"]) == [f"{key}=[loader.root,a]"]
    assert _dirname_override(["b=2,3"], [], ["loader.root"]) == []
    assert _dirname_override(["a=1", f"{key}=[x]"], ["a"], []) == [], "the user's own setting wins"


def test_parallel_launchers_are_warned_about(capsys):
    cfg = _compose("hydra/launcher=joblib", hydra=True)
    SweepCallback().on_multirun_start(cfg)
    err = capsys.readouterr().err
    assert "warning:" in err and "joblib" in err and "at once" in err
    SweepCallback().on_multirun_start(_compose(hydra=True))
    assert "warning" not in capsys.readouterr().err


@pytest.mark.slow
def test_joblib_launcher_runs_jobs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    # Worker processes inside joblib's workers: the loaders must not use loky's start method.
    code = main(
        [
            "-m",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            *TINY,
            "sweep.num_workers=[1]",
            "loader.backend=torch,spdl_pipeline",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    jobs = collect_jobs(sweep)
    assert [j["status"] for j in jobs] == ["ok", "ok"], jobs
    assert all(j["recommended"]["num_workers"] == 1 for j in jobs)
    assert "at once" in capsys.readouterr().err
    assert (sweep / "comparison.csv").is_file()


def test_user_loader_yaml_example_in_the_help_is_valid(tmp_path, capsys):
    # The help text shows how to write a loader of one's own: keep it working.
    (tmp_path / "loader").mkdir()
    (tmp_path / "loader" / "mine.yaml").write_text(
        textwrap.dedent("""
        defaults: [/schema/loader/imagenet@_here_, _self_]
        name: mine
        root: /data/mine
    """)
    )
    assert main(["--config-dir", str(tmp_path), "--cfg", "job", "loader=mine"]) == 0
    assert "root: /data/mine" in capsys.readouterr().out


def test_the_shipped_optuna_search_finds_what_a_grid_over_the_same_space_finds(tmp_path, monkeypatch):
    """hydra/sweeper=loader_search (Optuna, 6 trials) on the built-in ImageNet-style data: each job returns
    its best samples/s and the sweeper maximises it; its best is the grid's best over the same space,
    within noise (a loose 25%: two cores, and the trials run at other moments than the grid's jobs)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    import yaml

    from stagebench.sweep._datasets import generate_imagenet

    monkeypatch.chdir(tmp_path)
    data = generate_imagenet(tmp_path / "data", classes=2, per_class=16, log=lambda m: None)
    fixed = [
        "loader=imagenet",
        f"loader.root={data}",
        "loader.image_size=16",
        "sweep.num_workers=[0,1]",
        "sweep.prefetch_factor=[2]",
        "sweep.persistent_workers=[false]",
        "sweep.budget_s=0.3",
        "sweep.timeout_s=30",
        "sweep.transforms=false",
        "sweep.epoch_stall=false",
        "progress=false",
    ]
    space = {"loader.batch_size": "8,16,32", "loader.backend": "torch,spdl_pytorch"}
    search = tmp_path / "search"
    code = main(
        [
            "-m",
            "hydra/sweeper=loader_search",
            *[f"{k}=choice({v})" for k, v in space.items()],  # the search space, as Optuna reads it
            *fixed,
            f"hydra.sweep.dir={search}",
        ]
    )
    assert code == 0
    jobs = collect_jobs(search)
    assert len(jobs) == 6 and all(j["status"] == "ok" for j in jobs)
    result = yaml.safe_load((search / "optimization_results.yaml").read_text())
    assert set(result["best_params"]) == set(space)
    grid = tmp_path / "grid"
    assert main(["-m", *[f"{k}={v}" for k, v in space.items()], *fixed, f"hydra.sweep.dir={grid}"]) == 0
    with open(grid / "comparison.csv", newline="", encoding="utf-8") as f:
        best_of_grid = max(float(r["best"]) for r in csv.DictReader(f))
    assert result["best_value"] >= 0.75 * best_of_grid, (result, best_of_grid)

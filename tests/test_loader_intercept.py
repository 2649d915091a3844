"""Zero-code loader diagnosis: the first DataLoader an unmodified script iterates is swept instead.

The subprocess test runs a tiny training script with the hook installed the way
`stagebench diagnose` will (install, then run the script with runpy): the loop
body must never run, the process exits 0, and the run directory is complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))

from loader_datasets import SleepDataset, slow_worker_init

from stagebench.loader._intercept import factory_from_loader, install_dataloader_hook
from stagebench.model._knobs import LoaderKnobs

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
SCRIPT = Path(__file__).parent / "scripts" / "loader_train.py"


@pytest.mark.slow
def test_unmodified_script_is_swept_and_its_loop_never_runs(tmp_path):
    out = tmp_path / "run"
    marker = tmp_path / "marker"
    code = textwrap.dedent(f"""
        import runpy, sys
        from stagebench.loader._sweep import LoaderSweepConfig
        from stagebench.loader._intercept import diagnose_first_loader
        cfg = LoaderSweepConfig(strategy="grid", num_workers=(0, 2), prefetch_factors=(2,),
                                persistent_workers=(False,), budget_s=0.3, warmup_s=0.1, timeout_s=20,
                                transform_items=4, transform_budget_s=0.1, transform_max_concurrency=1,
                                transform_executors=("thread",))
        diagnose_first_loader({str(out)!r}, config=cfg)
        sys.argv = [{str(SCRIPT)!r}]
        runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
        print("SCRIPT RETURNED")
    """)
    env = {**os.environ, "LOADER_TRAIN_MARKER": str(marker)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists(), "the loop body ran"
    assert "SCRIPT RETURNED" not in proc.stdout  # SystemExit(0) from the for statement
    assert "verdict:" in proc.stdout and "report:" in proc.stdout
    assert (out / "results.csv").exists() and (out / "summary.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    meta = json.loads((out / "run.json").read_text())
    # the script's own objects: its batch size, sampler and worker_init_fn
    assert summary["loader"]["batch_size"] == 6 and summary["loader"]["name"] == "SleepDataset"
    assert meta["loader"]["worker_init_fn"] == "seed_worker"
    assert meta["loader"]["sampler"] == "BatchSampler" and meta["loader"]["epoch_batches"] == 48 // 6
    # the grid plus the script's own setting (3 workers)
    assert [p["num_workers"] for p in summary["points"]] == [0, 2, 3]
    assert summary["points"][-1]["search_phase"] == "user"
    assert all(p["status"] == "ok" for p in summary["points"]), summary["points"]
    assert summary["user_setting"]["num_workers"] == 3
    # the dataset's Compose was split and each step measured
    assert [t["name"] for t in summary["transforms"]] == ["sleepy_transform", "scale_transform"]
    assert (out / "transforms.csv").exists()


def test_factory_rebuilds_a_caught_torch_loader_with_its_own_objects():
    from torch.utils.data import DataLoader

    def collate(batch):
        return list(batch)

    ds = SleepDataset(n=20, d=0.0)
    dl = DataLoader(
        ds,
        batch_size=5,
        collate_fn=collate,
        worker_init_fn=slow_worker_init,
        num_workers=2,
        prefetch_factor=3,
        persistent_workers=True,
        drop_last=True,
    )
    factory, backend = factory_from_loader(dl)
    assert backend == "torch" and factory.dataset is ds and factory.batch_size == 5
    assert factory.collate_fn is collate and factory.worker_init_fn is slow_worker_init
    assert factory.user_knobs == LoaderKnobs(num_workers=2, prefetch_factor=3, persistent_workers=True)
    built = factory(LoaderKnobs(num_workers=0))
    batches = list(built.loader)
    assert len(batches) == 4  # drop_last kept by the batch sampler
    import torch

    first = batches[0].batch  # the user's collate output, untouched
    assert isinstance(first, list) and all(torch.equal(x, ds[i]) for i, x in enumerate(first))
    assert batches[0].n == 5 and batches[0].pid == os.getpid() and batches[0].worker == -1


def test_factory_rebuilds_a_caught_spdl_loader():
    from spdl.dataloader import get_pytorch_dataloader

    ds = SleepDataset(n=12, d=0.0)
    dl = get_pytorch_dataloader(ds, batch_size=3, num_workers=2, prefetch_factor=4)
    try:
        factory, backend = factory_from_loader(dl)
        assert backend == "spdl_pytorch" and factory.batch_size == 3
        assert factory.user_knobs.num_workers == 2 and factory.user_knobs.prefetch_factor == 4
        assert factory.auto_collation
    finally:
        dl._shmem.close()
        dl._shmem.unlink()


def test_hook_catches_only_the_first_iterated_loader_and_can_be_removed():
    from torch.utils.data import DataLoader

    caught = []
    uninstall = install_dataloader_hook(caught.append)
    try:
        a = DataLoader(SleepDataset(n=4, d=0.0), batch_size=2)
        b = DataLoader(SleepDataset(n=4, d=0.0), batch_size=2)
        assert len(list(b)) == 2  # iterating still works: the callback returned normally
        assert len(list(a)) == 2
        assert caught == [b]
        assert DataLoader.__iter__ is DataLoader.__dict__["__iter__"] and not hasattr(
            DataLoader.__iter__, "__wrapped__"
        )
    finally:
        uninstall()
    caught.clear()
    uninstall = install_dataloader_hook(caught.append)
    uninstall()
    list(DataLoader(SleepDataset(n=2, d=0.0), batch_size=2))
    assert caught == []


@pytest.mark.slow
@pytest.mark.parametrize("spdl_loader", [False, True], ids=["torch", "spdl_pytorch"])
def test_stagebench_diagnose_catches_a_dataloader_script(tmp_path, spdl_loader):
    """`stagebench diagnose train.py` on a PyTorch script: the loader is swept, the loop never runs.

    SPDL's PyTorch-style loader builds an SPDL pipeline each time it is iterated: that
    pipeline must run as a pipeline, not start a second (pipeline) diagnosis into the
    same folder (it did, and the run ended with "the output directory already holds ...").
    """
    import subprocess
    import sys

    marker = tmp_path / "marker"
    out = tmp_path / "run"
    env = {
        **os.environ,
        "LOADER_TRAIN_SPDL": "1" if spdl_loader else "",
        "LOADER_TRAIN_MARKER": str(marker),
        "STAGEBENCH_BUDGET_S": "0.3",
        "STAGEBENCH_EXECUTORS": "thread",
        "STAGEBENCH_CONCURRENCY": "1,2",
    }
    script = Path(__file__).parent / "scripts" / "loader_train.py"
    r = subprocess.run(
        [sys.executable, "-m", "stagebench", "diagnose", "--out", str(out), str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists(), "the training loop body ran"
    assert {"results.csv", "summary.json", "run.json"} <= {p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "loader" and summary["recommended"]["num_workers"] >= 0
    assert summary["loader"]["backend"] == ("spdl_pytorch" if spdl_loader else "torch")
    assert all(p["status"] == "ok" for p in summary["points"]), summary["points"]
    # the sweep turns the diagnostic mode off for SPDL's own loader's pipeline; the run records the mode as set
    env = json.loads((out / "run.json").read_text())["provenance"]["env"]
    assert env["SPDL_PIPELINE_DIAGNOSTIC_MODE"] == "1", env


def test_two_post_import_hooks_on_one_module_both_run_and_do_not_ask_each_other_for_ever(tmp_path, monkeypatch):
    """The variable's activation and ``stagebench diagnose`` each wait for torch's DataLoader module: two
    finders of one name asked each other for it until Python's recursion limit (issue 57)."""
    from stagebench._import_hook import PostImportFinder

    (tmp_path / "hooked_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    finders = [PostImportFinder(("hooked_target",), lambda m, k=k: seen.append(f"{k}:{m.VALUE}")) for k in "ab"]
    for f in finders:
        sys.meta_path.insert(0, f)
    try:
        import hooked_target  # noqa: F401
    finally:
        for f in finders:
            sys.meta_path.remove(f)
        sys.modules.pop("hooked_target", None)
    assert sorted(seen) == ["a:1", "b:1"]

"""What each worker costs beyond throughput (loader/_costs, analysis/_worker_costs): known answers (issue 38)."""

from __future__ import annotations

import math
import os
import statistics
import time

import numpy as np
import pandas as pd
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from stagebench.analysis._loader_rows import normalize_row
from stagebench.analysis._worker_costs import worker_cost_findings, worker_costs_summary
from stagebench.loader._config import LoaderSweepConfig
from stagebench.loader._consumer import _Consumer, _SpdlErrors, _teardown
from stagebench.loader._costs import _growth, copy_bound_mb, largest_container, memory_pass, shipping_cost
from stagebench.loader._draft import PointDraft
from stagebench.loader._intercept import make_loader_factory
from stagebench.loader._point import _Plan, _supervise, measure_loader_point
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import LoaderRow, MemorySample, WorkerCosts, WorkerMemory
from stagebench.model._meta import RunMeta


class Blob(Dataset):
    """A dataset holding one bytes object of known size, plus a list of short strings."""

    def __init__(self, mb: float = 0.0, strings: int = 0) -> None:
        self.blob = os.urandom(int(mb * 2**20))
        self.names = [f"/data/train/{i:08d}.JPEG" for i in range(strings)]

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(2)


class Index(Dataset):
    """An index of (int, float, str) tuples, as a Python list or as numpy arrays."""

    def __init__(self, n: int, as_numpy: bool) -> None:
        self.n = n
        if as_numpy:
            self.a, self.b, self.index = np.arange(n), np.arange(n) * 0.5, None
        else:
            self.index = [(i, i * 0.5, f"k{i}") for i in range(n)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        a, b = (self.index[i][:2]) if self.index is not None else (self.a[i], self.b[i])
        return torch.tensor([a, b], dtype=torch.float64)


def test_the_shipped_copy_is_the_datasets_pickled_size_and_named():
    factory = make_loader_factory(Blob(mb=20.0, strings=50_000), batch_size=8, multiprocessing_context="spawn")
    ship = shipping_cost(factory, backend="torch")
    assert ship is not None and ship.shipped and ship.start_method == "spawn"
    assert ship.mb == pytest.approx(20.0 + 50_000 * 30 / 2**20, rel=0.10)
    assert ship.pickle_s > 0 and ship.unpickle_s > 0
    assert ship.pickle_s_range[0] <= ship.pickle_s <= ship.pickle_s_range[1]
    assert ship.largest.attr == "names" and ship.largest.items == 50_000
    # under fork nothing is shipped, whatever the size
    assert (
        shipping_cost(
            make_loader_factory(Blob(), batch_size=8, multiprocessing_context="fork"), backend="torch"
        ).shipped
        is False
    )


@pytest.mark.slow
def test_shipping_shows_in_the_workers_start_as_measured():
    """Under spawn, a worker given a dataset that takes ~0.5 s to ship starts that much later than one given a
    tiny dataset: the start-up split's workers_start_s, against shipping_cost's pickling and loading."""
    cfg = LoaderSweepConfig(budget_s=0.3, timeout_s=60, transforms=False)
    knobs = LoaderKnobs(num_workers=1, prefetch_factor=2)
    big = make_loader_factory(Blob(strings=2_000_000), batch_size=8, multiprocessing_context="spawn")
    small = make_loader_factory(Blob(), batch_size=8, multiprocessing_context="spawn")
    ship = shipping_cost(big, backend="torch")
    each = ship.pickle_s + ship.unpickle_s
    starts = {}
    for name, f in (("small", small), ("big", big), ("big2", big), ("small2", small)):  # in turns
        row = measure_loader_point(f, knobs, config=cfg, cuda=False, stall=False)
        assert row.status == "ok", row.reason
        starts[name] = row.workers_start_s
    extra = (starts["big"] + starts["big2"] - starts["small"] - starts["small2"]) / 2
    print(f"shipping estimated {each:.2f} s; the worker started {extra:.2f} s later ({starts})")
    assert 0.4 * each <= extra <= 2.5 * each + 0.3


def test_spdl_loaders_start_up_is_split_where_it_can_be_and_its_shipping_said_once():
    """SPDL's loader takes no worker_init_fn: the split is the wait to be created, the worker's own part
    whole, and the delivery, and they add up to the first batch; its dataset is pickled once, into shared
    memory, and the finding says so."""
    factory = make_loader_factory(
        Blob(strings=200_000), batch_size=8, multiprocessing_context="forkserver", backend="spdl_pytorch"
    )
    cfg = LoaderSweepConfig(budget_s=0.3, timeout_s=60, transforms=False)
    # one worker: the split's medians are that worker's, whose batch is the first
    row = measure_loader_point(factory, LoaderKnobs(num_workers=1, prefetch_factor=2), config=cfg, cuda=False)
    assert row.status == "ok", row.reason
    assert math.isnan(row.workers_start_s)  # not split where it cannot be timed
    parts = row.workers_created_s + row.worker_unsplit_s + row.first_delivery_s
    # the first batch is timed from building the loader (SPDL pickles the dataset there): the parts, from
    # iter(), come within it and make most of it
    assert 0.5 * row.time_to_first_batch_s <= parts <= row.time_to_first_batch_s + 0.05, row
    ship = shipping_cost(factory, backend="spdl_pytorch")
    assert ship.shipped and ship.pickled_once
    (f,) = worker_cost_findings(
        WorkerCosts.from_json({"shipping": {**ship.to_json(), "mb": 20.0}}), LoaderRow(num_workers=2)
    )
    assert "pickles it once into shared memory" in f.detail and "for each worker in turn" not in f.detail


def _to_json(mem: WorkerMemory | None) -> dict | None:
    """The memory pass as run.json holds it (its keys in the pass's order)."""
    return None if mem is None else mem.to_json()


def _grow(samples: list[dict], **how) -> dict | None:
    """:func:`_growth` on readings written as dicts, as run.json holds its answer."""
    return _to_json(_growth([MemorySample(**s) for s in samples], **how))


def _pass(ds: Dataset, seconds: float) -> dict:
    factory = make_loader_factory(ds, batch_size=1024, shuffle=True, multiprocessing_context="fork")
    ship = shipping_cost(factory, backend="torch")
    knobs = LoaderKnobs(num_workers=1, prefetch_factor=2)
    cfg = LoaderSweepConfig(timeout_s=60, transforms=False)
    cons, errors = _Consumer(factory, knobs), _SpdlErrors()
    errors.attach()
    row = PointDraft.start("x", "torch", knobs, {"persistent_workers": False, "pin_memory": False}, "", [])
    try:
        cons.start()
        _supervise(cons, knobs, cfg, time.perf_counter() + 60, row, errors, _Plan(False, False, 1024, None))
        return _to_json(
            memory_pass(
                cons,
                num_workers=1,
                epoch_batches=math.ceil(len(ds) / 1024),
                seconds=seconds,
                cap_mb=copy_bound_mb(ship.largest, ds),
            )
        )
    finally:
        _teardown(cons, hung=False)
        errors.detach()


def _direct_growth(ds: Dataset) -> float:
    """A forked worker's private memory after its first batch and near the end of the same pass, read
    straight from psutil (one process: a worker forked later shares pages the parent has written since)."""
    loader = DataLoader(ds, batch_size=1024, shuffle=True, num_workers=1, multiprocessing_context="fork")
    it = iter(loader)
    next(it)
    (w,) = it._workers
    p = psutil.Process(w.pid)
    before = after = p.memory_full_info().uss
    for i, _ in enumerate(it, start=1):
        if i == len(loader) - 4:  # the worker is still alive: it has batches left to make
            after = p.memory_full_info().uss
            break
    del it
    return (after - before) / 2**20


@pytest.mark.slow
def test_copy_on_read_growth_over_an_epoch_against_a_direct_reading_and_none_for_numpy():
    """The reference counts a forked worker writes reading a Python list, estimated from a short pass,
    against a direct reading over a whole pass.

    The parent's heap frozen first: a full garbage collection in a worker writes into every tracked
    object the parent holds, and after hundreds of tests (the suite's heap) one in the direct reading's
    worker copied 136 MB more than the same test alone; that is a copy of its own (gc.freeze() before the
    workers start prevents it), which a short pass sees only if the collection falls within it."""
    import gc

    n = 600_000
    listed = Index(n, as_numpy=False)
    gc.collect()
    gc.freeze()
    try:
        mem = _pass(listed, seconds=1.0)
        direct = _direct_growth(listed)
    finally:
        gc.unfreeze()
    print(f"epoch growth estimated {mem['epoch_growth_mb']:.0f} MB, read directly {direct:.0f} MB")
    assert mem["epoch_growth_mb"] == pytest.approx(direct, rel=0.30)
    costs = worker_costs_summary(
        RunMeta.from_json({"worker_costs": {"memory": {"num_workers": 1, **mem}, "available_mb": 1e6}}), []
    )
    assert any(f.title.startswith("Each worker's memory grows") for f in worker_cost_findings(costs, None))
    # 2 s, the default pass: a numpy worker's memory moves in rare steps (an arena taken), and the median of
    # the growth between readings needs enough readings to step over them
    flat = _pass(Index(n, as_numpy=True), seconds=2.0)
    assert abs(flat["epoch_growth_mb"]) < 10
    costs = worker_costs_summary(
        RunMeta.from_json({"worker_costs": {"memory": {"num_workers": 1, **flat}, "available_mb": 1e6}}), []
    )
    assert not worker_cost_findings(costs, None)


def test_the_largest_container_is_named_with_its_size():
    got = largest_container(Index(10_000, as_numpy=False))
    assert (got.attr, got.items, got.item, got.python_objects) == ("index", 10_000, "tuple", True)
    assert 1.0 < got.objects_mb < 3.0  # 10k tuples of an int, a float and a short str: ~170 bytes each
    assert largest_container(Index(10_000, as_numpy=True)).python_objects is False
    # the index bounds what a worker can copy; numpy arrays are not Python objects a read copies
    assert copy_bound_mb(got, Index(10_000, as_numpy=False)) == got.objects_mb
    assert copy_bound_mb(largest_container(Index(10_000, as_numpy=True)), Index(10_000, as_numpy=True)) is None


class _Fake(Dataset):
    """FakeData's shape: samples made from the index, and a small tuple as the largest container."""

    def __init__(self) -> None:
        self.size, self.image_size = 50_000, (3, 224, 224)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        return i


def test_a_container_smaller_than_the_dataset_bounds_nothing():
    """pytorch/examples' ImageNet --dummy (FakeData): its 3-int image_size capped an epoch's growth at
    what the pass had seen, 4 MB, where nothing bounds what its workers allocate."""
    fake = _Fake()
    got = largest_container(fake)
    assert (got.attr, got.items) == ("image_size", 3)
    assert copy_bound_mb(got, fake) is None


def test_findings_fire_past_their_thresholds_only():
    ship = {"shipped": True, "start_method": "forkserver", "mb": 86.0, "pickle_s": 0.59, "unpickle_s": 0.17}
    ship["largest"] = {"attr": "paths", "items": 1_500_000, "container": "list", "item": "str", "python_objects": True}
    found = worker_cost_findings(
        WorkerCosts.from_json({"shipping": ship}), LoaderRow(num_workers=4, persistent_workers=False)
    )
    (f,) = found
    assert f.title == "Each worker receives a 86 MB copy of your dataset: at least 0.76 s of its start"
    assert "1,500,000 strs in its list `paths`" in f.detail and "persistent_workers=True would pay it once" in f.detail
    assert not worker_cost_findings(
        WorkerCosts.from_json({"shipping": {**ship, "mb": 2.0, "pickle_s": 0.01, "unpickle_s": 0.01}}), None
    )
    assert not worker_cost_findings(WorkerCosts.from_json({"shipping": {**ship, "shipped": False}}), None)
    mem = {"num_workers": 4, "growth_mb_per_batch": 2.0, "epoch_growth_mb": 500.0, "epoch_growth_mb_low": 450.0}
    mem |= {
        "batches_per_worker": 30,
        "epoch_batches_per_worker": 300,
        "extrapolated": True,
        "start_mb": 50,
        "end_mb": 110,
    }
    costs = worker_costs_summary(RunMeta.from_json({"worker_costs": {"memory": mem, "available_mb": 1500.0}}), [])
    (g,) = worker_cost_findings(costs, None)
    assert g.severity == "high" and "would take ~2,000 MB more, over the 1,500 MB available" in g.detail


def test_the_verdict_states_what_the_pick_does_not_see():
    """A growth the pick's workers would not fit, and a dataset shipped again at every epoch, are said beside
    the pick with their numbers; nothing where neither holds."""
    from stagebench.analysis._worker_costs import beside_the_pick

    mem = {"num_workers": 4, "epoch_growth_mb": 500.0, "all_workers_mb": 2000.0, "fits": False}
    said = beside_the_pick(WorkerCosts.from_json({"memory": mem, "available_mb": 1500.0}), LoaderRow(num_workers=4))
    assert said == (
        "; memory: each of its 4 workers grows ~500 MB over an epoch, ~2,000 MB together against 1,500 MB "
        "available (at most 3 such workers fit)"
    )
    ship = {"shipped": True, "mb": 79.0, "pickle_s": 0.6, "unpickle_s": 0.2}
    assert "each epoch starts its 2 workers anew" in beside_the_pick(
        WorkerCosts.from_json({"shipping": ship}), LoaderRow(num_workers=2)
    )
    assert "each epoch starts its worker anew" in beside_the_pick(
        WorkerCosts.from_json({"shipping": ship}), LoaderRow(num_workers=1)
    )
    assert (
        beside_the_pick(WorkerCosts.from_json({"shipping": ship}), LoaderRow(num_workers=2, persistent_workers=True))
        == ""
    )
    assert (
        beside_the_pick(
            WorkerCosts.from_json({"memory": {**mem, "fits": True}, "available_mb": 9e3}), LoaderRow(num_workers=4)
        )
        == ""
    )


@pytest.mark.slow
@pytest.mark.parametrize("epoch_stall", [True, False])
def test_a_sweep_reads_each_workers_memory_at_its_pick(tmp_path, epoch_stall):
    """The memory pass rides on the epoch-stall point at the pick (no workers started for it alone); without
    a stall point it runs a pass of its own. Either way summary.json says what it read, at the pick."""
    import json

    import stagebench

    cfg = LoaderSweepConfig(
        num_workers=(1,), budget_s=0.3, transforms=False, epoch_stall=epoch_stall, memory_pass_s=0.6
    )
    s = stagebench.sweep_dataset(
        Index(200_000, as_numpy=False),
        run_dir=tmp_path / "run",
        config=cfg,
        batch_size=256,
        shuffle=True,
        multiprocessing_context="fork",
    )
    if s["recommended"]["num_workers"] == 0:
        # The loop does nothing between batches, so one worker is at best as fast as none: where the runs
        # in turns show none as fast and cheaper (seen on a loaded host), there is no worker to read.
        assert "memory" not in s["worker_costs"]
        pytest.skip("the pick has no workers: no worker memory to read")
    mem = s["worker_costs"]["memory"]
    assert mem["num_workers"] == 1 and len(mem["samples"]) >= 3
    assert s["worker_costs"]["shipping"]["shipped"] is False  # fork: nothing shipped, and said so
    if os.path.isdir("/dev/shm"):  # a batch of 256 x 2 float64: 4 KiB, and 2 of them in flight at 1 worker
        shm = s["worker_costs"]["shm"]
        assert shm["batch_mb"] == 4096 / 2**20 and shm["batches_in_flight"] == 2
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["worker_costs"]["memory"]["seconds"] >= 0.6
    phases = pd.read_csv(tmp_path / "run" / "results.csv")["search_phase"].tolist()
    assert ("epoch_stall" in phases) is epoch_stall


def test_batches_in_flight_are_set_against_dev_shm():
    """num_workers x prefetch_factor batches of a known size against /dev/shm's free space: a finding past
    half of it, high and said beside the pick where they do not fit; none for small batches."""
    from stagebench.analysis._worker_costs import beside_the_pick
    from stagebench.loader._costs import shm_headroom

    shm = shm_headroom(16.0, 4, 2)
    if shm is None:
        pytest.skip("no /dev/shm here")
    assert shm.batches_in_flight == 8 and shm.in_flight_mb == 128.0 and shm.free_mb > 0
    shm = shm.to_json()
    assert not worker_cost_findings(WorkerCosts.from_json({"shm": {**shm, "free_mb": 1000.0}}), None)
    (f,) = worker_cost_findings(WorkerCosts.from_json({"shm": {**shm, "free_mb": 200.0}}), None)
    assert f.severity == "medium" and f.title.startswith("The batches in flight take 64%")
    (g,) = worker_cost_findings(WorkerCosts.from_json({"shm": {**shm, "free_mb": 64.0}}), None)
    assert g.severity == "high" and "more than the 64 MB free" in g.title and "--shm-size" in g.detail
    said = beside_the_pick(WorkerCosts.from_json({"shm": {**shm, "free_mb": 64.0}}), LoaderRow(num_workers=4))
    assert said == "; shared memory: its 8 batches in flight need ~128 MB, 64 MB free in /dev/shm"
    assert shm_headroom(float("nan"), 4, 2) is None and shm_headroom(16.0, 0, 2) is None


def test_a_failure_measuring_worker_costs_loses_nothing_of_the_sweep(tmp_path, monkeypatch):
    """What each worker costs is measured beside the sweep: where it fails, the sweep's rows, summary and
    verdict stand, and a warning says what was not measured and why."""
    import stagebench
    from stagebench.loader import _search

    def broken(*a, **k):
        raise RuntimeError("no /proc here")

    monkeypatch.setattr(_search, "shipping_cost", broken)
    cfg = LoaderSweepConfig(num_workers=(0,), budget_s=0.3, transforms=False)
    s = stagebench.sweep_dataset(Blob(), run_dir=tmp_path / "run", config=cfg, batch_size=8)
    assert s["recommended"]["num_workers"] == 0
    assert any("what each worker costs was not measured: RuntimeError: no /proc here" in w for w in s["warnings"])
    assert (tmp_path / "run" / "report.html").exists()


def test_a_pass_of_a_few_batches_a_worker_is_not_extrapolated_to_the_epoch():
    """FakeData's 224x224 images: 3 batches a worker in the 2 s pass, extrapolated to 10,009, read an
    epoch's growth of -127 GB to +184 GB. Under 10 batches a worker the growth per batch stands alone."""
    from stagebench.loader._costs import MIN_BATCHES

    def samples(batches_each: int) -> list[dict]:
        return [
            {"t": 0.25 * i, "uss_mb": {1: 40.0 + 2 * i, 2: 41.0 + 2 * i}, "batches": {1: i, 2: i}}
            for i in range(batches_each + 1)
        ]

    few = _grow(samples(3), num_workers=2, epoch_batches=20_000, cap_mb=None)
    assert few["too_few_batches"] and "epoch_growth_mb" not in few
    assert few["growth_mb_per_batch"] == pytest.approx(2.0)
    enough = _grow(samples(MIN_BATCHES), num_workers=2, epoch_batches=20_000, cap_mb=None)
    assert "too_few_batches" not in enough and enough["epoch_growth_mb"] == pytest.approx(2.0 * 10_000)
    costs = worker_costs_summary(
        RunMeta.from_json({"worker_costs": {"memory": {"num_workers": 2, **few}, "available_mb": 1e6}}), []
    )
    assert not worker_cost_findings(costs, None)


class _Busy:
    """A stand-in warm consumer: two "workers" (this process), each making ``per_read`` batches between
    two readings of its events (a reading of the pass reads them once)."""

    def __init__(self, per_read: int) -> None:
        self.per_read = per_read
        self.made = 0
        self.finished = False

    def worker_pids(self) -> list[int]:
        return [os.getpid()]

    @property
    def events(self) -> list:
        from stagebench.loader._window import _Event

        self.made += self.per_read
        return [_Event(t=0.0, epoch=0, pid=os.getpid(), n=8, threads=1)] * self.made


def test_a_pass_ends_once_each_worker_made_its_share_of_the_epoch():
    """A small epoch is read whole well within the budget: the pass ends there (at MIN_READINGS
    readings), not at ``seconds``; a large one runs its ``seconds`` and extrapolates."""
    from stagebench.loader._costs import MIN_BATCHES, MIN_READINGS

    t0 = time.perf_counter()
    small = _to_json(memory_pass(_Busy(MIN_BATCHES), num_workers=1, epoch_batches=8, seconds=30.0, interval_s=0.01))
    assert time.perf_counter() - t0 < 10.0
    assert small is not None and len(small["samples"]) == MIN_READINGS
    assert small["extrapolated"] is False
    # the epoch's share not made within the pass: it runs on to ``seconds``
    t0 = time.perf_counter()
    large = _to_json(memory_pass(_Busy(MIN_BATCHES), num_workers=1, epoch_batches=20_000, seconds=0.3, interval_s=0.01))
    assert time.perf_counter() - t0 >= 0.3 and large is not None and len(large["samples"]) > MIN_READINGS
    assert large["batches_per_worker"] < large["epoch_batches_per_worker"]


def test_a_pass_shorter_than_its_readings_runs_on_until_it_has_them():
    """A pass whose ``seconds`` end before MIN_READINGS readings (a short ``memory_pass_s`` on a loaded host,
    whose readings stretch) still reads growth: three readings gave two growths and no answer."""
    from stagebench.loader._costs import MIN_READINGS

    got = _to_json(memory_pass(_Busy(1), num_workers=1, epoch_batches=20_000, seconds=0.0, interval_s=0.01))
    assert got is not None and len(got["samples"]) == MIN_READINGS
    assert got["batches_per_worker"] > 0


# pytorch/examples' ImageNet --dummy, -b 16 -j 2: each worker's readings over the 2 s memory pass
_IMAGENET_PASS = [
    (0.04, (23.14, 23.02), (1, 1)),
    (0.34, (23.19, 23.65), (5, 5)),
    (0.64, (23.78, 24.84), (8, 8)),
    (0.94, (26.67, 24.87), (12, 12)),
    (1.24, (27.34, 24.96), (16, 15)),
    (1.52, (36.56, 24.98), (20, 19)),
    (1.82, (27.38, 24.99), (23, 22)),
    (2.12, (27.40, 26.16), (27, 26)),
]


def test_growth_that_the_pass_does_not_sustain_is_not_extrapolated_to_the_epoch():
    """The ImageNet pass above read 0.09 MB a batch and said ~3,753 MB over an epoch (medium): its second
    half shows no growth beyond noise, so the epoch's growth is what the pass saw, said to have levelled off. Steady growth still extrapolates."""

    samples = [
        {"t": t, "uss_mb": dict(zip((1, 2), mb)), "batches": dict(zip((1, 2), made))} for t, mb, made in _IMAGENET_PASS
    ]
    got = _grow(samples, num_workers=2, epoch_batches=80_073, cap_mb=None)
    assert got["stopped_growing"] and not got["extrapolated"]
    assert got["epoch_growth_mb"] == pytest.approx(26.78 - 23.08, abs=0.01)  # what the pass saw, not ~3,753 MB
    costs = worker_costs_summary(
        RunMeta.from_json({"worker_costs": {"memory": {"num_workers": 2, **got}, "available_mb": 1e6}}), []
    )
    assert not worker_cost_findings(costs, None)
    steady = [
        {"t": s["t"], "uss_mb": {1: 23.0 + 0.5 * i, 2: 23.0 + 0.5 * i}, "batches": s["batches"]}
        for i, s in enumerate(samples)
    ]
    grows = _grow(steady, num_workers=2, epoch_batches=80_073, cap_mb=None)
    assert "stopped_growing" not in grows and grows["epoch_growth_mb"] > 1000


class Locked(Blob):
    """A dataset that cannot be pickled (it holds a lock), as one holding an open file or a client may."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.lock = threading.Lock()


@pytest.mark.slow
def test_a_dataset_that_cannot_be_shipped_is_said_and_the_report_renders(tmp_path):
    """Under spawn a dataset that cannot be pickled cannot reach a worker: the settings with workers fail,
    recorded with their reason; the report renders and says why (it failed on the missing size)."""
    import stagebench

    cfg = LoaderSweepConfig(num_workers=(0, 1), budget_s=0.3, timeout_s=60, transforms=False)
    s = stagebench.sweep_dataset(
        Locked(), run_dir=tmp_path / "run", config=cfg, batch_size=8, multiprocessing_context="spawn"
    )
    assert s["recommended"]["num_workers"] == 0
    assert "pickle" in s["worker_costs"]["shipping"]["error"]
    html = (tmp_path / "run" / "report.html").read_text()
    assert "could not be pickled" in html and "cannot pickle" in html


def test_a_share_smaller_than_min_batches_ends_the_pass_once_made():
    """An epoch of 2 batches a worker is read whole once each worker made 2: MIN_BATCHES bounds an
    extrapolation, and a whole share needs none (the pass ran 10 batches a worker before)."""
    from stagebench.loader._costs import MIN_BATCHES, MIN_READINGS

    got = _to_json(memory_pass(_Busy(1), num_workers=1, epoch_batches=2, seconds=30.0, interval_s=0.01))
    assert got is not None and len(got["samples"]) == MIN_READINGS < MIN_BATCHES
    assert got["extrapolated"] is False


def test_a_copy_that_slows_is_read_as_it_slows_not_as_its_median_rate_stretched():
    """A 600k-tuple list read in shuffled order by a fast worker: its pages are copied by the first of their
    objects read, ~100 MB that saturate within ~60 batches of the 586 a worker makes in an epoch. The
    median rate of a pass that reaches the flat part early, stretched over the epoch, read it at about half;
    a step (an arena taken, flat around it) is not a slowing copy."""

    made = [2, 40, 80, 120, 160, 200]
    curve = [
        {"t": 0.25 * i, "uss_mb": {1: 35 + 100 * (1 - math.exp(-b / 20))}, "batches": {1: b}}
        for i, b in enumerate(made)
    ]
    median_line = (
        statistics.median(
            (b["uss_mb"][1] - a["uss_mb"][1]) / (b["batches"][1] - a["batches"][1]) for a, b in zip(curve, curve[1:])
        )
        * 586
    )
    assert median_line < 0.7 * 100  # what the median rate stretched over the epoch reads
    got = _grow(curve, num_workers=1, epoch_batches=586, cap_mb=103.0)
    assert got["slowing"] and got["extrapolated"] and got["bounded_by_mb"] is None
    grown = curve[-1]["uss_mb"][1] - curve[0]["uss_mb"][1]
    assert got["epoch_growth_mb_low"] == pytest.approx(grown) and got["epoch_growth_mb"] == pytest.approx(100, rel=0.15)
    assert got["epoch_growth_mb"] <= got["epoch_growth_mb_high"] <= 103.0
    (f,) = worker_cost_findings(
        worker_costs_summary(
            RunMeta.from_json({"worker_costs": {"memory": {"num_workers": 1, **got}, "available_mb": 1e6}}), []
        ),
        None,
    )
    assert "the rate of its second half, where the growth had slowed" in f.detail
    # steady growth is a line; a step with flat readings around it is not slowing
    steady = [{**s, "uss_mb": {1: 35 + 0.2 * s["batches"][1]}} for s in curve]
    assert "slowing" not in _grow(steady, num_workers=1, epoch_batches=586, cap_mb=None)
    step = [{**s, "uss_mb": {1: 35.0 + (40.0 if i >= 2 else 0.0)}} for i, s in enumerate(curve)]
    assert "slowing" not in _grow(step, num_workers=1, epoch_batches=586, cap_mb=None)


def test_the_memory_pass_reads_the_workers_of_the_verdicts_pick(tmp_path):
    """A script's num_workers=2 kept against a num_workers=0 its search alone favoured (a 1.5M-record list,
    trivial reads: 0 workers read fastest in some windows, the rounds in turns could not tell): the memory
    pass ran at the search's own pick, 0 workers, so it read none, and the copy-on-read went unsaid.
    Whichever setting the verdict picks, a pick with workers has its workers' memory read."""
    import stagebench
    from stagebench.loader._costs import MIN_BATCHES

    cfg = LoaderSweepConfig(num_workers=(0, 2), budget_s=0.3, timeout_s=60, transforms=False)
    s = stagebench.sweep_dataset(
        Index(200_000, as_numpy=False),
        run_dir=tmp_path / "run",
        config=cfg,
        batch_size=512,
        shuffle=True,
        num_workers=2,  # the script's own setting
        multiprocessing_context="fork",
    )
    pick = s["recommended"]["num_workers"]
    mem = (s.get("worker_costs") or {}).get("memory")
    if pick > 0:
        assert mem is not None and mem["num_workers"] == pick, (pick, mem)
        # on workers that had just started: not on a loader kept open for the rounds in turns, whose
        # workers' early growth (the copy-on-read of a list, most of it) was behind them
        (first, *_) = mem["samples"]
        assert max(first["batches"].values()) <= MIN_BATCHES * pick, first
    else:
        assert mem is None or mem["num_workers"] == 0, mem


def test_under_a_memory_limit_the_finding_says_how_many_workers_fit_and_the_pick_has_no_more():
    """Issue 59: the room a cgroup's limit leaves, over each worker's growth, is how many workers fit; the
    pick (4 workers, the fastest by far) drops to the most that fit, where the host's memory would only
    say it beside the pick."""
    from stagebench.analysis._loader import summarize_loader

    def row(nw: int, sps: float) -> dict:
        return {
            "loader": "x",
            "backend": "torch",
            "num_workers": nw,
            "prefetch_factor": 2 if nw else math.nan,
            "persistent_workers": False,
            "pin_memory": "n/a",
            "status": "ok",
            "reason": "",
            "samples_per_s": sps,
            "samples_per_s_low": sps * 0.99,
            "samples_per_s_high": sps * 1.01,
            "batches_per_s": sps / 4,
            "mem_pss_mb": 300.0 + 50 * nw,
            "mem_main_mb": 300.0,
            "cores_used": 0.5,
            "elapsed_s": 1.0,
            "search_phase": "num_workers",
        }

    rows = [row(0, 100), row(1, 180), row(2, 300), row(4, 600)]
    mem = {"num_workers": 4, "growth_mb_per_batch": 4.0, "epoch_growth_mb": 400.0, "epoch_growth_mb_low": 380.0}
    mem |= {"batches_per_worker": 30, "epoch_batches_per_worker": 300, "extrapolated": True, "start_mb": 50}
    limit = {"limit_mb": 2000.0, "group": "/g", "file": "memory.limit_in_bytes", "used_mb": 1100.0}
    meta = {
        "settings": {"memory_budget_mb": None, "usable_cores": 2},
        "loader": {"backend": "torch"},
        "worker_costs": {"memory": mem, "available_mb": 900.0, "memory_limit": limit},
    }
    s = summarize_loader(rows, meta)
    assert s["worker_costs"]["memory"]["workers_fit"] == 2
    assert s["recommended"]["num_workers"] == 2
    assert "at most 2 workers fit the container's memory limit over an epoch" in s["recommended"]["why"]
    (g,) = [f for f in s["findings"] if f["title"].startswith("Each worker's memory grows")]
    assert (
        "At most 2 such workers fit in the 900 MB the container's memory limit leaves (2,000 MB, "
        "memory.limit_in_bytes of cgroup /g) over an epoch" in g["detail"]
    )
    # the same growth against the host's memory: said, the pick unchanged (as before issue 59)
    host = {**meta, "worker_costs": {"memory": mem, "available_mb": 900.0}}
    s = summarize_loader(rows, host)
    assert s["recommended"]["num_workers"] == 4 and "workers_fit" not in s["worker_costs"]["memory"]


def test_under_a_memory_limit_no_phase_starts_a_setting_predicted_to_pass_the_budget(tmp_path):
    """Issue 59: where a cgroup's limit sets the budget, a setting whose main process and workers, each with
    its growth over an epoch, are predicted past it is not started in any phase (the script's own setting
    included): said in the stops, nothing written; the host's budget keeps its rule (the num_workers
    search alone stops at it, each worker's PSS counted)."""
    from stagebench.loader._search import _Sweep
    from stagebench.runs._results import RowWriter
    from stagebench.runs._schema import LOADER_COLUMNS

    def sweep(words: str) -> _Sweep:
        sw = _Sweep(
            lambda knobs: None,
            name="x",
            backend="torch",
            batch_size=8,
            cfg=LoaderSweepConfig(transforms=False),
            cuda=False,
            writer=RowWriter(tmp_path / f"{len(words)}.csv", LOADER_COLUMNS),
            progress=None,
            budget_mb=1000.0,
            limit_words=words,
            growth_bound_mb=150.0,
        )
        # one worker measured: 300 MB main, 100 MB the worker (PSS); 70 MB of the 400 shared between them
        mem = {"mem_main_mb": 300.0, "mem_workers_mb": 100.0, "mem_pss_mb": 400.0, "mem_uss_mb": 330.0}
        sw.rows.append(normalize_row({"status": "ok", "samples_per_s": 100.0, "num_workers": 1, **mem}))
        return sw

    sw = sweep("700 MB the container's memory limit leaves (1,000 MB, 300 MB used)")
    # as the cgroup charges it: the point's 400 MB, each further worker's private 100 - 70 / 2 MB, and each
    # worker's growth over an epoch
    assert sw.predicted_mb(2) == 400 + 65 + 2 * 150 and sw.over_budget(2) is None
    row = sw.point(LoaderKnobs(num_workers=4, prefetch_factor=2), "user")
    assert row.status == "skipped" and sw.rows[-1].num_workers == 1  # nothing measured, nothing kept
    (stop,) = sw.stops
    assert stop == (
        "num_workers=4, prefetch_factor=2 not started: about 1,195 MB predicted (each worker ~150 MB more over "
        "an epoch, copy-on-read), over the memory budget of 1,000 MB (700 MB the container's memory limit leaves "
        "(1,000 MB, 300 MB used))"
    )
    # once the memory pass has read the growth, it replaces the bound
    sw.memory = WorkerMemory(epoch_growth_mb=20.0)
    assert sw.predicted_mb(4) == 400 + 3 * 65 + 4 * 20 and sw.over_budget(4) is None
    host = sweep("")
    assert host.predicted_mb(4) == 700 and host.over_budget(8) == (
        "about 1,100 MB predicted, over the memory budget of 1,000 MB"
    )

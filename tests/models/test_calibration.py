"""The planner's CPU estimates set by this machine's own runs (calibration.py): the
ratios kept and their median, the estimates they scale, and, with the real draft model,
a session's one-token passes recorded as `plan` then shows them."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from localspec.models import calibration
from localspec.models.hardware import GiB, Gpu, Hardware, Overrides, probe
from localspec.models.memory import Weights
from localspec.models.speed import step_seconds

CPU = Hardware((), 24 * GiB, 22 * GiB, 2, offload=False)
GPU = Hardware((Gpu(0, "GPU", "nvidia", 8 * GiB, 8 * GiB),), 24 * GiB, 22 * GiB, 2, offload=True)
# 1 GB of layers, a 150 MB head: a 1.5B model at Q4_K_M
WEIGHTS = Weights((40_000_000,) * 25, 150_000_000, 150_000_000, 28_672, 151_936, 1536)


@pytest.fixture
def calibrated(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "1")
    return home / "calibration.json"


def test_the_median_of_the_last_ratios_is_kept_per_cpu(calibrated: Path):
    assert calibration.cpu_scale(2) is None  # nothing measured yet
    for ratio in (0.5, 0.4, 9.0, 0.45):
        calibration.record_cpu_ratio(2, ratio)
    assert calibration.cpu_scale(2) == pytest.approx(0.475)  # one loaded run moves it little
    assert calibration.cpu_scale(4) is None  # another core count: not this measurement
    for _ in range(calibration.KEEP):
        calibration.record_cpu_ratio(2, 0.3)
    assert calibration.cpu_scale(2) == pytest.approx(0.3)  # the oldest went
    (ratios,) = json.loads(calibrated.read_text())["cpu"].values()
    assert len(ratios) == calibration.KEEP


def test_an_unreadable_file_or_calibration_off_leaves_the_estimates(
    calibrated: Path, monkeypatch: pytest.MonkeyPatch
):
    calibrated.write_text("{not json")
    assert calibration.cpu_scale(2) is None
    calibration.record_cpu_ratio(2, 0.5)  # starts over
    assert calibration.cpu_scale(2) == 0.5
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "0")
    assert calibration.cpu_scale(2) is None
    calibration.record_cpu_ratio(2, 0.1)
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "1")
    assert calibration.cpu_scale(2) == 0.5


def test_the_scale_sets_the_cpus_part_of_an_estimate_only():
    cpu = step_seconds(WEIGHTS, 0, CPU)
    assert step_seconds(WEIGHTS, 0, replace(CPU, cpu_scale=0.4)) == pytest.approx(0.4 * cpu)
    on_gpu = step_seconds(WEIGHTS, 99, GPU)
    assert step_seconds(WEIGHTS, 99, replace(GPU, cpu_scale=0.4)) == on_gpu  # no CPU part
    half = step_seconds(WEIGHTS, 12, GPU)  # 13 of 25 layers on the CPU
    scaled = step_seconds(WEIGHTS, 12, replace(GPU, cpu_scale=0.4))
    assert on_gpu < scaled < half


def test_probe_takes_the_scale_for_this_cpu_not_for_a_what_if_one(calibrated: Path):
    cores = probe().cores
    calibration.record_cpu_ratio(cores, 0.4)
    assert probe().cpu_scale == 0.4
    assert probe(Overrides(ram=8 * GiB)).cpu_scale == 0.4
    assert probe(Overrides(cores=cores + 6)).cpu_scale == 1.0


@pytest.mark.real
def test_a_cpu_sessions_one_token_passes_set_the_plans_speed(
    calibrated: Path, real_paths: tuple[Path, Path]
):
    """The real draft model decodes 20 tokens one pass each on this CPU; closing its
    session keeps the ratio of their median to the planner's estimate, and `plan`
    scales its CPU estimates by it (and says so). A model run on fewer threads than the
    cores, whose speed is not what the planner estimates, keeps nothing."""
    from localspec.backends.llama import LlamaModel, LoadOptions
    from localspec.calibrate import record_cpu_speed

    def decode_alone(threads: int) -> LlamaModel:
        model = LlamaModel(real_paths[1], LoadOptions(n_ctx=512, n_threads=threads))
        tokens = model.tokenize("def binary_search(items, x):")
        model.evaluate(tokens, 1)
        for _ in range(20):
            tokens.append(1)
            model.evaluate(tokens, 1)
        return model

    cores = probe().cores
    if cores > 1:
        fewer = decode_alone(1)
        record_cpu_speed(fewer)
        fewer.close()
        assert not calibrated.exists()
    model = decode_alone(0)
    record_cpu_speed(model)
    model.close()
    (ratios,) = json.loads(calibrated.read_text())["cpu"].values()
    assert len(ratios) == 1 and 0.05 < ratios[0] < 20, ratios  # measured, whatever the CPU
    assert probe().cpu_scale == ratios[0]
    out = subprocess.run(
        [sys.executable, "-m", "localspec", "plan", "--gpu", "none"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"scaled x{1 / ratios[0]:.2f} by this CPU's own runs" in out, out


def test_autos_timings_are_kept_per_key_over_what_was_kept(calibrated: Path):
    key = "a CPU x2 | target.gguf 123 | repacked"
    assert calibration.recorded_passes(key) is None
    calibration.record_cpu_ratio(2, 0.5)
    times = calibration.PassTimes({1: 0.025, 2: 0.042}, {"draft.gguf 9": (0.007, 0.002)})
    calibration.record_passes(key, times)
    assert calibration.recorded_passes(key) == times
    assert calibration.cpu_scale(2) == 0.5  # the other section kept
    calibration.record_passes(key, calibration.PassTimes({2: 0.040, 4: 0.066}))
    kept = calibration.recorded_passes(key)
    assert kept is not None and kept.verify == {1: 0.025, 2: 0.040, 4: 0.066}
    assert kept.drafts == times.drafts  # a session that timed no draft leaves it
    calibration.record_cpu_ratio(2, 0.3)
    assert calibration.recorded_passes(key) == kept  # and the ratios leave these
    assert calibration.recorded_passes("another CPU | target.gguf 123 | repacked") is None


def test_unreadable_timings_or_calibration_off_start_auto_afresh(
    calibrated: Path, monkeypatch: pytest.MonkeyPatch
):
    key = "a CPU x2 | target.gguf 123 | repacked"
    calibrated.write_text(json.dumps({"passes": {key: {"verify": {"1": "fast"}}}}))
    assert calibration.recorded_passes(key) is None
    calibration.record_passes(key, calibration.PassTimes({1: 0.025, 2: 0.042}))
    assert calibration.recorded_passes(key) == calibration.PassTimes({1: 0.025, 2: 0.042})
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "0")
    assert calibration.recorded_passes(key) is None
    calibration.record_passes(key, calibration.PassTimes({1: 9.0, 2: 9.0}))
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "1")
    assert calibration.recorded_passes(key) == calibration.PassTimes({1: 0.025, 2: 0.042})


@pytest.mark.real
def test_a_new_sessions_auto_starts_from_the_timings_the_last_one_kept(
    calibrated: Path, real_paths: tuple[Path, Path]
):
    """The real pair, `auto`: closing a session keeps T(k) of the sizes its answer timed
    and the draft model's step; the next session's engine (and a slot's, as serve makes
    them) starts from them, so it prices drafts at once instead of timing sizes first."""
    from localspec.backends.llama import LoadOptions
    from localspec.calibrate import draft_id, timings_key
    from localspec.decoding.engine import GenerationConfig
    from localspec.decoding.sampling import SamplingParams
    from localspec.server.worker import Worker
    from localspec.session import SessionConfig, open_session

    load = LoadOptions(n_ctx=1024, n_threads=2)
    config = SessionConfig(str(real_paths[0]), str(real_paths[1]), "auto", load, load)
    first = open_session(config)
    assert first.drafter.verify.seconds == {}  # nothing kept yet: it times as it goes
    prompt = first.render([{"role": "user", "content": "Write a Python quicksort."}])
    list(first.engine.generate(prompt, GenerationConfig(48, SamplingParams(temperature=0))))
    timed = dict(first.drafter.verify.seconds)
    draft_model = first.drafter.model
    if not draft_model.step_s:  # 48 tokens may end before its first try: as if it had
        draft_model.step_s, draft_model.catchup_s = 0.0071, 0.0023
    step = draft_model.step_s
    key, draft = timings_key(first.target), draft_id(first.draft_model)
    first.close()
    assert len(timed) >= 2 and 1 in timed, timed
    kept = calibration.recorded_passes(key)
    assert kept is not None and kept.verify == timed
    assert kept.drafts == {draft: (step, draft_model.catchup_s)}
    second = open_session(config)
    try:
        assert second.drafter.verify.seconds == timed
        assert second.drafter.model.step_s == step
        slot = second.engine_for(second.target, second.draft_model)
        assert slot.drafter.verify.seconds == timed and slot.drafter is not second.drafter
        # a server's slots' engines: what the one that timed the most timed is kept
        worker = Worker(second, max_queue=1, parallel=1)
        worker.start()
        worker.slots[0].engine.drafter.verify.observe(6, 0.125)
        worker.stop()
    finally:
        second.close()
    assert calibration.recorded_passes(key).verify == timed | {6: 0.125}

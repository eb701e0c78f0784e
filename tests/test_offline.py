"""The GPU study without DVC, on the CPU at a tiny size: docs/gpu-node.md's commands run verbatim.

A tiny copy of the project (its `gpu` scale the tiny one) is bundled; each node call
runs on a fresh copy of what a call sends (the files git sends, and the bundle), with
`python3` and no `python` or `dvc` on PATH and `import dvc` failing; the second call
has a stage that fails. Both calls are unpacked, then `gpu-status` is asked.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from node_python import node_python
from test_pipeline import _slice, _tiny_scale

from minbert.model.bert import BertModel
from minbert.offline import parts
from minbert.offline.bundle import SEND_LIMIT, call_size, read_bundle, sent_files
from minbert.offline.calls import NODE_RUN, SMOKE_COMMAND, Rate, cut, node_command
from minbert.offline.node import NODE_PACKAGES
from minbert.offline.plan import resolve_plan, returned, select
from minbert.offline.smoke import CONTROL_TOLERANCE, summary
from minbert.results import read_result

PAGE, SECTION = REPO / "docs" / "gpu-node.md", "## The commands"
FAILING = "data/settings/multitask/best-round-robin.json"  # the stage of call 2 made to fail
STUDY_OPS = Path("bench", "results", "gpu_study_ops.json")


def readme_commands() -> list[str]:
    """The commands of docs/gpu-node.md, continuation lines joined."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [re.sub(r"\s+", " ", line).strip() for line in lines if line.strip() and not line.startswith("#")]


def node_calls() -> list[str]:
    """The page's study calls (the smoke call apart)."""
    return [c for c in readme_commands() if "offline-run" in c and "--smoke" not in c]


def smoke_command() -> str:
    (smoke,) = [c for c in readme_commands() if "offline-run" in c and "--smoke" in c]
    return smoke


def here_command(name: str) -> str:
    """The page's command ``minbert <name> ...`` of the DVC machine."""
    (command,) = [c for c in readme_commands() if c.split()[:2] == ["minbert", name]]
    return command


def tiny_gpu_scale(cpu: dict) -> dict:
    """The page's `scale=gpu` at a tiny size: the tiny cpu scale, one epoch, no head
    warm-up (as the gpu scale)."""
    gpu = copy.deepcopy(cpu)
    gpu["sentiment"]["epochs"] = {"last-layer": 1, "full": 1}
    gpu["multitask"].update(epochs=1, batch_size={"sst": 16, "quora": 16, "sts": 16})
    gpu["multitask"]["head_warmup"]["epochs"] = 0
    return gpu


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _here(root: Path, command: str) -> subprocess.CompletedProcess:
    """A command of the DVC machine, `minbert` run from the project's sources."""
    assert command.startswith("minbert "), command
    args = [sys.executable, "-m", "minbert", *shlex.split(command)[1:]]
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def project(tmp_path_factory, shared_data, tiny_checkpoint) -> Path:
    root = tmp_path_factory.mktemp("offline") / "project"
    root.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for name in ("stages", "src", "reference"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _slice(shared_data, root.parent / "slice", 48)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params.update(checkpoint=str(tiny_checkpoint), device="cpu")
    params["data"].update(source=str(root.parent / "slice"), verify_checksums=False, skip_ids={})
    _tiny_scale(params)
    params["scales"]["gpu"] = tiny_gpu_scale(params["scales"]["cpu"])
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "bench" / "results").mkdir(parents=True)  # the study's operators, for gpu-plan
    shutil.copy(REPO / STUDY_OPS, root / STUDY_OPS)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "project")
    return root


def imitation_node(base: Path, packages: list[str], without: tuple[str, ...] = ()) -> dict:
    """The environment of an imitation node whose Python holds only ``packages`` (and what
    they require, less ``without``; no DVC, nothing of the test tools): `python3` only on
    PATH, and a stage that fails (exit 3), hangs or raises when its command names FAIL_ARG,
    HANG_ARG or RAISE_ARG."""
    (base / "bin").mkdir(parents=True)
    interpreter = node_python(base / "python", packages, without)
    python3 = base / "bin" / "python3"
    python3.write_text(f'#!/bin/sh\nPYTHONPATH="{base / "shim"}:$PYTHONPATH" exec "{interpreter}" "$@"\n')
    python3.chmod(python3.stat().st_mode | stat.S_IEXEC)
    (base / "shim").mkdir()
    (base / "shim" / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "if os.environ.get('FAIL_ARG') in sys.argv: os._exit(3)\n"
        "if os.environ.get('HANG_ARG') in sys.argv: time.sleep(600)\n"
        "class _Raise:  # a bug in the stage's code: it ends in a traceback\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'minbert.pipeline.multitask': raise RuntimeError('made to fail')\n"
        "if os.environ.get('RAISE_ARG') in sys.argv: sys.meta_path.insert(0, _Raise())\n"
    )
    return {"PATH": str(base / "bin"), "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def node_env(tmp_path_factory) -> dict:
    """The imitation node: exactly the packages docs/gpu-node.md lists."""
    return imitation_node(tmp_path_factory.mktemp("node-env"), list(NODE_PACKAGES.values()))


def _node(project: Path, node: Path) -> Path:
    """A fresh node holding what a call sends: the files git sends, and the bundle."""
    for path in sent_files(project):
        target = node / path.relative_to(project)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    shutil.copytree(project / "offline-bundle", node / "offline-bundle")
    return node


def _on_node(
    node: Path, out: Path, command: str, env: dict, one_core: bool = False, **extra
) -> subprocess.CompletedProcess:
    """A node command of the page, verbatim, in the node's repository root; ``$OUT`` comes
    back. ``one_core``: the node has one core (every lane one thread, however many lanes)."""
    out.mkdir(parents=True)
    return subprocess.run(
        ["/bin/bash", "-c", command],
        cwd=node,
        env={**env, "OUT": str(out), **extra},
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=(lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if one_core else None,
    )


def one_lane(command: str) -> str:
    return re.sub(r"--lanes \d+", "--lanes 1", command)


# A second call, one of whose stages has a bug (RAISE_ARG): its traceback comes back.
SECOND_CALL = f"{NODE_RUN} --deadline 9 " + " ".join(
    f"--stage multitask@{c}" for c in ("best-round-robin", "best-adamw", "best-no-smart")
)


@pytest.fixture(scope="module")
def study(project, node_env, tmp_path_factory) -> dict:
    """The page's bundle, smoke call and plan; its one call for the whole study in its
    lanes and again in one lane (on one core: one thread a stage either way), and a
    second call with a stage that raises; the first and the second unpacked."""
    work = tmp_path_factory.mktemp("study")
    made = _here(project, here_command("bundle"))
    assert made.returncode == 0, made.stdout + made.stderr
    assert not _git(project, "status", "--porcelain"), "the bundle is ignored by git"
    smoke = _on_node(_node(project, work / "node0"), work / "gpu-out", smoke_command(), node_env)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    planned = _here(project, here_command("gpu-plan").replace("gpu-out", str(work / "gpu-out")))
    assert planned.returncode == 0, planned.stdout + planned.stderr
    (call,) = node_calls()
    seconds = {}
    for out, command in (("out1", call), ("out1-one-lane", one_lane(call))):
        began = time.monotonic()
        ran = _on_node(_node(project, work / out.replace("out", "node")), work / out, command, node_env, True)
        seconds[out] = time.monotonic() - began
        assert ran.returncode == 0, ran.stdout + ran.stderr
    second = _on_node(_node(project, work / "node2"), work / "out2", SECOND_CALL, node_env, RAISE_ARG=FAILING)
    assert second.returncode == 1, second.stdout + second.stderr
    for out in ("out1", "out2"):
        unpacked = _here(project, here_command("gpu-unpack").replace("gpu-out", str(work / out)))
        assert unpacked.returncode == 0, unpacked.stdout + unpacked.stderr
    return {
        "work": work,
        "status": here_command("gpu-status"),
        "bundle": " ".join((made.stdout + made.stderr).split()),
        "plan": planned.stdout,
        "seconds": seconds,
        "second": second.stdout + second.stderr,
    }


@pytest.mark.slow
def test_the_readme_calls_cover_the_plan_once(project):
    plan = resolve_plan(project, ["scale=gpu"])
    named = [re.findall(r"--stage (\S+)", c) for c in node_calls()]
    ran = [select(plan, names) for names in named]
    results = [s["name"] for s in plan["stages"] if returned(s)]
    assert sorted(s for call in ran for s in call if s in results) == sorted(results)


def test_the_readme_calls_are_gpu_plans_at_the_assumed_rate():
    stages = json.loads((REPO / STUDY_OPS).read_text())["results"]["stages"]
    plan = cut(stages, Rate.assumed())
    assert not plan.too_long and plan.lanes > 1
    assert node_calls() == [node_command(c) for period in plan.periods for c in period]
    assert smoke_command() == SMOKE_COMMAND


@pytest.mark.slow
def test_the_smoke_call_checks_the_gpu_path_and_measures_it(study):
    smoke = json.loads((study["work"] / "gpu-out" / "smoke.json").read_text())
    assert smoke["passed"] and not smoke["problems"]
    assert sorted(p.name for p in (study["work"] / "gpu-out").iterdir()) == ["smoke.json"]  # no stage result
    best, baseline = smoke["stages"]["multitask@best"], smoke["stages"]["multitask@baseline"]
    assert best["smart_control"] == 0.0  # its history, at 4 decimals; in-process, up to rounding:
    assert best["measured"]["smart_control"] <= CONTROL_TOLERANCE
    assert baseline["smart_control"] is None and best["losses_finite"] and baseline["losses_finite"]
    for stage in (best, baseline):
        step = stage["measured"]["step"]
        assert stage["seconds"] > 0 and stage["steps"] > 0 and step["seconds"] > 0
        assert step["us_per_op"] == pytest.approx(1e6 * step["seconds"] / step["ops"])
    # A PCGrad + SMART step dispatches several times a round-robin step's operators.
    assert best["measured"]["step"]["ops"] > 3 * baseline["measured"]["step"]["ops"]
    assert smoke["call_start_seconds"] > 0 and smoke["seconds"] < 6 * 60
    assert "the smoke call on cpu" in study["plan"] and "period 1:" in study["plan"]


def test_a_smoke_stage_stopped_at_the_deadline_is_reported_not_a_crash():
    # As an H100 call's smoke.json had it: `best` measured, `baseline` stopped at the
    # --deadline (no seconds, nothing measured); printing it once raised a TypeError.
    step = {"seconds": 0.297, "ops": 13542.0, "us_per_op": 21.9}
    smoke = {
        "stages": {
            "multitask@best": {"kind": "PCGrad + SMART", "seconds": 21.5, "measured": {"step": step}},
            "multitask@baseline": {"kind": "round-robin", "seconds": None},
        },
        "seconds": 65.0,
        "problems": ["multitask@baseline: stopped at the --deadline"],
        "passed": False,
    }
    lines = summary(smoke)
    assert lines[0] == "  multitask@best (PCGrad + SMART): 21.5 s, a step 297 ms (21.9 us per operator)"
    assert lines[1] == "  multitask@baseline (round-robin): did not finish"
    assert lines[2:] == ["smoke.json: FAILED in 65 s", "  multitask@baseline: stopped at the --deadline"]


@pytest.mark.slow
def test_the_bundle_holds_dvcs_plan_and_an_fp16_checkpoint(project, study, tiny_checkpoint):
    described = read_bundle(project / "offline-bundle")
    assert described["commit"] == _git(project, "rev-parse", "HEAD").strip()
    plan = described["plan"]
    assert plan["overrides"] == ["scale=gpu", "mlm.pretrain=[continue]"]
    assert plan["params"]["scale"] == "gpu" and plan["params"]["mlm"]["pretrain"] == ["continue"]
    assert "report" not in [s["name"] for s in plan["stages"]]
    best = next(s for s in plan["stages"] if s["name"] == "multitask@best")
    assert "src/minbert/train/pcgrad.py" in best["sources"]
    assert "data/settings/multitask/best.json" in best["inputs"] and "features" in best["needs"]
    assert described["checkpoint"]["copy"] == "fp16" and described["checkpoint"]["name"] == str(
        tiny_checkpoint
    )
    original = BertModel.from_pretrained(tiny_checkpoint)
    copied = BertModel.from_pretrained(project / "offline-bundle" / "checkpoint")
    for (name, a), b in zip(original.state_dict().items(), copied.state_dict().values()):
        assert b.dtype == torch.float32 and torch.allclose(a, b, atol=1e-3, rtol=1e-3), name
    assert "MiB" in study["bundle"] and "a call sends" in study["bundle"]
    # The call plan: lanes and every study stage's estimate, as `minbert gpu-plan` cuts
    # them at the rate of the bundle's time (assumed: the project had no call yet).
    results = [s["name"] for s in plan["stages"] if returned(s)]
    assert sorted(described["call_plan"]["estimates"]) == sorted(results)
    stages = json.loads((REPO / STUDY_OPS).read_text())["results"]["stages"]
    assert described["call_plan"]["lanes"] == cut(stages, Rate.assumed()).lanes
    best = Rate.assumed().estimate(stages["multitask@best"])
    assert described["call_plan"]["estimates"]["multitask@best"] == vars(best)


@pytest.mark.slow
def test_each_call_brings_back_what_it_finished(study):
    for out in ("out1", "out2"):
        files = sorted((study["work"] / out).iterdir())
        assert len(files) <= parts.MAX_FILES and all(f.stat().st_size <= parts.MAX_BYTES for f in files)
    index, files = parts.read(study["work"] / "out2" / parts.INDEX_FILE)
    assert [f["stage"] for f in index["failed"]] == ["multitask@best-round-robin"]
    assert index["failed"][0]["reason"] == "exit status 1"
    finished = {s["stage"] for s in index["stages"]}
    assert finished == {
        "prepare", "resolve", "tokenize", "features", "multitask@best-adamw", "multitask@best-no-smart"
    }  # fmt: skip
    assert not any(f.startswith(("data/", "models/")) for f in files)
    assert index["torch"] == torch.__version__


@pytest.mark.slow
def test_a_failed_stage_brings_back_its_traceback_and_every_stage_its_log(project, study):
    index, files = parts.read(study["work"] / "out2" / parts.INDEX_FILE)
    (failed,) = index["failed"]
    assert failed["traceback"].startswith("Traceback (most recent call last):")
    assert failed["traceback"].endswith("RuntimeError: made to fail")
    assert "RuntimeError: made to fail" in study["second"]  # printed on the node too
    assert "made to fail" in files[failed["log"]].decode()
    for stage in index["stages"]:
        assert stage["log"] in files, stage["stage"]
    # Unpacked: the failure's log and traceback are kept beside the results.
    gpu = project / "metrics" / "gpu"
    provenance = json.loads((gpu / "provenance.json").read_text())
    failure = provenance["failures"]["multitask@best-round-robin"]
    assert failure["traceback"] == failed["traceback"] and (gpu / failure["log"]).is_file()
    assert (gpu / provenance["stages"]["multitask@best"]["log"]).is_file()


def _without_how_it_ran(name: str, data: bytes) -> bytes:
    """A returned file less the runner's note of how its stage ran (seconds, lanes)."""
    if not name.endswith("-run.json") and not name.endswith("zero-shot-run.json"):
        return data
    record = json.loads(data)
    del record["offline_run"]["ran"]
    return json.dumps(record).encode()


@pytest.mark.slow
def test_lanes_return_what_one_lane_returns(study):
    lanes, in_lanes = parts.read(study["work"] / "out1" / parts.INDEX_FILE)
    one, in_one = parts.read(study["work"] / "out1-one-lane" / parts.INDEX_FILE)
    assert lanes["lanes"] > 1 and one["lanes"] == 1 and lanes["threads"] == one["threads"] == 1
    results = {n for n in in_one if not n.startswith("logs/")}
    assert results == {n for n in in_lanes if not n.startswith("logs/")} and len(results) > 50
    for name in sorted(results):
        assert _without_how_it_ran(name, in_lanes[name]) == _without_how_it_ran(name, in_one[name]), name
    # Stages shared the GPU (here the core) in lanes, never in one lane; each record says so.
    shared = {s["stage"]: s["shared_with"] for s in lanes["stages"]}
    assert any(shared.values()) and not any(s["shared_with"] for s in one["stages"])
    record = json.loads(in_lanes["metrics/multitask/best-run.json"])
    ran = record["offline_run"]["ran"]
    assert ran["lanes"] == lanes["lanes"] and ran["shared_with"] == shared["multitask@best"]
    assert ran["seconds"] > 0 and ran["threads"] == 1 and ran["peak_device_memory_bytes"] is None


@pytest.mark.slow
def test_unpacked_calls_merge_and_name_no_node_path(project, study, tiny_checkpoint):
    gpu = project / "metrics" / "gpu"
    provenance = json.loads((gpu / "provenance.json").read_text())
    assert len(provenance["calls"]) == 2
    assert {"multitask@best", "multitask@baseline", "zero-shot"} <= set(provenance["stages"])
    assert list(provenance["failures"]) == ["multitask@best-round-robin"]
    record = read_result(gpu / "metrics" / "multitask" / "best.json")
    assert record["checkpoint"]["name"] == str(tiny_checkpoint)
    assert record["offline_run"]["checkpoint_copy"] == "fp16"
    leaks = ("node1", "node2", "offline-bundle")
    for path in gpu.rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            assert not [leak for leak in leaks if leak in text], path


@pytest.mark.slow
def test_a_third_call_sends_what_the_node_takes(project, study):
    size = call_size(project, project / "offline-bundle")
    assert size["total"] <= SEND_LIMIT
    assert not [p for p in sent_files(project) if "metrics/gpu" in p.as_posix()], "results are not sent"


@pytest.mark.slow
def test_gpu_status_needs_no_course_data_and_names_what_changed(project, study, tmp_path):
    # Every stage came back from the whole-study call; the second call's failure is newer
    # than `best-round-robin`'s result, which stands (and is current).
    data = Path(yaml.safe_load((project / "params.yaml").read_text())["data"]["source"])
    hidden = tmp_path / "elsewhere"
    data.rename(hidden)  # no course files: the status resolves from the call's manifest
    try:
        done = _here(project, study["status"])
    finally:
        hidden.rename(data)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert set(lines.values()) == {"current"} and "mlm@continue" in lines and "zero-shot" in lines
    params = project / "params.yaml"
    saved = params.read_text()
    try:
        changed = yaml.safe_load(saved)
        changed["sentiment"]["runs"]["sst-full"]["lr"] = 2e-5
        params.write_text(yaml.safe_dump(changed, sort_keys=False))
        stale = dict(line.split(": ", 1) for line in _here(project, study["status"]).stdout.splitlines())
        assert stale["sentiment@sst-full"] == "stale: data/settings/sentiment/sst-full.json changed"
        assert stale["sentiment@sst-last-layer"] == "current" and stale["multitask@best"] == "current"
    finally:
        params.write_text(saved)
    pcgrad = project / "src" / "minbert" / "train" / "pcgrad.py"
    text = pcgrad.read_text()
    try:
        pcgrad.write_text(text + "\n# changed\n")
        stale = dict(line.split(": ", 1) for line in _here(project, study["status"]).stdout.splitlines())
        assert stale["multitask@best"] == "stale: src/minbert/train/pcgrad.py changed"
        assert stale["zero-shot"] == "current"
    finally:
        pcgrad.write_text(text)


@pytest.mark.slow
def test_the_node_refuses_other_code_and_stops_at_the_deadline(project, study, node_env, tmp_path):
    command = 'PYTHONPATH=src python3 -m minbert offline-run offline-bundle --out "$OUT" --stage zero-shot'
    node = _node(project, tmp_path / "changed")
    (node / "src" / "minbert" / "evaluate" / "zero_shot.py").write_text("# other code\n")
    done = _on_node(node, tmp_path / "o", command, node_env)
    assert done.returncode == 1 and "differ from the plan's" in done.stdout + done.stderr
    slow = _node(project, tmp_path / "slow")
    stopped = _on_node(slow, tmp_path / "out", command + " --deadline 0.1", node_env, HANG_ARG="params.yaml")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    index, _ = parts.read(tmp_path / "out" / parts.INDEX_FILE)
    assert [(s["stage"], s["reason"]) for s in index["failed"]] == [("prepare", "stopped at the --deadline")]
    # Every stage needs prepare (resolve reads its manifest for the Quora batch); the
    # zero-shot row's SST probe reads the features.
    blocked = {name: "needs prepare, which did not finish" for name in ("resolve", "tokenize")}
    blocked |= {
        "features": "needs resolve, which did not finish",
        "zero-shot": "needs features, which did not finish",
    }
    assert {s["stage"]: s["reason"] for s in index["not_run"]} == blocked
    spent = _on_node(slow, tmp_path / "spent", command + " --deadline 0", node_env)
    assert spent.returncode == 1, spent.stdout + spent.stderr
    index, _ = parts.read(tmp_path / "spent" / parts.INDEX_FILE)
    assert index["failed"] == [] and index["stages"] == []
    assert {s["stage"]: s["reason"] for s in index["not_run"]} == {
        "prepare": "the --deadline was reached",
        **blocked,
    }


@pytest.mark.slow
def test_a_stage_whose_worst_estimate_exceeds_the_time_left_is_not_started(
    project, study, node_env, tmp_path
):
    # `best` at the assumed rate: 140 worst seconds alone, 210 sharing the GPU; 180 in all.
    command = f"{NODE_RUN} --deadline 3 --stage multitask@best --stage zero-shot"
    done = _on_node(_node(project, tmp_path / "node"), tmp_path / "out", command, node_env)
    assert done.returncode == 1, done.stdout + done.stderr
    index, files = parts.read(tmp_path / "out" / parts.INDEX_FILE)
    refused = {s["stage"]: s["reason"] for s in index["not_run"]}
    assert refused["multitask@best"].startswith("not started: its worst estimate in")
    assert "multitask@best" not in {s["stage"] for s in index["stages"] + index["failed"]}
    assert "logs/multitask@best.log" not in files


def _call_index(out: Path, started: str, files: dict[str, bytes], overrides=("scale=gpu",)) -> Path:
    """A call's results as the runner packs them: one stage, ``multitask@x``, with ``files``."""
    index = {
        "commit": "c" * 40,
        "uncommitted_changes": [],
        "checkpoint": {"name": "all-minilm-l6-v2", "copy": "fp16"},
        "overrides": list(overrides),
        "started": started,
        "device": "GPU",
        "torch": "2.11",
        "cuda": "13",
        "python": "3.12",
        "seconds": 1.0,
        "stages": [{"stage": "multitask@x", "seconds": 1.0, "files": sorted(files), "fingerprint": {}}],
        "failed": [],
        "not_run": [],
    }
    parts.write(out, files, index)
    return out / parts.INDEX_FILE


def test_unpacking_keeps_the_newest_call_of_each_stage(tmp_path):
    from minbert.offline.gpu_results import unpack

    into = tmp_path / "gpu"
    old = _call_index(
        tmp_path / "old", "2026-01-01T00:00:00.000+00:00", {"metrics/x.json": b"old", "metrics/y": b"1"}
    )
    new = _call_index(tmp_path / "new", "2026-01-02T00:00:00.000+00:00", {"metrics/x.json": b"new"})
    assert unpack(old, into)["added"] == ["multitask@x"]
    assert unpack(new, into)["added"] == ["multitask@x"]
    assert (into / "metrics" / "x.json").read_bytes() == b"new" and not (into / "metrics" / "y").exists()
    assert unpack(old, into)["kept"] == ["multitask@x"]  # an older call unpacked late changes nothing
    assert (into / "metrics" / "x.json").read_bytes() == b"new"
    provenance = json.loads((into / "provenance.json").read_text())
    assert len(provenance["calls"]) == 2 and provenance["stages"]["multitask@x"]["call"].startswith(
        "2026-01-02"
    )
    other = _call_index(tmp_path / "other", "2026-01-03T00:00:00.000+00:00", {}, overrides=["scale=paper"])
    with pytest.raises(ValueError, match="unpack it --into another folder"):
        unpack(other, into)


@pytest.mark.slow
@pytest.mark.parametrize("lacking", ["scipy", "typer"])  # a stage's package; the command line's
def test_a_node_without_a_listed_package_stops_before_its_first_stage(project, study, tmp_path, lacking):
    env = imitation_node(tmp_path / "env", list(NODE_PACKAGES.values()), without=(lacking,))
    command = node_calls()[0]
    done = _on_node(_node(project, tmp_path / "node"), tmp_path / "out", command, env)
    assert done.returncode == 1, done.stdout + done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("error: offline-run: this node cannot import " + lacking)
    assert "docs/gpu-node.md" in said[0] and not list((tmp_path / "out").iterdir())  # no stage ran


def test_the_page_lists_what_the_node_needs():
    text = PAGE.read_text(encoding="utf-8")
    listed = text[text.index("What the node must hold") :].split("(`minbert.offline.node")[0]
    assert sorted(re.findall(r"`([\w-]+)`", listed)) == sorted(NODE_PACKAGES.values())

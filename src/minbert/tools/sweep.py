"""Seed sweeps: DVC experiments (``dvc exp run --queue -S 'seed=1,2,3'``, ``dvc queue start``)
read back from their commits (:func:`collect_runs`) and grouped by their parameters but
the seed (:func:`aggregate`): per result, the mean, sample standard deviation and seeds."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from minbert.commits import git
from minbert.results import ACCURACY, RECORD_SUFFIX, is_record
from minbert.runs.study_files import EXTRA_RUNS_FILE, read_extra_runs
from minbert.runs.training import (
    MlmRunFile,
    MultitaskRunFile,
    SentimentRunFile,
    ZeroShotRunFile,
    file_parts,
    run_from_texts,
)
from minbert.tasks import AVERAGE, MULTITASK_TASKS, TASKS

# DVC as this Python runs it, whether or not its environment is activated.
DVC = (sys.executable, "-m", "dvc")

# The numbers a sweep reports, by metrics folder: key in the metrics file, title.
_MULTITASK = [(t, TASKS[t].metric_title) for t in MULTITASK_TASKS] + [(AVERAGE, "Average")]
RESULTS = {
    "multitask": _MULTITASK,
    "multitask-mlm": _MULTITASK,
    "sentiment": [(ACCURACY, "dev acc")],
}


RunFile = MultitaskRunFile | SentimentRunFile | ZeroShotRunFile | MlmRunFile
# Each run file's kind, by its folder under metrics/ (the untrained checkpoint's: by path).
_KINDS = {
    "multitask": MultitaskRunFile,
    "multitask-mlm": MultitaskRunFile,
    "sentiment": SentimentRunFile,
    "mlm": MlmRunFile,
    "metrics/zero-shot.json": ZeroShotRunFile,
}


@dataclass(frozen=True)
class Run:
    """One run of the pipeline: its name, parameters and metrics files."""

    name: str
    params: dict
    metrics: dict[str, RunFile]  # "multitask/baseline" -> its metrics file and record, typed
    lock: dict = field(default_factory=dict)  # its dvc.lock's stages ({} when it has none)
    rev: str = ""  # the commit its files are read from
    code: str = ""  # the commit whose code it ran: an experiment's baseline, a baseline's own


def flatten_params(d: dict, prefix: str = "") -> dict:
    """``params.yaml``'s nested mappings as one: ``"configs.best.optimizer" -> value``
    (a list as its JSON text, so that every value can be compared and grouped)."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_params(value, f"{name}."))
        else:
            out[name] = json.dumps(value, sort_keys=True) if isinstance(value, list) else value
    return out


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def aggregate(runs: list[Run]) -> str:
    """Markdown: one section per group of runs differing only in ``seed``."""
    if not runs:
        raise ValueError(
            "no runs to aggregate: queue and run experiments first "
            "(dvc exp run --queue -S 'seed=1,2,3'; dvc queue start)"
        )
    flat = {run.name: flatten_params(run.params) for run in runs}
    keys = sorted({k for f in flat.values() for k in f} - {"seed"})
    varying = [k for k in keys if len({json.dumps(f.get(k), default=str) for f in flat.values()}) > 1]
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        groups[tuple(flat[run.name].get(k) for k in varying)].append(run)

    lines = [
        "# Seed sweep",
        "",
        f"{len(runs)} runs in {len(groups)} group(s); within a group the runs differ only "
        "in `seed`. Each cell is the mean ± sample standard deviation over the group's "
        "seeds (a single run shows its value alone).",
        "",
    ]
    for key in sorted(groups, key=lambda k: json.dumps(k, default=str)):
        members = sorted(groups[key], key=lambda r: (r.params.get("seed", 0), r.name))
        label = ", ".join(f"`{k}={v}`" for k, v in zip(varying, key)) or "all runs"
        seeds = ", ".join(str(r.params.get("seed")) for r in members)
        lines += [f"## {label}", "", f"Seeds: {seeds} (runs: {', '.join(r.name for r in members)}).", ""]
        for folder, columns in RESULTS.items():
            names = sorted(
                {n.split("/", 1)[1] for r in members for n in r.metrics if n.startswith(f"{folder}/")}
            )
            if not names:
                continue
            header = ["Result", *(title for _, title in columns), "n"]
            lines += [f"| {' | '.join(header)} |", "|" + "---|" * len(header)]
            for name in names:
                found = [
                    file_parts(r.metrics[f"{folder}/{name}"])[0]
                    for r in members
                    if f"{folder}/{name}" in r.metrics
                ]
                cells = [_mean_std([numbers[key] for numbers in found]) for key, _ in columns]
                lines.append(f"| `{folder}/{name}` | {' | '.join(cells)} | {len(found)} |")
            lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------ reading


def read_run(repo: Path, rev: str, name: str, experiment: bool = False) -> Run:
    """The parameters and the runs' results (metrics file and record) committed at ``rev``;
    ``experiment``: ``rev`` is an experiment's commit, which sits on the baseline whose code
    it ran."""
    params = yaml.safe_load(git(repo, "show", f"{rev}:params.yaml"))
    paths = set(git(repo, "ls-tree", "-r", "--name-only", rev, "--", "metrics").splitlines())
    metrics = {}
    for path in sorted(paths):
        record = path[: -len(".json")] + RECORD_SUFFIX
        kind = _KINDS.get(path.split("/")[1] if path.count("/") == 2 else path)
        if kind is not None and path.endswith(".json") and not is_record(path) and record in paths:
            folder, file = path.split("/")[-2:]
            source = f"{rev[:7]}:{path}"
            metrics[f"{folder}/{file[: -len('.json')]}"] = run_from_texts(
                kind, git(repo, "show", f"{rev}:{path}"), git(repo, "show", f"{rev}:{record}"), source
            )
    code = git(repo, "rev-parse", f"{rev}^").strip() if experiment else rev
    return Run(name, params, metrics, lock_stages(repo, rev) or {}, rev, code)


def lock_stages(repo: Path, rev: str | None = None) -> dict | None:
    """The stages of dvc.lock at commit ``rev`` (None: the workspace's); None without one."""
    if rev is None:
        path = Path(repo) / "dvc.lock"
        text = path.read_text(encoding="utf-8") if path.is_file() else None
    else:
        shown = subprocess.run(["git", "show", f"{rev}:dvc.lock"], cwd=repo, capture_output=True, text=True)
        text = shown.stdout if shown.returncode == 0 else None
    return None if text is None else (yaml.safe_load(text) or {}).get("stages") or {}


def temp_experiment(repo: Path, prefix: str, override: str, stages: list[str]) -> tuple[str, str, str]:
    """``stages`` with ``-S override`` as experiment ``<prefix>-<commit>`` from HEAD, in a temporary
    copy (the workspace and queue untouched): its name, its commit, how it ran."""
    commit = git(repo, "rev-parse", "HEAD").strip()
    name = f"{prefix}-{commit[:7]}"
    # A rerun from the same commit replaces the earlier experiment of that name.
    subprocess.run([*DVC, "exp", "remove", name], cwd=repo, capture_output=True)
    subprocess.run(
        [*DVC, "exp", "run", "--temp", "--name", name, "-S", override, *stages], cwd=repo, check=True
    )
    rev = git(repo, "rev-parse", f"refs/exps/{commit[:2]}/{commit[2:]}/{name}").strip()
    return name, rev, f"`dvc exp run --temp -S '{override}' {' '.join(stages)}` from commit {commit[:7]}"


# Queue states of experiments that have no results (yet, or ever).
UNFINISHED = ("Queued", "Running", "Failed")


def collect_runs(repo: Path = Path("."), revs: list[str] | None = None) -> list[Run]:
    """The baseline commits ``revs`` and their experiments with results. Queued, running or
    failed experiments and runs without metrics files are left out, each named; runs with
    identical parameters count once."""
    from dvc.api import exp_show

    from minbert.progress import console

    runs, seen = [], set()
    for row in exp_show(repo=str(repo), revs=revs):
        if row.get("rev") == "workspace":
            continue
        name = row.get("Experiment") or row["rev"]
        state = row.get("State")
        if row.get("typ") != "baseline" and state in UNFINISHED:
            console.log(f"experiment {name} is {state.lower()}: left out")
            continue
        run = read_run(repo, row["rev"], name, experiment=row.get("typ") != "baseline")
        if not run.metrics:
            console.log(f"{name} has no metrics files: left out")
            continue
        key = json.dumps(run.params, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            runs.append(run)
    return runs


# ------------------------------------------------------------------- the seed study


# Parameters that no multitask stage reads, besides the seed (what the study varies): the
# study's own, the rate search's, and MLM pretraining's (its stages run beside the
# configurations), and which configurations `dvc repro` runs.
NOT_READ_BY_MULTITASK = ("seed_study.", "lr_search.", "mlm.", "repro_configs")


def _without_seed(params: dict) -> str:
    """The parameters a multitask stage reads, but the seed."""
    flat = flatten_params(params)
    kept = {k: v for k, v in flat.items() if k != "seed" and not k.startswith(NOT_READ_BY_MULTITASK)}
    return json.dumps(kept, sort_keys=True, default=str)


# Deps that hold the seed (the resolved settings) or are made from it (the features of the
# seed's training rows): never alike across seeds, so not compared; a made one's stage is.
SEEDED_DEPS = {"data/settings/": None, "data/features": "features"}


def same_code(run: Run, lock: dict, stage: str) -> bool:
    """Whether ``run`` ran ``stage`` with the code and data (its deps' hashes) that
    ``lock`` (the current dvc.lock's stages) records, and so the stages that made its
    seed-dependent deps: a run of another commit counts only then. Without a lock to
    compare against, every run counts."""
    if not lock:
        return True

    def seeded(path: str) -> bool:
        return any(path.startswith(prefix) for prefix in SEEDED_DEPS)

    def deps(stages: dict, name: str) -> list:
        # The params (but the seed) are compared by the caller.
        found = stages.get(name, {}).get("deps", [])
        return sorted((d["path"], d.get("md5")) for d in found if not seeded(d["path"]))

    makers = {
        maker
        for d in lock.get(stage, {}).get("deps", [])
        for prefix, maker in SEEDED_DEPS.items()
        if maker and d["path"].startswith(prefix)
    }
    return all(bool(deps(lock, s)) and deps(run.lock, s) == deps(lock, s) for s in (stage, *sorted(makers)))


def current_lock(repo: Path) -> dict:
    """The workspace's dvc.lock stages, and those of the runs outside `dvc repro` as
    `minbert extra-runs` recorded them; none without a lock (nothing reproduced in the
    workspace: nothing to compare runs of other commits with)."""
    stages = lock_stages(repo) or {}
    extra = read_extra_runs(Path(repo) / "metrics" / EXTRA_RUNS_FILE) if stages else None
    return {**(extra.stages if extra else {}), **stages}


# The untrained checkpoint, fitted with each seed beside the configurations (nothing of it
# is trained but its SST probe and Quora threshold, on the seed's training rows), so
# fine-tuning is compared with it seed by seed. Its stage's name, and its name in the study.
UNTRAINED = "zero-shot"


def study_entry(name: str) -> tuple[str, str]:
    """An entry of the study (a configuration, or ``UNTRAINED``): its stage, and its key
    among a run's metrics files (``Run.metrics``)."""
    if name == UNTRAINED:
        return UNTRAINED, "metrics/zero-shot"
    return f"multitask@{name}", f"multitask/{name}"


def seed_study(runs: list[Run], params: dict, configs: list[str], lock: dict | None = None) -> dict:
    """Each entry's full-dev metrics per seed other than ``params``' own (the committed
    files hold that one); ``configs``: configurations, or ``UNTRAINED``. A run counts for
    an entry only when its metrics file was written with the run's seed and, given
    ``lock``, by the stage's current code and data."""
    same = [
        r
        for r in runs
        if _without_seed(r.params) == _without_seed(params) and r.params["seed"] != params["seed"]
    ]
    out = {}
    for config in configs:
        stage, key = study_entry(config)
        by_seed = {}
        for run in same:
            m = run.metrics.get(key)
            if m is not None and m.seed == run.params["seed"] and same_code(run, lock or {}, stage):
                made = {"code": run.code[:7], "device": m.device}
                by_seed[m.seed] = {"seed": m.seed, "run": run.name, **made, **m.scores}
        if not by_seed:
            raise ValueError(f"no finished run of configuration {config!r} with these parameters")
        out[config] = [by_seed[s] for s in sorted(by_seed)]
    return out


def wait_for_queue(repo: Path, poll_seconds: float = 10.0) -> dict[str, str]:
    """Wait until DVC's experiment queue has nothing queued or running; each task's
    final state (``dvc queue status``), by task name."""
    import time

    while True:
        done = subprocess.run([*DVC, "queue", "status"], cwd=repo, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"dvc queue status failed: {done.stderr.strip()}")
        states = {
            line.split()[0]: line.split()[-1]
            for line in done.stdout.splitlines()[1:]
            if line.strip() and not line.startswith("Worker status")
        }
        if not {"Queued", "Running"} & set(states.values()):
            return states
        time.sleep(poll_seconds)


SEED_STUDY_COMMAND = "minbert seed-study"


def beside(before: dict, configs: dict, settings: dict, entries: list[str]) -> tuple[dict, dict]:
    """The rows and settings of the entries just collected (``configs``, ``settings``)
    beside those of the other ``entries`` in the study written ``before``, in the order of
    ``entries``; an entry no longer among them is dropped."""
    rows, digests = {**before["configs"], **configs}, {**before.get("settings", {}), **settings}
    rows = {n: rows[n] for n in entries if n in rows}
    return rows, {n: digests[n] for n in rows if n in digests}


def run_seed_study(
    repo: Path, out: Path, queue: bool = True, baselines: tuple[str, ...] = (), only: tuple[str, ...] = ()
) -> dict:
    """Queue, run and wait for ``seed_study``'s configurations and the untrained checkpoint
    at each of its seeds, then write their full-dev metrics per seed to ``out``;
    ``baselines``: earlier commits whose experiments count too; ``only``: these entries
    alone, the others kept from ``out`` as they are."""
    from minbert.atomic import atomic_write_text
    from minbert.cores import side_by_side
    from minbert.pipeline.params import load
    from minbert.progress import console
    from minbert.report.comparisons import settings_digest

    params = load(repo / "params.yaml")
    study = params["seed_study"]
    entries = [*study["configs"], UNTRAINED]
    unknown = [n for n in only if n not in entries]
    if unknown:
        raise ValueError(f"seed study: no entry {unknown[0]!r}; expected one of {', '.join(entries)}")
    chosen = [n for n in entries if n in only] if only else entries
    targets = [study_entry(n)[0] for n in chosen]
    # Its configurations as stages, those `dvc repro` leaves out too.
    trained = [n for n in chosen if n != UNTRAINED]
    stages = ["-S", f"repro_configs=[{','.join(trained)}]"] if trained else []
    if queue:
        for seed in study["seeds"]:
            subprocess.run(
                [*DVC, "exp", "run", "--queue", "-S", f"seed={seed}", *stages, *targets], cwd=repo, check=True
            )
        # The experiments run side by side: each of their stages takes its share of the cores
        # (a queue worker started earlier keeps the threads it was started with).
        jobs = study["jobs"]
        subprocess.run(
            [*DVC, "queue", "start", "--jobs", str(jobs)], cwd=repo, check=True, env=side_by_side(jobs)
        )
        failed = {name: state for name, state in wait_for_queue(repo).items() if state != "Success"}
        if failed:
            console.print(f"experiments that did not succeed (see `dvc queue logs NAME`): {failed}")
    runs = collect_runs(repo, ["HEAD", *baselines])
    configs = seed_study(runs, params, chosen, current_lock(repo))
    # Each entry's settings (its record's, which hold no seed): one value, as every run
    # counted has the same parameters but the seed; the report checks its runs against it.
    by_name = {r.name: r for r in runs}
    settings = {
        name: settings_digest(by_name[rows[0]["run"]].metrics[study_entry(name)[1]])
        for name, rows in configs.items()
    }
    if only and (repo / out).is_file():  # the entries not rerun, as the study holds them
        before = json.loads((repo / out).read_text(encoding="utf-8"))
        configs, settings = beside(before, configs, settings, entries)
    every = " ".join(study_entry(n)[0] for n in entries)
    result = {
        "command": SEED_STUDY_COMMAND,
        "how": f"queues `dvc exp run -S seed=N {every}` for each seed of "
        "`seed_study.seeds` and runs the queue; the pipeline's own seed is not copied here "
        "(the report reads it from the current metrics files)",
        "seeds": sorted({r["seed"] for rows in configs.values() for r in rows}),
        "configs": configs,
        "settings": settings,
    }
    atomic_write_text(repo / out, json.dumps(result, indent=2) + "\n")
    return result

"""The minbert command line."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, saved_multitask_model
from typer.testing import CliRunner

from minbert.cli import app
from minbert.data.predictions import read_predictions

runner = CliRunner()


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("validate", "check-params", "checkpoint", "sweep-report"):
        assert command in result.output


def test_validate_good_and_bad_files(tmp_path):
    good = _write(tmp_path / "good.csv", "\tid\tsentence\tsentiment\n0\ta1\t A fine film .\t3\n")
    result = runner.invoke(app, ["validate", str(good), "--task", "sst"])
    assert result.exit_code == 0, result.output

    bad = _write(
        tmp_path / "bad.csv",
        "\tid\tsentence\tsentiment\n0\ta1\t A fine film .\t7\n1\ta2\t \t2\n2\ta1\tAgain .\t1\n",
    )
    result = runner.invoke(app, ["validate", str(bad), "--task", "sst"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"{bad}:2: ") and "7" in lines[0]
    assert any(line.startswith(f"{bad}:3: ") for line in lines)
    assert any(line.startswith(f"{bad}:4: ") and "duplicate" in line for line in lines)


def test_validate_rejects_unknown_task(tmp_path):
    result = runner.invoke(app, ["validate", str(tmp_path / "x.csv"), "--task", "imdb"])
    assert result.exit_code == 2


def test_check_params(tmp_path):
    bad = _write(tmp_path / "params.yaml", "seed: 1\noptimiser: adamaxw\n")
    result = runner.invoke(app, ["check-params", str(bad)])
    assert result.exit_code == 1 and "unknown key 'optimiser'" in result.output


# ----------------------------------------------------------------------------- a model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_checkpoint):
    """A multitask model directory as the stages write it (untrained heads: the commands'
    plumbing is what is tested here)."""
    heads = ("siamese-concat", "cross-encoder", 0.3, "mean", "sigmoid")
    return saved_multitask_model(tmp_path_factory.mktemp("model") / "best", tiny_checkpoint, heads, 32, 4)


def _sst_file(path, rows=6, labelled=True):
    header = "\tid\tsentence" + ("\tsentiment" if labelled else "")
    lines = [header] + [
        f"{i}\ts{i}\tA {'good' if i % 2 else 'bad'} film .{chr(9) + str(i % 5) if labelled else ''}"
        for i in range(rows)
    ]
    return _write(path, "\n".join(lines) + "\n")


def test_help_lists_predict_and_evaluate():
    result = runner.invoke(app, ["--help"])
    for command in ("predict", "evaluate", "seed-study"):
        assert command in result.output


def test_predict_sentences_and_a_file(model_dir, tmp_path):
    result = runner.invoke(
        app,
        [
            "predict",
            str(model_dir),
            "--task",
            "sts",
            "--pair",
            "A man is playing a guitar.",
            "Someone plays an instrument.",
        ],
    )
    assert result.exit_code == 0, result.output
    score = float(result.output.split()[0])
    assert 0 <= score <= 5 and "A man is playing a guitar." in result.output
    result = runner.invoke(
        app, ["predict", str(model_dir), "--task", "sst", "--text", "A fine film .", "--text", "Dreadful ."]
    )
    assert result.exit_code == 0 and len(result.output.strip().splitlines()) == 2
    out = tmp_path / "pred.csv"
    result = runner.invoke(
        app,
        [
            "predict",
            str(model_dir),
            "--task",
            "sst",
            str(_sst_file(tmp_path / "in.csv", labelled=False)),
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    written = read_predictions(out)
    assert list(written) == [f"s{i}" for i in range(6)] and set(written.values()) <= set("01234")
    # A plain CSV with named columns (no index, no ids): ids come from the lines.
    plain = _write(tmp_path / "pairs.csv", 'sentence1,sentence2\n"A man, here .",A man .\nDogs .,Cats .\n')
    result = runner.invoke(app, ["predict", str(model_dir), "--task", "quora", str(plain)])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.splitlines() if line.startswith("line-")]
    assert [r[0] for r in rows] == ["line-2", "line-3"] and all("paraphrase" in r[1] for r in rows)


def test_evaluate_scores_a_labelled_file_with_an_interval(model_dir, tmp_path):
    labelled = _sst_file(tmp_path / "dev.csv", rows=40)
    result = runner.invoke(
        app, ["evaluate", str(model_dir), "--task", "sst", str(labelled), "-o", str(tmp_path / "score.json")]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "score.json").read_text())
    assert summary["examples"] == 40 and summary["metric"] == "SST acc"
    low, high = summary["interval_95"]
    assert low <= summary["value"] <= high
    # The same number as the predictions scored by hand.
    out = tmp_path / "p.csv"
    runner.invoke(app, ["predict", str(model_dir), "--task", "sst", str(labelled), "-o", str(out)])
    predicted = read_predictions(out)
    truth = {f"s{i}": i % 5 for i in range(40)}
    assert summary["value"] == pytest.approx(sum(int(predicted[k]) == v for k, v in truth.items()) / 40)
    unlabelled = runner.invoke(
        app,
        ["evaluate", str(model_dir), "--task", "sst", str(_sst_file(tmp_path / "test.csv", labelled=False))],
    )
    assert unlabelled.exit_code == 1 and "no label column 'sentiment'" in unlabelled.output


def _assert_one_line_error(result, *fragments):
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "error: " in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)


def test_bad_models_and_inputs_end_in_one_line(model_dir, tmp_path):
    missing = tmp_path / "nowhere"
    _assert_one_line_error(
        runner.invoke(app, ["predict", str(missing), "--task", "sst", "--text", "x"]),
        str(missing),
        "not a fine-tuned multitask model",
    )
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / "minbert.json").write_text("{not json")
    _assert_one_line_error(
        runner.invoke(app, ["predict", str(broken), "--task", "sst", "--text", "x"]),
        "minbert.json",
        "not valid JSON",
    )
    shutil.copy(model_dir / "minbert.json", broken / "minbert.json")
    (broken / "heads.safetensors").write_bytes(b"\x00" * 10)
    _assert_one_line_error(
        runner.invoke(app, ["predict", str(broken), "--task", "sst", "--text", "x"]), "heads.safetensors"
    )
    (broken / "model.safetensors").write_bytes(b"garbage")
    _assert_one_line_error(runner.invoke(app, ["predict", str(broken), "--task", "sst", "--text", "x"]))
    bad_row = _write(tmp_path / "bad.csv", "\tid\tsentence\tsentiment\n0\ta\tFine .\t9\n")
    _assert_one_line_error(
        runner.invoke(app, ["evaluate", str(model_dir), "--task", "sst", str(bad_row)]),
        f"{bad_row}:2: sentiment '9' is outside the classes 0..4",
    )
    _assert_one_line_error(
        runner.invoke(app, ["check-params", str(_write(tmp_path / "p.yaml", "a: [1"))]), "not valid YAML"
    )
    # A number out of its range: the key, the value and the range.
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["scales"]["gpu"]["multitask"]["epochs"] = 0
    _assert_one_line_error(
        runner.invoke(app, ["check-params", str(_write(tmp_path / "params.yaml", yaml.safe_dump(params)))]),
        "scales.gpu.multitask.epochs = 0 is out of range; allowed: an integer >= 1",
    )
    _assert_one_line_error(
        runner.invoke(app, ["checkpoint", str(tmp_path / "no-checkpoint")]), "does not exist"
    )
    # --debug keeps the traceback.
    debug = runner.invoke(app, ["--debug", "predict", str(missing), "--task", "sst", "--text", "x"])
    assert debug.exit_code == 1 and isinstance(debug.exception, FileNotFoundError)


def test_validate_requires_labels_unless_told_the_file_is_unlabelled(tmp_path):
    stripped = _sst_file(tmp_path / "ids-sst-train.csv", labelled=False)
    result = runner.invoke(app, ["validate", str(stripped), "--task", "sst"])
    assert result.exit_code == 1
    assert f"{stripped}:1: no label column 'sentiment'" in result.output
    assert runner.invoke(app, ["validate", str(stripped), "--task", "sst", "--unlabelled"]).exit_code == 0
    # The course's own test files are unlabelled by name.
    test_file = _sst_file(tmp_path / "ids-sst-test-student.csv", labelled=False)
    assert runner.invoke(app, ["validate", str(test_file), "--task", "sst"]).exit_code == 0
    labelled_as_test = _sst_file(tmp_path / "x.csv")
    result = runner.invoke(app, ["validate", str(labelled_as_test), "--task", "sst", "--unlabelled"])
    assert result.exit_code == 1 and "has a label column" in result.output
    named = _write(tmp_path / "named.tsv", "sentence\tsentiment\nA film .\t2\n")
    assert runner.invoke(app, ["validate", str(named), "--task", "sst", "--named"]).exit_code == 0


def test_a_stage_with_bad_input_ends_in_one_line(tmp_path):
    (tmp_path / "params.yaml").write_text("seed: 1\noptimiser: adamaxw\n")

    def resolve(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                str(REPO / "stages" / "resolve.py"),
                "--params",
                "params.yaml",
                "--manifest",
                "manifest.json",
                "--out",
                "settings",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )

    done = resolve()
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: params.yaml: unknown key 'optimiser'")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    debug = resolve(MINBERT_DEBUG="1")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["smart"]["steps"] = 0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    done = resolve()
    assert done.returncode == 1 and done.stderr.strip() == (
        "error: params.yaml: smart.steps = 0 is out of range; allowed: an integer >= 1"
    )


@pytest.mark.slow
def test_version_names_the_package_and_torch():
    from importlib.metadata import version

    done = subprocess.run(
        [sys.executable, "-m", "minbert", "--version"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0
    assert f"minbert {version('minbert')} (torch {torch.__version__})" in done.stdout + done.stderr


def test_evaluate_reads_prepared_tables_and_checks_labels_first(model_dir, tmp_path):
    import pandas as pd

    labelled = _sst_file(tmp_path / "dev.csv", rows=60)
    scores = {name: tmp_path / f"{name}.json" for name in ("csv", "parquet")}
    from_csv = runner.invoke(
        app, ["evaluate", str(model_dir), "--task", "sst", str(labelled), "-o", str(scores["csv"])]
    )
    assert from_csv.exit_code == 0, from_csv.output
    # The same rows as a prepared Parquet table (as data/prepared holds the Quora
    # held-out pairs): the same score.
    table = tmp_path / "sst-dev.parquet"
    pd.DataFrame(
        {
            "id": [f"s{i}" for i in range(60)],
            "sentence": [f"A {'good' if i % 2 else 'bad'} film ." for i in range(60)],
            "label": [i % 5 for i in range(60)],
            "line": list(range(2, 62)),
        }
    ).to_parquet(table)
    from_parquet = runner.invoke(
        app, ["evaluate", str(model_dir), "--task", "sst", str(table), "-o", str(scores["parquet"])]
    )
    assert from_parquet.exit_code == 0, from_parquet.output
    values = {name: json.loads(path.read_text())["value"] for name, path in scores.items()}
    assert values["csv"] == values["parquet"]
    # A Parquet table of another task, binary input: one line each.
    _assert_one_line_error(
        runner.invoke(app, ["evaluate", str(model_dir), "--task", "quora", str(table)]),
        "no column 'sentence1'",
    )
    blob = tmp_path / "blob.csv"
    blob.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)) * 50)
    result = runner.invoke(app, ["evaluate", str(model_dir), "--task", "sst", str(blob)])
    _assert_one_line_error(result, "a binary file")
    assert len(result.output.strip().splitlines()) <= 2
    # Labels are checked before any prediction: an unlabelled file fails before the
    # (here missing) model is even read.
    unlabelled = _sst_file(tmp_path / "test.csv", labelled=False)
    _assert_one_line_error(
        runner.invoke(app, ["evaluate", str(tmp_path / "no-model"), "--task", "sst", str(unlabelled)]),
        "no label column 'sentiment'",
    )
    # Two classes scored as five-class SST (CFIMDB's 0/1): scored, with a warning.
    binary = _write(
        tmp_path / "cfimdb.csv",
        "\tid\tsentence\tsentiment\n" + "".join(f"{i}\tc{i}\tA film .\t{i % 2}\n" for i in range(60)),
    )
    warned = runner.invoke(app, ["evaluate", str(model_dir), "--task", "sst", str(binary)])
    assert warned.exit_code == 0 and "two-class file" in " ".join(warned.output.split())


def _alone(model_dir, task: str, *sentences: str) -> torch.Tensor:
    """The head's output for one example in a batch of its own (no padding)."""
    import pandas as pd

    from minbert.data.batches import TokenizedTable
    from minbert.data.multitask import TaskData
    from minbert.data.tokenize import load_tokenizer, tokenize_table
    from minbert.model.multitask import load_multitask
    from minbert.tasks import TASKS

    model, _ = load_multitask(model_dir)
    frame = pd.DataFrame({"id": ["x"], **{c: [s] for c, s in zip(TASKS[task].text_columns, sentences)}})
    arrow, _ = tokenize_table(frame, task, load_tokenizer(model_dir / "vocab.txt"), 32)
    data = TaskData(task, TokenizedTable.from_arrow(arrow), model.is_siamese(task))
    with torch.inference_mode():
        return model(task, data.batch(np.array([0])))[0]


def test_predict_gives_every_pair_and_text_with_probabilities(model_dir):
    pairs = [
        ("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
        ("Dogs bark at night .", "Cats sleep all day ."),
        ("A man plays a guitar .", "A man plays an instrument ."),
    ]
    result = runner.invoke(
        app, ["predict", str(model_dir), "--task", "quora", *[x for p in pairs for x in ("--pair", *p)]]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert [line.split("\t")[1] for line in lines] == [f"{a} | {b}" for a, b in pairs]
    for line, pair in zip(lines, pairs):
        probability = torch.sigmoid(_alone(model_dir, "quora", *pair)).item()
        label = "1 (paraphrase)" if probability > 0.5 else "0 (not a paraphrase)"
        assert line.startswith(f"{label} P(paraphrase)={probability:.2f}\t"), (line, probability)
    # SST: the predicted class's probability and the runner-up's.
    texts = ["A dull, lifeless, boring mess .", "A fine film ."]
    result = runner.invoke(
        app, ["predict", str(model_dir), "--task", "sst", "--text", texts[0], "--text", texts[1]]
    )
    assert result.exit_code == 0, result.output
    for line, text in zip(result.output.strip().splitlines(), texts):
        p = torch.softmax(_alone(model_dir, "sst", text), -1)
        first, second = torch.argsort(p, descending=True)[:2].tolist()
        assert re.match(
            rf"{first} \(.+\) p={p[first]:.2f}, next {second} \(.+\) p={p[second]:.2f}\t{re.escape(text)}$",
            line,
        ), line
    # STS keeps its score; a pair given to SST (or a sentence to Quora) is refused.
    result = runner.invoke(
        app, ["predict", str(model_dir), "--task", "sts", "--pair", "A .", "B .", "--pair", "C .", "D ."]
    )
    assert result.exit_code == 0 and re.fullmatch(r"(\d\.\d{3} \(similarity, 0-5\)\t.+\n){2}", result.output)
    _assert_one_line_error(
        runner.invoke(app, ["predict", str(model_dir), "--task", "sst", "--text", "x", "--pair", "a", "b"]),
        "task 'sst' takes --text SENTENCE (repeatable), not --pair",
    )


def test_evaluate_refuses_a_file_of_the_models_training_rows_unless_allowed(model_dir, tmp_path):
    import gzip

    from minbert.pipeline.multitask import TRAINING_IDS

    labelled = _sst_file(tmp_path / "dev.csv", rows=40)
    # A model directory that does not record its training rows: said, then scored.
    unknown = runner.invoke(app, ["evaluate", str(model_dir), "--task", "sst", str(labelled)])
    assert unknown.exit_code == 0, unknown.output
    assert f"note: {model_dir} has no {TRAINING_IDS}" in " ".join(unknown.output.split())
    # One that does, as the multitask stage writes it: 12 of the file's rows are its.
    trained = tmp_path / "trained"
    shutil.copytree(model_dir, trained)
    tasks = {task: {"trained": [], "validation": []} for task in ("quora", "sts")}
    tasks["sst"] = {"trained": [f"s{i}" for i in range(10)] + ["elsewhere"], "validation": ["s10", "s11"]}
    (trained / TRAINING_IDS).write_bytes(gzip.compress(json.dumps({"tasks": tasks}).encode()))
    refused = runner.invoke(app, ["evaluate", str(trained), "--task", "sst", str(labelled)])
    _assert_one_line_error(refused, f"{labelled}: 12 of its 40 rows are {trained}'s", "--allow-training-rows")
    score = tmp_path / "score.json"
    allowed = runner.invoke(
        app,
        ["evaluate", str(trained), "--task", "sst", str(labelled), "--allow-training-rows", "-o", str(score)],
    )
    assert allowed.exit_code == 0, allowed.output
    assert f"warning: {labelled}: 12 of its 40 rows" in " ".join(allowed.output.split())
    assert json.loads(score.read_text())["examples"] == 40
    # Rows it never saw: scored without a word against them.
    held_out = _write(
        tmp_path / "held-out.csv",
        "\tid\tsentence\tsentiment\n" + "".join(f"{i}\th{i}\tA film .\t{i % 5}\n" for i in range(60)),
    )
    fine = runner.invoke(app, ["evaluate", str(trained), "--task", "sst", str(held_out)])
    assert fine.exit_code == 0 and "none of its rows are" in " ".join(fine.output.split())
    # A damaged record is an error naming it.
    (trained / TRAINING_IDS).write_bytes(b"not gzip")
    _assert_one_line_error(
        runner.invoke(app, ["evaluate", str(trained), "--task", "sst", str(labelled)]),
        str(trained / TRAINING_IDS),
    )

"""params.yaml: the committed file is valid, and mistakes are named before work starts."""

import copy
import re

import pytest
import yaml
from conftest import REPO

from minbert.pipeline import params as params
from minbert.pipeline.schema import ParamsError, validate


@pytest.fixture
def committed():
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_committed_params_are_valid(committed):
    validate(committed)
    for run in committed["sentiment"]["runs"]:
        settings = params.sentiment_settings(committed, run)
        assert settings.seed == committed["seed"]


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["optimiser"], "adamaxw", "unknown key 'optimiser'"),
        (
            ["sentiment", "optimizer"],
            "sgd",
            r"sentiment.optimizer = 'sgd' is not one of \['adamw', 'adamaxw'\]",
        ),
        (["sentiment", "runs", "sst-full", "mode"], "lora", "sentiment.runs.sst-full.mode = 'lora'"),
        (["device"], "tpu", "device = 'tpu' is not one of"),
        (["scale"], "huge", r"scale = 'huge' is not one of \['cpu', 'gpu', 'paper'\]"),
        (["seed"], "11711", "seed must be int"),
        (["scales", "cpu", "sentiment", "batch_size", "sst"], True, "batch_size.sst must be int"),
        (["data", "quora_holdout_fraction"], 1.5, r"quora_holdout_fraction = 1.5 is out of range"),
        (["scales", "cpu", "max_length", "imdb"], 10, "unknown key 'scales.cpu.max_length.imdb'"),
        (["mlm", "pretrain"], ["continue", "warm"], r"mlm.pretrain\[1\] = 'warm' is not one of"),
        (["mlm", "pretrain"], "continue", "mlm.pretrain must be a list"),
        (["mlm", "pretrain"], ["scratch", "scratch"], "mlm.pretrain lists an entry twice"),
        (["mlm", "finetune"], ["baseline", "bestest"], r"mlm.finetune names \['bestest'\]"),
        (["seed_study", "configs"], ["best", "bestest"], r"seed_study.configs names \['bestest'\]"),
        (["repro_configs"], ["baseline", "bestest"], r"repro_configs names \['bestest'\]"),
        (["repro_configs"], ["best", "best"], "repro_configs lists an entry twice"),
        (["gradient"], "sum", r"gradient = 'sum' is not one of \['round-robin', 'summed', 'pcgrad'\]"),
        (["sts_output"], "tanh", r"sts_output = 'tanh' is not one of \['sigmoid', 'linear'\]"),
        (["mlm", "sources"], ["sst", "imdb"], r"mlm.sources\[1\] = 'imdb'"),
        (["mlm", "mask_prob"], 1.0, r"mlm.mask_prob = 1.0 is out of range; allowed: a number in \(0, 1\)"),
    ],
)
def test_mistakes_are_named(committed, path, value, message):
    bad = copy.deepcopy(committed)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ParamsError, match=message):
        validate(bad)


@pytest.mark.parametrize(
    "path, value, allowed",
    [
        (["scales", "cpu", "multitask", "epochs"], 0, "an integer >= 1"),
        (["scales", "gpu", "multitask", "batch_size", "quora"], -8, "an integer >= 1"),
        (["scales", "cpu", "sentiment", "train_examples", "cfimdb"], -1, "an integer >= 0"),
        (["scales", "cpu", "max_length", "sts"], 1024, "an integer in [5, 512]"),
        (["scales", "cpu", "multitask", "dropout"], 1.0, "a number in [0, 1)"),
        (["scales", "cpu", "multitask", "optimizers", "adamw", "lr"], 0.0, "a number in (0, 1]"),
        (["scales", "paper", "sentiment", "head_lr"], -1e-3, "a number in (0, 1], or empty (null)"),
        (["smart", "beta"], 1.0, "a number in [0, 1)"),
        (["smart", "noise_std"], 0.0, "a number > 0"),
        (["smart", "lambda_s"], float("inf"), "a number >= 0"),
        (["configs", "best-round-robin-equal", "batches_per_step"], 0, "an integer >= 1"),
        (["sentiment", "grad_clip"], -1.0, "a number >= 0"),
        (["seed"], -1, "an integer in [0, 4294967295]"),
        (["seed_study", "seeds"], [1, -2], "an integer in [0, 4294967295]"),
    ],
)
def test_a_number_out_of_range_names_key_value_and_range(committed, path, value, allowed):
    """One line: the key, the value, and the range the schema allows."""
    node = committed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = value[-1] if isinstance(value, list) else value
    key = ".".join(path) + ("[1]" if isinstance(value, list) else "")
    with pytest.raises(ParamsError) as raised:
        validate(committed)
    assert str(raised.value) == f"params.yaml: {key} = {bad!r} is out of range; allowed: {allowed}"


def _numbers(node, schema, path=()):
    """(key, schema) of every number (or empty number) in ``node``, read against ``schema``."""
    from minbert.settings import Setting

    if isinstance(schema, Setting):
        schema = schema.allowed
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, schema.get(k, schema.get("*")), (*path, str(k)))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _numbers(item, schema[0], (*path, str(i)))
    elif node is None or (isinstance(node, (int, float)) and not isinstance(node, bool)):
        yield ".".join(path), schema


def test_every_number_of_params_yaml_has_its_range(committed):
    from minbert.pipeline.schema import SCHEMA
    from minbert.settings import Range

    numbers = dict(_numbers(committed, SCHEMA))
    assert len(numbers) > 100 and "scales.cpu.multitask.epochs" in numbers
    assert not [key for key, schema in numbers.items() if not isinstance(schema, Range)]


def test_missing_key_is_named(committed):
    del committed["sentiment"]["weight_decay"]
    with pytest.raises(ParamsError, match="sentiment lacks weight_decay"):
        validate(committed)


def test_exponential_schedule_needs_its_factor_and_only_it(committed):
    bad = copy.deepcopy(committed)
    del bad["scales"]["cpu"]["multitask"]["optimizers"]["adamaxw"]["lr_gamma"]
    with pytest.raises(
        ParamsError, match=r"optimizers.adamaxw: lr_gamma .* goes with an exponential lr_schedule"
    ):
        validate(bad)
    committed["sentiment"]["lr_gamma"] = 0.9  # a factor no schedule would read
    with pytest.raises(ParamsError, match=r"sentiment: lr_gamma .* only with it; lr_schedule is constant"):
        validate(committed)


def test_paper_scale_is_section_4_3(committed):
    """The paper's experimental details (its Section 4.3), value by value."""
    paper = committed["scales"]["paper"]
    assert paper["sentiment"]["epochs"] == {"last-layer": 10, "full": 10}
    assert paper["sentiment"]["batch_size"] == {"sst": 64, "cfimdb": 8}
    assert paper["sentiment"]["dropout"] == 0.3
    assert paper["sentiment"]["train_examples"] == {"sst": 0, "cfimdb": 0}
    lrs = {run["mode"]: run["lr"] for run in committed["sentiment"]["runs"].values()}
    assert lrs == {"last-layer": 1e-3, "full": 1e-5}
    multitask = paper["multitask"]
    assert multitask["epochs"] == 10 and multitask["dropout"] == 0.3
    assert multitask["batch_size"] == {"sst": 2, "quora": 36, "sts": 2}
    assert multitask["train_examples"] == {"sst": 0, "quora": 0, "sts": 0}
    assert multitask["history_examples"] == {"dev": 0, "train": 0}
    assert multitask["head_warmup"]["epochs"] == 0  # the paper trains fresh heads with the encoder
    adamw, adamaxw = multitask["optimizers"]["adamw"], multitask["optimizers"]["adamaxw"]
    assert (adamw["lr"], adamw["lr_schedule"]) == (1e-5, "constant")
    assert (adamaxw["lr"], adamaxw["lr_schedule"], adamaxw["lr_gamma"]) == (1e-4, "exponential", 0.9)
    assert paper["pooling"] == "pooler"  # BERT's pooled output, as the paper's heads read
    # Resolved settings: what a multitask stage runs with at the paper's scale.
    committed["scale"] = "paper"
    official = {"kind": "official"}  # the Quora split the paper's batch of 36 was sized for
    best = params.multitask_settings(committed, "best", official)
    assert (best.optimizer, best.lr, best.lr_schedule, best.lr_gamma) == ("adamaxw", 1e-4, "exponential", 0.9)
    assert (best.dropout, best.epochs, best.batch_size) == (0.3, 10, {"sst": 2, "quora": 36, "sts": 2})
    assert params.multitask_settings(committed, "best-adamw", official).lr == 1e-5
    sst = params.sentiment_settings(committed, "sst-full")
    assert (sst.batch_size, sst.epochs, sst.dropout, sst.lr) == (64, 10, 0.3, 1e-5)
    # One learning rate for encoder and heads: the paper states a single one.
    for optimizer in multitask["optimizers"].values():
        assert optimizer["head_lr"] == optimizer["lr"]
    assert best.head_lr == best.lr and sst.head_lr is None
    # Without the official Quora train split, the Quora batch keeps the paper's
    # batches per epoch (see test_selection.py for the numbers).
    assert multitask["carved_quora_batch"] == "paper-proportions"
    assert params.sentiment_settings(committed, "cfimdb-last-layer").batch_size == 8


def test_the_papers_configurations(committed):
    """Table 4's columns are single-component ablations of the best model, and
    best-no-smart isolates SMART."""

    def resolved(config):
        s = params.multitask_settings(committed, config)
        return (s.paraphrase_head, s.sts_head, s.gradient, s.optimizer, s.smart is not None)

    assert resolved("best") == ("cross-encoder", "cross-encoder", "pcgrad", "adamaxw", True)
    assert resolved("best-round-robin") == ("cross-encoder", "cross-encoder", "round-robin", "adamaxw", True)
    assert resolved("best-adamw") == ("cross-encoder", "cross-encoder", "pcgrad", "adamw", True)
    assert resolved("best-no-smart") == ("cross-encoder", "cross-encoder", "pcgrad", "adamaxw", False)
    assert resolved("baseline") == ("siamese-concat", "siamese-concat", "round-robin", "adamw", False)
    assert params.multitask_settings(committed, "baseline").sts_output == "sigmoid"


def test_scale_switch_changes_sizes(committed):
    cpu = params.sentiment_settings(committed, "sst-full")
    committed["scale"] = "paper"
    paper = params.sentiment_settings(committed, "sst-full")
    assert (paper.batch_size, paper.epochs) == (64, 10)
    assert paper.lr == cpu.lr == 1e-5


def test_mlm_settings_per_start(committed):
    cont, scratch = params.mlm_settings(committed, "continue"), params.mlm_settings(committed, "scratch")
    assert cont.lr == committed["mlm"]["starts"]["continue"]["lr"] and cont.scratch_config == {}
    assert (
        scratch.scratch_config["num_hidden_layers"]
        == committed["mlm"]["starts"]["scratch"]["num_hidden_layers"]
    )
    assert cont.max_length == committed["scales"]["cpu"]["mlm"]["max_length"]
    with pytest.raises(ParamsError, match="MLM start 'warm'"):
        params.mlm_settings(committed, "warm")


def test_a_configuration_runs_at_its_optimizers_rates(committed):
    """Each optimizer has its own rates (searched on `best`: metrics/lr-search.json), and
    every configuration of a family without rates of its own runs at its optimizer's:
    `best` and `best-adamw` at their own."""
    scale = committed["scales"]["cpu"]["multitask"]
    scale["rates"] = {}
    scale["optimizers"]["adamw"].update(lr=2e-5, head_lr=2e-3)
    scale["optimizers"]["adamaxw"].update(lr=7e-5, head_lr=3e-3)
    validate(committed)
    for config, lr, head_lr in (("best", 7e-5, 3e-3), ("best-adamw", 2e-5, 2e-3), ("baseline", 2e-5, 2e-3)):
        settings = params.multitask_settings(committed, config)
        assert (settings.lr, settings.head_lr) == (lr, head_lr), config
    scale["lr_by_config"] = {"best": 3e-5}  # the per-configuration rates this replaced
    with pytest.raises(ParamsError, match="lr_by_config"):
        validate(committed)


def test_a_family_runs_at_its_own_rates_over_its_optimizers(committed):
    """`scales.<scale>.multitask.rates.<family>.<optimizer>` (what `minbert lr-search`
    chooses) sets the rates of every configuration of the family that runs with that
    optimizer; the family's other optimizers, and other families, keep the optimizer's."""
    scale = committed["scales"]["cpu"]["multitask"]
    scale["rates"] = {"best": {"adamaxw": {"lr": 7e-4}}, "siamese": {"adamw": {"lr": 2e-5, "head_lr": 3e-3}}}
    validate(committed)
    adamw, adamaxw = scale["optimizers"]["adamw"], scale["optimizers"]["adamaxw"]
    for config, lr, head_lr in (
        ("best", 7e-4, adamaxw["head_lr"]),
        ("best-summed", 7e-4, adamaxw["head_lr"]),  # a family member through `from: best`
        ("best-adamw", adamw["lr"], adamw["head_lr"]),  # its family has no AdamW rates
        ("baseline", 2e-5, 3e-3),
        ("cosine-sts", 2e-5, 3e-3),  # the top-level family
        ("concatenation", adamw["lr"], adamw["head_lr"]),  # a family without rates
    ):
        settings = params.multitask_settings(committed, config)
        assert (settings.lr, settings.head_lr) == (lr, head_lr), config
    scale["rates"]["best"]["sgd"] = {"lr": 1e-3}
    with pytest.raises(ParamsError, match="unknown key 'scales.cpu.multitask.rates.best.sgd'"):
        validate(committed)


def test_the_rate_search_needs_three_seeds(committed):
    committed["lr_search"]["seeds"] = [101, 102]
    with pytest.raises(ParamsError, match="lr_search.seeds has 2"):
        validate(committed)


def test_numbers_in_scientific_notation_are_numbers(tmp_path):
    """`dvc exp run -S lr=3e-5` writes `3e-05`, a float in YAML 1.2 (PyYAML's 1.1 reads a string)."""
    from dvc.utils.serialize import modify_yaml

    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    with modify_yaml(tmp_path / "params.yaml") as data:  # what `dvc exp run -S` calls
        data["scales"]["cpu"]["multitask"]["optimizers"]["adamw"]["lr"] = 3e-5
    assert "lr: 3e-05" in (tmp_path / "params.yaml").read_text()
    loaded = params.load(tmp_path / "params.yaml")
    assert loaded["scales"]["cpu"]["multitask"]["optimizers"]["adamw"]["lr"] == 3e-05


def _leaves(node, path=()):
    """Every scalar of a parameters mapping with its key path."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif not isinstance(node, list):
        yield path, node


@pytest.mark.parametrize(
    "path, value",
    [
        (("optimizer",), "adamaxw"),
        (("configs", "best", "optimizer"), "adamw"),
        (("scales", "cpu", "multitask", "optimizers", "adamw", "lr"), 3e-5),
        (("scales", "gpu", "sentiment", "head_lr"), 1e-4),
        (("mlm", "starts", "scratch", "hidden_size"), 128),
    ],
)
def test_dvc_set_rewrites_one_line(tmp_path, path, value):
    """`dvc exp run -S key=value` writes params.yaml back through DVC's YAML writer:
    the committed style must come back unchanged but for the one line set (a style
    the writer reflows, such as a long inline `{...}` mapping or `null`, would leave a
    diff of many lines for a one-value ablation)."""
    from dvc.utils.serialize import modify_yaml

    text = (REPO / "params.yaml").read_text()
    copy_ = tmp_path / "params.yaml"
    copy_.write_text(text)
    with modify_yaml(copy_) as data:  # what `dvc exp run -S` calls
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    changed = [
        (old, new) for old, new in zip(text.splitlines(), copy_.read_text().splitlines()) if old != new
    ]
    assert len(text.splitlines()) == len(copy_.read_text().splitlines())
    assert len(changed) == 1 and path[-1] in changed[0][1], changed


def test_dvc_round_trip_keeps_every_line():
    from io import StringIO

    from dvc.utils.serialize._yaml import _dump, parse_yaml_for_update

    text = (REPO / "params.yaml").read_text()
    out = StringIO()
    _dump(parse_yaml_for_update(text, "params.yaml"), out)
    assert out.getvalue() == text
    # and every value survives (nothing rounded or retyped by the round trip)
    assert dict(_leaves(yaml.safe_load(out.getvalue()))) == dict(_leaves(yaml.safe_load(text)))


@pytest.mark.parametrize("name", ["best-run", "two words", "-lead", "x.y"])
def test_run_names_are_file_names_no_record_can_shadow(committed, name):
    bad = copy.deepcopy(committed)
    bad["configs"][name] = {}
    with pytest.raises(ParamsError, match=f"configs.{re.escape(name)}: a run's name"):
        validate(bad)


# ----------------------------------------------------------------------------- declared once

# Keys that no settings file carries: who reads them instead, and the text of that reader
# that shows it.
READ_ELSEWHERE = {
    "launcher": ("dvc.yaml", "${launcher} stages/multitask.py"),
    "repro_configs": ("dvc.yaml", "foreach: ${repro_configs}"),
    "mlm.pretrain": ("dvc.yaml", "foreach: ${mlm.pretrain}"),
    "mlm.finetune": ("dvc.yaml", "config: ${mlm.finetune}"),
    "seed_study.seeds": ("src/minbert/tools/sweep.py", 'study["seeds"]'),
    "seed_study.configs": ("src/minbert/tools/sweep.py", 'study["configs"]'),
    "seed_study.jobs": ("src/minbert/tools/sweep.py", 'study["jobs"]'),
    "lr_search": ("src/minbert/tools/lr_search.py", 'params["lr_search"]'),
    # A family's configurations are those the search trains (resolved here once the
    # family has rates of its own).
    "rate_family": ("src/minbert/tools/lr_search.py", 'values["rate_family"]'),
    "configs.concatenation.rate_family": ("src/minbert/tools/lr_search.py", 'values["rate_family"]'),
    "configs.best.rate_family": ("src/minbert/tools/lr_search.py", 'values["rate_family"]'),
    **{
        f"data.{key}": ("src/minbert/pipeline/prepare.py", f'data["{key}"]')
        for key in ("source", "quora_holdout_fraction", "split_seed", "skip_ids", "allow_unverified")
    },
    "data.verify_checksums": ("src/minbert/pipeline/prepare.py", 'data["verify_checksums"]'),
}
# The data stage's split of Quora, as the paper scale's Quora batch reads it.
MANIFEST = {"quora_split": {"kind": "carved-from-dev", "train_pairs": 16_170}}


def _values(node, path=()):
    """(dotted key, value) of every value of params.yaml: a mapping's keys walked into, a
    list taken whole."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _values(v, (*path, str(k)))
    else:
        yield ".".join(path), node


def _changed(key, value, configs):
    """Other values for ``key``; those the schema accepts are tried."""
    if key.endswith(".from"):
        return [c for c in configs if c != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, list):
        return [value[:-1], value[1:], [*value, value[0] + 1 if value and isinstance(value[0], int) else "x"]]
    if isinstance(value, str):
        from minbert.pipeline.schema import SCHEMA

        setting = SCHEMA
        for part in key.split("."):  # the setting the schema places at ``key``
            setting = setting.get(part, setting.get("*"))
        if isinstance(setting.allowed, tuple):  # a name of a registry: the others
            return [n for n in setting.allowed if n != value]
        return [value + "-changed"]
    if value is None:
        return [0.5]
    if isinstance(value, int):
        return [value + 1, value - 1, value * 2]
    return [value / 2, value * 1.5]


def test_no_value_of_params_yaml_goes_unread(committed):
    """Change each value of params.yaml, one at a time, to another the schema accepts: some
    stage's settings file changes (resolved at the value's own scale), or the value is one
    of the few that DVC or a command reads directly, and that reader names it."""
    unread, untried = [], []
    for key, value in _values(committed):
        within = [k for k in READ_ELSEWHERE if key == k or key.startswith(k + ".")]
        if within:
            reader, text = READ_ELSEWHERE[within[0]]
            assert text in (REPO / reader).read_text(), (key, reader)
            continue
        if key == "scale" or (key.startswith("configs.") and value == {}):
            continue  # the switch itself; a configuration of defaults only
        base = copy.deepcopy(committed)
        if key.startswith("scales."):
            base["scale"] = key.split(".")[1]
        before = params.resolve_all(validate(copy.deepcopy(base)), MANIFEST)
        accepted = read = False
        for other in _changed(key, value, committed["configs"]):
            changed = copy.deepcopy(base)
            *parents, last = key.split(".")
            node = changed
            for k in parents:
                node = node[k]
            node[last] = other
            if last == "lr_schedule":  # its factor goes with the exponential schedule
                if other.startswith("exponential"):
                    node.setdefault("lr_gamma", 0.9)
                else:
                    node.pop("lr_gamma", None)
            try:
                validate(changed)
            except ParamsError:
                continue
            accepted = True
            read = read or params.resolve_all(changed, MANIFEST) != before
        if not accepted:
            untried.append(key)
        elif not read:
            unread.append(key)
    assert not untried, f"no other value the schema accepts was found for {untried}"
    assert not unread, f"values that no stage reads: {unread}"


def test_no_configuration_repeats_what_it_inherits(committed):
    """A configuration's override differs from what it would have without it (the
    top-level default, or what its `from` configuration sets)."""
    from minbert.pipeline.schema import config_values

    for name, overrides in committed["configs"].items():
        inherited = config_values(committed, overrides.get("from")) if overrides else None
        for key, value in (overrides or {}).items():
            if key == "smart":
                assert all(inherited["smart"][k] != v for k, v in value.items()), name
            elif key != "from":
                assert inherited[key] != value, f"configs.{name}.{key} repeats {value!r}"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["best"].update({"from": "bestest"}), r"configs.best.from = 'bestest' is not one of"),
        (lambda c: c["concatenation"].update({"from": "best"}), r"'from' goes round in a circle"),
    ],
)
def test_a_configuration_changes_one_that_exists(committed, edit, message):
    edit(committed["configs"])
    with pytest.raises(ParamsError, match=message):
        validate(committed)


def test_every_value_is_checked_by_a_declared_setting():
    """The schema places parameters; what each accepts and means is declared on a
    ``Setting`` (settings.py), never written into the schema."""
    from minbert.pipeline.schema import SCHEMA, LeftOut, Partial
    from minbert.settings import Setting

    def leaves(node, path=""):
        if isinstance(node, (dict, Partial)):
            for k, v in node.items():
                yield from leaves(v, f"{path}.{k}" if path else k)
        else:
            yield path, node

    found = dict(leaves(SCHEMA))
    assert len(found) > 100
    assert not [k for k, v in found.items() if not isinstance(v, (Setting, LeftOut))]
    assert all(s.meaning for s in found.values() if isinstance(s, Setting))

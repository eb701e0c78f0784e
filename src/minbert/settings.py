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

from dataclasses import dataclass

from minbert.tasks import MULTITASK_TASKS, TASKS

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
#: paper's batches per epoch (``minbert.pipeline.params.quora_batch_size``).
CARVED_QUORA_BATCH: tuple[str, ...] = ("fixed", "paper-proportions")
#: MLM pretraining: further pretrain the checkpoint, or a fresh small BERT; the tasks
#: whose training text the corpus may take.
MLM_STARTS: tuple[str, ...] = ("continue", "scratch")
MLM_SOURCES: tuple[str, ...] = tuple(TASKS)


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class RunContext:
    """What every stage that runs a model starts from, as its resolved settings file says
    (``minbert.pipeline.params``): the run's name (a multitask configuration, a sentiment
    run, an MLM start; empty for a stage of one run), the checkpoint's name, the device
    asked for (a name of ``DEVICES``) and the scale."""

    name: str
    checkpoint: str
    device: str
    scale: str

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


@dataclass(frozen=True)
class HeadWarmup:
    """Heads fitted on the frozen checkpoint before fine-tuning (``minbert.train.head_warmup``)."""

    epochs: int = 0  # passes over the cached training vectors at most; 0: no warm-up
    lr: float = 1e-3
    tasks: tuple[str, ...] = MULTITASK_TASKS  # whose heads are fitted; the others start fresh
    batch_size: int = 64  # vectors per step


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
    # How the Quora batch was sized on a carved split (``batch_size`` holds the result).
    carved_quora_batch: str = "fixed"
    # Heads fitted on the frozen checkpoint before fine-tuning (``minbert.train.head_warmup``).
    head_warmup: HeadWarmup = HeadWarmup()

    @classmethod
    def from_dict(cls, values: dict) -> MultitaskSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        values = dict(values)
        smart = values.pop("smart")
        warmup = {k: tuple(v) if k == "tasks" else v for k, v in values.pop("head_warmup", {}).items()}
        warmup = HeadWarmup(**warmup)
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
    # Stop after this many epochs in a row no better on validation (0: every epoch runs).
    patience: int = 0
    pooling: str = "pooler"  # a name of POOLINGS
    head_lr: float | None = None  # full fine-tuning: the head's learning rate (None: ``lr``)

    @classmethod
    def from_dict(cls, values: dict) -> SentimentSettings:
        """The settings back from their ``asdict`` form (a resolved settings file)."""
        return cls(**values)


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

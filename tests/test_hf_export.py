"""A fine-tuned model directory in Hugging Face's libraries (`pip install -e ".[hf]"`, the
examples of docs/commands.md): mean pooling over its encoder in transformers, and a
sentence-transformers model loaded from it, give `minbert predict`'s STS scores of a
cosine head (configuration `cosine-sts`)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import saved_multitask_model
from typer.testing import CliRunner

from minbert.cli import app

PAIRS = [
    ("A man is playing a guitar.", "Someone plays an instrument."),
    ("A cat sleeps on the sofa.", "The stock market fell sharply today."),
    ("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
]


@pytest.fixture(scope="module")
def cosine_model(tmp_path_factory, tiny_checkpoint):
    """A multitask model directory whose STS head is 5 times the cosine of mean-pooled
    sentence vectors, as the stages write it."""
    heads = ("siamese-concat", "siamese-cosine", 0.0, "mean")
    return saved_multitask_model(
        tmp_path_factory.mktemp("model") / "cosine-sts", tiny_checkpoint, heads, 64, 2
    )


def _predicted(directory) -> torch.Tensor:
    args = ["predict", str(directory), "--task", "sts"]
    result = CliRunner().invoke(app, args + [x for pair in PAIRS for x in ("--pair", *pair)])
    assert result.exit_code == 0, result.output
    return torch.tensor([float(line.split()[0]) for line in result.stdout.splitlines()])


def test_mean_pooling_in_transformers_gives_the_sts_scores(cosine_model):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the hf extra)")
    tokenizer = transformers.AutoTokenizer.from_pretrained(cosine_model)
    encoder = transformers.AutoModel.from_pretrained(cosine_model).eval()

    def embed(sentences):
        batch = tokenizer(list(sentences), padding=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return (hidden * mask).sum(1) / mask.sum(1)

    first, second = zip(*PAIRS)
    expected = 5 * F.cosine_similarity(embed(first), embed(second))
    torch.testing.assert_close(_predicted(cosine_model), expected, atol=1e-3, rtol=0)


def test_sentence_transformers_gives_the_sts_scores(cosine_model):
    st = pytest.importorskip(
        "sentence_transformers", reason="sentence-transformers is not installed (pip install -e '.[hf]')"
    )
    # No modules.json in the directory: sentence-transformers builds the encoder with
    # mean pooling, the cosine head's pooling.
    model = st.SentenceTransformer(str(cosine_model), device="cpu")
    first, second = zip(*PAIRS)
    u, v = (model.encode(list(s), convert_to_tensor=True) for s in (first, second))
    expected = 5 * F.cosine_similarity(u, v)
    torch.testing.assert_close(_predicted(cosine_model), expected.cpu(), atol=1e-3, rtol=0)

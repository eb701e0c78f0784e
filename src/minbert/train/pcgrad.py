"""PCGrad: gradient surgery for multitask fine-tuning of a shared encoder.

Yu et al., 2020, "Gradient Surgery for Multi-Task Learning" (NeurIPS 2020,
arXiv:2001.06782). When several tasks share parameters, their gradients can point
in conflicting directions (negative dot product); summing them lets one task undo
another's progress, and a task with large gradients dominates. PCGrad removes the
conflict before summing: for each task ``i`` it starts from ``g_i`` and, visiting
the other tasks ``j`` in a random order, projects the running ``g_i'`` onto the
normal plane of ``g_j`` whenever the two conflict::

    if g_i' . g_j < 0:   g_i' <- g_i' - (g_i' . g_j) / ||g_j||^2 * g_j

The projection is against the *original* ``g_j`` (Algorithm 1 of the paper), and
the update direction is the sum of the projected ``g_i'``.

Only the shared parameters (the BERT encoder) go through the surgery. A task head
only receives gradient from its own task's loss, so there is nothing for it to
conflict with: heads keep their ordinary gradients.

Implementation note. Every projected ``g_i'`` is a linear combination of the
original gradients, and every quantity the algorithm tests or divides by is a dot
product between them. So the surgery runs on the k x k Gram matrix of the
original gradients (k = number of tasks, a handful), computed once; the per-task
vectors (tens of millions of entries for a BERT encoder) are touched only to build
that matrix and, once, to form the final weighted sum. The result is the same as
the step-by-step vector algorithm, with no per-task projected copies, and the
coefficients are handled in float64 whatever the gradients' dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = [
    "conflict_stats",
    "pcgrad_backward",
    "project_conflicting",
    "shared_task_gradients",
    "write_flat_gradient",
]


def _check_grads(grads: Sequence[torch.Tensor]) -> None:
    if isinstance(grads, torch.Tensor) or len(grads) == 0:
        raise ValueError("expected a non-empty list of per-task gradient tensors")
    first = grads[0]
    for t, g in enumerate(grads):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"gradient {t} is a {type(g).__name__}, not a torch.Tensor")
        if g.dim() != 1:
            raise ValueError(f"gradient {t} has shape {tuple(g.shape)}; expected a flat 1-D tensor")
        if not g.is_floating_point():
            raise ValueError(f"gradient {t} has dtype {g.dtype}; expected a floating-point dtype")
        if g.shape != first.shape or g.dtype != first.dtype or g.device != first.device:
            raise ValueError(
                f"gradient {t} is {tuple(g.shape)} {g.dtype} on {g.device}, but gradient 0 is "
                f"{tuple(first.shape)} {first.dtype} on {first.device}; all must match"
            )


@torch.no_grad()
def _gram(grads: Sequence[torch.Tensor]) -> list[list[float]]:
    """``G[i][j] = g_i . g_j`` as Python floats.

    Each entry is ``(g_i * g_j).sum()``, not ``torch.dot``: ``torch.dot`` hands the
    sum to BLAS, whose float32 accumulation drifts with the length (about 4e-5
    relative error on ``||g||^2`` for 2.2e7 entries, the size of MiniLM), while
    torch's own reductions sum pairwise and stay near float32's epsilon (about
    4e-8 on the same vector). That is accurate enough for the sign tests: a pair
    whose dot product is within rounding of zero is so nearly orthogonal that
    projecting it or not changes almost nothing. Float64 accumulation would cost
    several times more per step on a CPU for no visible gain.
    """
    # Half-precision products underflow and their sums overflow: work in float32.
    # Float32 and float64 gradients are used as they are (``to`` does not copy).
    acc = torch.promote_types(grads[0].dtype, torch.float32)
    vecs = [g.to(acc) for g in grads]
    k = len(vecs)
    pairs = [(i, j) for i in range(k) for j in range(i, k)]
    # One transfer to the host for all entries: the surgery itself is a few scalar
    # operations per pair, cheaper in Python than as k^2 tiny device kernels.
    values = torch.stack([(vecs[i] * vecs[j]).sum() for i, j in pairs]).cpu().tolist()
    gram = [[0.0] * k for _ in range(k)]
    for (i, j), value in zip(pairs, values):
        gram[i][j] = gram[j][i] = value
    return gram


@torch.no_grad()
def _gram_per_parameter(grads: Sequence[Sequence[torch.Tensor]]) -> list[list[float]]:
    """The Gram matrix of the task gradients given as ``grads[task][parameter]``.

    Summed parameter by parameter with ``torch.dot`` (one pass over memory, no
    temporaries) in float32, the partial sums added on the host in float64: the
    float32 accumulation error then grows with the size of one parameter, not of
    the whole encoder, and stays far below what could flip the sign of a
    meaningful conflict. One transfer to the host per step.
    """
    k = len(grads)
    pairs = [(i, j) for i in range(k) for j in range(i, k)]
    acc = torch.promote_types(grads[0][0].dtype, torch.float32)
    partial = []
    for n in range(len(grads[0])):
        vecs = [task[n].reshape(-1).to(acc) for task in grads]
        partial.append(torch.stack([torch.dot(vecs[i], vecs[j]) for i, j in pairs]))
    values = torch.stack(partial).double().sum(0).cpu().tolist()
    gram = [[0.0] * k for _ in range(k)]
    for (i, j), value in zip(pairs, values):
        gram[i][j] = gram[j][i] = value
    return gram


def _visit_orders(k: int, generator: torch.Generator | None) -> list[list[int]]:
    """For each task ``i`` (in task order), one ``torch.randperm(k)`` over all tasks.

    Task ``i`` appears in its own order and is skipped when visited. Drawing a full
    permutation per task, always, keeps the random stream's consumption fixed, so a
    seeded generator gives the same orders whatever the gradients are.
    """
    device = generator.device if generator is not None else torch.device("cpu")
    return [torch.randperm(k, generator=generator, device=device).tolist() for _ in range(k)]


def _surgery_weights(gram: list[list[float]], orders: list[list[int]]) -> list[float]:
    """Weights ``w`` with ``sum_i g_i' = sum_m w[m] * g_m``.

    Row ``i`` of ``coef`` holds g_i' in the basis of the original gradients, so
    ``g_i' . g_j = sum_m coef[i][m] * G[m][j]`` and projecting onto the original
    ``g_j`` only changes ``coef[i][j]``.
    """
    k = len(gram)
    coef = [[1.0 if m == i else 0.0 for m in range(k)] for i in range(k)]
    for i in range(k):
        for j in orders[i]:
            norm_sq = gram[j][j]
            # A zero g_j has no direction to project away from (and would divide by 0).
            if j == i or norm_sq <= 0.0:
                continue
            dot = sum(coef[i][m] * gram[m][j] for m in range(k))
            if dot < 0.0:
                coef[i][j] -= dot / norm_sq
    return [sum(coef[i][m] for i in range(k)) for m in range(k)]


@torch.no_grad()
def _combine(grads: Sequence[torch.Tensor], weights: list[float]) -> torch.Tensor:
    # Half-precision gradients are combined in float32: the weights can be well
    # above 1 (the projections rescale g_j by ||g_i|| / ||g_j||), and w * g could
    # overflow float16. Float32/float64 gradients are combined in their own dtype.
    dtype = grads[0].dtype
    acc = torch.promote_types(dtype, torch.float32)
    out = grads[0].to(acc) * weights[0]
    for g, w in zip(grads[1:], weights[1:]):
        # alpha=1.0 for unprojected tasks adds g exactly, so with no conflicts the
        # result is bit-for-bit the plain sum of the gradients.
        out.add_(g.to(acc), alpha=w)
    return out.to(dtype)


def project_conflicting(grads: list[torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
    """The PCGrad direction: the sum of the conflict-projected task gradients.

    ``grads`` are flat 1-D gradients of the shared parameters, one per task, of the
    same shape, dtype and device. For each task ``i`` the other tasks are visited in
    the order of one ``torch.randperm(len(grads), generator=generator)`` (drawn per
    task, in task order, self skipped); ``g_i'`` is projected onto the normal plane
    of each original ``g_j`` it conflicts with. Zero gradients are never projected
    onto. The inputs are not modified; the result has their dtype and device.
    """
    _check_grads(grads)
    orders = _visit_orders(len(grads), generator)
    return _combine(grads, _surgery_weights(_gram(grads), orders))


def _stats_from_gram(gram: list[list[float]]) -> tuple[torch.Tensor, int]:
    k = len(gram)
    cos = torch.eye(k, dtype=torch.float32)
    conflicts = 0
    for i in range(k):
        for j in range(i + 1, k):
            denom = (gram[i][i] * gram[j][j]) ** 0.5
            # The cosine with a zero gradient is undefined; 0 reads as "no conflict".
            value = gram[i][j] / denom if denom > 0.0 else 0.0
            cos[i, j] = cos[j, i] = value
            conflicts += gram[i][j] < 0.0
    return cos, conflicts


def conflict_stats(grads: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Pairwise cosine similarities of the task gradients and the number of conflicts.

    Returns a k x k float32 CPU tensor (diagonal 1; off-diagonal 0 where either
    gradient is zero) and the number of unordered pairs ``i < j`` whose gradients
    have a negative dot product. Meant for logging how often the tasks conflict.
    """
    _check_grads(grads)
    return _stats_from_gram(_gram(grads))


def _task_gradients(
    loss: torch.Tensor, params: Sequence[torch.nn.Parameter], retain_graph: bool
) -> list[torch.Tensor]:
    """``d loss / d p`` for each ``p``; zeros where the loss does not depend on ``p``."""
    if loss.requires_grad:
        grads = torch.autograd.grad(loss, params, retain_graph=retain_graph, allow_unused=True)
    else:
        # A loss with no graph at all (e.g. a task with an empty batch): autograd.grad
        # would raise, but its gradient is simply zero everywhere.
        grads = (None,) * len(params)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _check_losses_and_params(losses: Sequence[torch.Tensor], params: Sequence) -> None:
    if isinstance(losses, torch.Tensor) or len(losses) == 0:
        raise ValueError("expected a non-empty list of per-task losses")
    for t, loss in enumerate(losses):
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"loss {t} must be a scalar tensor")
    if len(params) == 0:
        raise ValueError("expected a non-empty list of shared parameters")


def shared_task_gradients(
    losses: list[torch.Tensor], shared_params: list[torch.nn.Parameter]
) -> list[torch.Tensor]:
    """One flat gradient of ``shared_params`` per task loss.

    One ``torch.autograd.grad`` call per task; the graph is retained for all but
    the last, so the tasks may share a forward pass. Parameters a task does not use
    contribute zeros. ``.grad`` attributes are not touched.
    """
    _check_losses_and_params(losses, shared_params)
    shared_params = list(shared_params)
    last = len(losses) - 1
    return [
        _flatten(_task_gradients(loss, shared_params, retain_graph=t < last)) for t, loss in enumerate(losses)
    ]


@torch.no_grad()
def write_flat_gradient(flat: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
    """Set each parameter's ``.grad`` to its slice of ``flat`` (overwriting, not adding).

    ``flat`` is laid out as ``torch.cat([p.reshape(-1) for p in params])``.
    """
    params = list(params)
    total = sum(p.numel() for p in params)
    if flat.dim() != 1 or flat.numel() != total:
        raise ValueError(
            f"flat gradient has shape {tuple(flat.shape)}; expected ({total},) for these parameters"
        )
    offset = 0
    for p in params:
        piece = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
        if p.grad is None:
            # A copy, so that .grad never aliases the caller's flat vector.
            p.grad = piece.to(device=p.device, dtype=p.dtype, copy=True)
        else:
            p.grad.copy_(piece)


def pcgrad_backward(
    losses: list[torch.Tensor],
    shared_params: list[torch.nn.Parameter],
    head_params_per_task: list[list[torch.nn.Parameter]] | None = None,
    generator: torch.Generator | None = None,
    reduce: Callable[[list[torch.Tensor]], None] | None = None,
) -> dict:
    """The PCGrad replacement for ``sum(losses).backward()`` in the training loop.

    Shared parameters get the projected combined gradient (``project_conflicting``
    of the per-task gradients). Head parameters get their plain gradient, the sum
    over tasks of ``d loss_t / d p`` (for a head used by one task, that task's own
    gradient). Both are written into ``.grad`` overwriting what was there, so
    gradients do not accumulate across calls. Returns the conflict statistics of
    the original shared gradients for logging:
    ``{"cosines": k x k tensor, "conflicts": int, "pairs": k * (k - 1) // 2}``.

    ``reduce``, when given, is called once per task on that task's gradients (shared
    parameters, then heads) before anything else uses them, and may change them in
    place: data-parallel training averages them over its processes there, so that
    the surgery sees each task's gradient of the whole batch.
    """
    _check_losses_and_params(losses, shared_params)
    shared_params = list(shared_params)
    # Every head parameter, once, in first-seen order. A parameter both shared and
    # a head would get two gradients, so it is refused.
    heads: list[torch.nn.Parameter] = []
    seen = {id(p) for p in shared_params}
    if len(seen) != len(shared_params):
        raise ValueError("a parameter appears more than once in shared_params")
    for task_heads in head_params_per_task or []:
        for p in task_heads:
            if id(p) in seen:
                if any(p is s for s in shared_params):
                    raise ValueError("a parameter is both shared and a task head parameter")
                continue
            seen.add(id(p))
            heads.append(p)

    # One backward per task over shared + heads: the head part of each task's
    # gradient comes for free, instead of a second pass over the graph.
    params = shared_params + heads
    n_shared = len(shared_params)
    last = len(losses) - 1
    shared_grads: list[list[torch.Tensor]] = []  # [task][parameter]
    head_grads: list[torch.Tensor] | None = None
    for t, loss in enumerate(losses):
        grads = _task_gradients(loss, params, retain_graph=t < last)
        if reduce is not None:
            reduce(grads)
        shared_grads.append(grads[:n_shared])
        if head_grads is None:
            head_grads = grads[n_shared:]
        else:
            head_grads = [acc + g for acc, g in zip(head_grads, grads[n_shared:])]

    # The surgery works parameter by parameter, never on one flat vector: flattening
    # k gradients of a BERT encoder (tens of millions of entries each) and copying the
    # result back into .grad cost more than the surgery itself.
    gram = _gram_per_parameter(shared_grads)
    orders = _visit_orders(len(losses), generator)
    weights = _surgery_weights(gram, orders)
    with torch.no_grad():
        for n, p in enumerate(shared_params):
            p.grad = _combine([task[n] for task in shared_grads], weights)
        for p, g in zip(heads, head_grads or []):
            p.grad = g.detach()

    cosines, conflicts = _stats_from_gram(gram)
    k = len(losses)
    return {"cosines": cosines, "conflicts": conflicts, "pairs": k * (k - 1) // 2}

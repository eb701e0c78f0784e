"""PCGrad (Yu et al., 2020): each task's gradient of the shared encoder is projected, in a
random order, onto the normal plane of every other task's original gradient it conflicts
with (negative dot product), and the projections are summed; heads keep their own task's
gradient. Every projection is a combination of the original gradients, so the surgery runs
on their Gram matrix on the device and ends in one matrix-vector product."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# The Gram matrix is summed over chunks of this many entries: each chunk's products
# accumulate in the gradients' float32, the chunks' sums in float64. A float32 dot
# product over all 2.3e7 entries of MiniLM drifts by about 1e-3 relative (BLAS
# accumulation); over chunks of 65,536 it stays near 2e-6.
GRAM_CHUNK = 65_536


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision products underflow and their sums overflow: work in float32.
    return torch.promote_types(dtype, torch.float32)


@torch.no_grad()
def _gram(rows: torch.Tensor) -> torch.Tensor:
    """``G[i, j] = g_i . g_j`` of the rows of ``rows`` (k, n), float64 on their device."""
    rows = rows.to(_accumulation_dtype(rows.dtype))
    k, n = rows.shape
    full = n - n % GRAM_CHUNK
    gram = torch.zeros(k, k, dtype=torch.float64, device=rows.device)
    if full:
        chunks = rows[:, :full].unflatten(1, (-1, GRAM_CHUNK)).transpose(0, 1)  # (chunks, k, m): a view
        gram += torch.bmm(chunks, chunks.transpose(1, 2)).double().sum(0)
    if full < n:
        rest = rows[:, full:]
        gram += (rest @ rest.T).double()
    # A matrix product may sum g_i . g_j and g_j . g_i in different orders.
    return (gram + gram.T) / 2


def visit_orders(k: int, generator: torch.Generator | None) -> torch.Tensor:
    """Row ``i``: task ``i``'s visit order (its own index a no-op), one ``torch.randperm(k)``
    per task, in task order: a fixed draw from ``generator``, on the host."""
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.stack([torch.randperm(k, generator=generator, device=device) for _ in range(k)])


@torch.no_grad()
def _surgery_weights(gram: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """Weights ``w`` with ``sum_i g_i' = sum_m w[m] g_m``: row ``i`` of ``coef`` is g_i' in the
    basis of the original gradients; a zero ``g_j`` is never projected onto."""
    # `orders` is only indexed with, never read by the host: a CUDA graph holds this.
    k = gram.shape[0]
    orders = orders.to(gram.device)
    coef = torch.eye(k, dtype=torch.float64, device=gram.device)
    # A task's visit to itself subtracts 0.0, as skipping it did.
    others = orders != torch.arange(k, device=gram.device)[:, None]
    zero = gram.new_zeros(())
    for i in range(k):
        # Column p: gram[:, orders[i, p]], strided as that column is (a contiguous copy's
        # dot product rounds differently in MKL), and its squared norm.
        visited = gram.index_select(1, orders[i])
        norm_sq = gram.diagonal().index_select(0, orders[i])
        for p in range(k):
            j = orders[i, p : p + 1]
            dot = coef[i] @ visited[:, p]
            conflict = (dot < 0) & (norm_sq[p] > 0) & others[i, p]
            step = dot / norm_sq[p].clamp_min(torch.finfo(torch.float64).tiny)
            coef[i].index_copy_(0, j, coef[i].index_select(0, j) - torch.where(conflict, step, zero))
    return coef.sum(0)


def gram_stats(gram: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The k x k cosines of the task gradients (0 where one is zero) and the number of pairs
    with a negative dot product, from their Gram matrix."""
    gram = gram.detach().to("cpu", torch.float64)
    norms = gram.diagonal().sqrt()
    denom = norms[:, None] * norms[None, :]
    # The cosine with a zero gradient is undefined; 0 reads as "no conflict".
    cos = torch.where(denom > 0, gram / denom.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    cos.fill_diagonal_(1.0)
    upper = torch.triu(torch.ones_like(gram, dtype=torch.bool), diagonal=1)
    return cos.float(), int((gram[upper] < 0).sum())


@torch.no_grad()
def _combine(weights: torch.Tensor, rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_m weights[m] * rows[m]``, in float32 at least (weights can exceed 1)."""
    acc = _accumulation_dtype(rows.dtype)
    combined = torch.mv(rows.to(acc).T, weights.to(acc))
    if out is None:
        return combined.to(rows.dtype)
    return out.copy_(combined)


class PCGrad:
    """The replacement for ``sum(losses).backward()``: one ``autograd.grad`` per task, each
    task's shared gradient a row of one matrix; writes the surgery's result into a flat
    buffer whose views are the shared ``.grad``, and each head's summed plain gradient.
    ``reduce`` (data-parallel: the mean over ranks) is applied to each row and once to
    the heads' gradients. Returns the Gram matrix of the original shared gradients.
    ``orders``: :func:`visit_orders` (None: drawn from ``generator``)."""

    def __init__(
        self,
        shared_params: Sequence[torch.nn.Parameter],
        head_params_per_task: Sequence[Sequence[torch.nn.Parameter]] | None = None,
        generator: torch.Generator | None = None,
        reduce: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> None:
        self.shared = list(shared_params)
        if len(self.shared) == 0:
            raise ValueError("expected a non-empty list of shared parameters")
        seen = {id(p) for p in self.shared}
        if len(seen) != len(self.shared):
            raise ValueError("a parameter appears more than once in shared_params")
        first = self.shared[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in self.shared):
            raise ValueError("the shared parameters must all have one dtype and one device")
        # Every head parameter, once, in first-seen order. A parameter both shared and
        # a head would get two gradients, so it is refused.
        self.heads: list[torch.nn.Parameter] = []
        shared_ids = set(seen)
        for task_heads in head_params_per_task or []:
            for p in task_heads:
                if id(p) in shared_ids:
                    raise ValueError("a parameter is both shared and a task head parameter")
                if id(p) not in seen:
                    seen.add(id(p))
                    self.heads.append(p)
        self.generator, self.reduce = generator, reduce
        self.numel = sum(p.numel() for p in self.shared)
        self.combined = torch.empty(self.numel, dtype=first.dtype, device=first.device)
        self.grad_views = self._views(self.combined)
        self.rows: torch.Tensor | None = None

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for p in self.shared:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def visit_orders(self, k: int) -> torch.Tensor:
        """The next step's (k, k) visit orders from ``generator``, on the gradients' device."""
        return visit_orders(k, self.generator).to(self.combined.device)

    def __call__(self, losses: Sequence[torch.Tensor], orders: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(losses, torch.Tensor) or len(losses) == 0:
            raise ValueError("expected a non-empty list of per-task losses")
        for t, loss in enumerate(losses):
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError(f"loss {t} must be a scalar tensor")
        k = len(losses)
        if self.rows is None or self.rows.shape[0] != k:
            self.rows = self.combined.new_empty(k, self.numel)
        params = self.shared + self.heads
        n_shared = len(self.shared)
        head_grads: list[torch.Tensor | None] = [None] * len(self.heads)
        for t, loss in enumerate(losses):
            grads: Sequence[torch.Tensor | None] = (None,) * len(params)
            if loss.requires_grad:
                grads = torch.autograd.grad(loss, params, retain_graph=t < k - 1, allow_unused=True)
            # Where the loss does not reach a parameter (or has no graph at all, e.g. a
            # task with an empty batch), its gradient is zero.
            shared = [p.new_zeros(p.shape) if g is None else g for p, g in zip(self.shared, grads)]
            torch.cat([g.reshape(-1) for g in shared], out=self.rows[t])
            if self.reduce is not None:
                self.reduce([self.rows[t]])
            for h, g in enumerate(grads[n_shared:]):
                if g is not None:
                    head_grads[h] = g if head_grads[h] is None else head_grads[h] + g
        gram = _gram(self.rows)
        weights = _surgery_weights(gram, self.visit_orders(k) if orders is None else orders)
        _combine(weights, self.rows, out=self.combined)
        # A head no task reached gets a zero gradient, like the shared parameters.
        heads = [p.new_zeros(p.shape) if g is None else g for p, g in zip(self.heads, head_grads)]
        if self.reduce is not None and heads:
            self.reduce(heads)
        with torch.no_grad():
            for p, view in zip(self.shared, self.grad_views):
                p.grad = view
            for p, g in zip(self.heads, heads):
                p.grad = g.detach()
        return gram

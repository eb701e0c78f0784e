"""Training: optimizers and schedules (``optim``), the single-task loop (``sentiment``)."""

"""Public path for PCGrad; the implementation lives in ``minbert.train.pcgrad``."""

from minbert.train.pcgrad import conflict_stats, project_conflicting

__all__ = ["conflict_stats", "project_conflicting"]

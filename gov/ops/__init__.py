"""Operating gov: ``health`` (`gov check`), ``maintenance`` (`gov prune`, conservation)
and ``metrics`` (Prometheus)."""

"""Operating gov: ``health`` (`gov check`), ``maintenance`` (`gov prune`, conservation),
``metrics`` (Prometheus) and ``signals`` (a loop stopped by SIGTERM)."""

"""What a set of finished runs says beyond each run's own report: which logged signals predict the exact J
(``warning``: ``python -m llm.analysis.warning``)."""

"""What finished runs say, read from their run directories: each run's summary and figures (``report``), the LLM
ablation's grid of runs and its tables (``ablation``), and which logged signals predict the exact J (``warning``:
``python -m llm.analysis.warning``)."""

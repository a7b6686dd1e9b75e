"""Command-line tools: ``python -m iris_timm.tools.benchmark`` (speed and memory of timm models) and
``python -m iris_timm.tools.summary`` (parameters and MACs)."""

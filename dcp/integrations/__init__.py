"""Integrations of DCP with model libraries: ``dcp.integrations.hf`` (Hugging Face transformers).

Imported on demand (``from dcp.integrations import hf``) so that ``import dcp`` never imports transformers.
"""

"""Data values shared by the models and the runtime: the ``Batch`` of one micro-batch and its collation.

The lowest torch-using layer besides ``dcp.distributed``: it imports no other dcp package.
"""

from __future__ import annotations

from dcp.data.batch import IGNORE_INDEX, Batch, collate_tokens, collate_video

__all__ = ["IGNORE_INDEX", "Batch", "collate_tokens", "collate_video"]

"""Cluster simulator: runs the real planner over a simulated cluster (H100/H200 specs or a measured table).

Kept light: importing ``dcp.sim`` does not import torch.
"""

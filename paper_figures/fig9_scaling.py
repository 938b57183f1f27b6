"""Paper Figure 9: weak scaling, 8 to 4096 GPUs, with the runtime's control plane charged.

    python paper_figures/fig9_scaling.py [--out DIR | --update-committed] [--quick]

Writes fig9_scaling.png and fig9_scaling.csv (default folder runs/figures; paper_figures/out with --update-committed); the work is in dcp.figures.fig9_scaling.
"""

import sys

from dcp.figures import main_for

if __name__ == "__main__":
    sys.exit(main_for("fig9"))

"""Paper Figure 8: throughput and imbalance, 2 models x 3 datasets x 4 methods, 32 GPUs.

    python paper_figures/fig8_throughput.py [--out DIR | --update-committed] [--quick]

Writes fig8_throughput.png and fig8_throughput.csv (default folder runs/figures; paper_figures/out with --update-committed); the work is in dcp.figures.fig8_throughput.
"""

import sys

from dcp.figures import main_for

if __name__ == "__main__":
    sys.exit(main_for("fig8"))

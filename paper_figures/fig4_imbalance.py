"""Paper Figure 4: imbalance ratio of bucket parallel across 140 datasets.

    python paper_figures/fig4_imbalance.py [--out DIR | --update-committed] [--quick]

Writes fig4_imbalance.png and fig4_imbalance.csv (default folder runs/figures; paper_figures/out with --update-committed); the work is in dcp.figures.fig4_imbalance.
"""

import sys

from dcp.figures import main_for

if __name__ == "__main__":
    sys.exit(main_for("fig4"))

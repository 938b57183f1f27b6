"""Paper Figure 10: DCP-intra speedup over DCP-inter by sequence length.

    python paper_figures/fig10_intra_speedup.py [--out DIR | --update-committed] [--quick]

Writes fig10_intra_speedup.png and fig10_intra_speedup.csv (default folder runs/figures; paper_figures/out with --update-committed); the work is in dcp.figures.fig10_intra_speedup.
"""

import sys

from dcp.figures import main_for

if __name__ == "__main__":
    sys.exit(main_for("fig10"))

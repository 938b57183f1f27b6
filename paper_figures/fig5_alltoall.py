"""Paper Figure 5: Ulysses all-to-all overhead vs SP size and sequence length.

    python paper_figures/fig5_alltoall.py [--out DIR | --update-committed] [--quick]

Writes fig5_alltoall.png and fig5_alltoall.csv (default folder runs/figures; paper_figures/out with --update-committed); the work is in dcp.figures.fig5_alltoall.
"""

import sys

from dcp.figures import main_for

if __name__ == "__main__":
    sys.exit(main_for("fig5"))
